#!/bin/bash
# Builds the GPU test and benchmark binaries here and packs them, with the shared libraries they
# need that the GPU machine may lack, into .gpu/bundle.tar.xz (git-ignored; about 15 MB, well
# inside the 64 MiB the device tool carries). bench/gpu/run.sh unpacks and runs them there:
#
#   tools/gpu_bundle.sh            # then, with the device tool:
#   run(command="bench/gpu/run.sh", carry=[".gpu"])
#
# cuBLAS is not bundled (its libraries are hundreds of MiB): run.sh finds the GPU machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(//kernels:backend_ops_test //kernels/cuda:decode_attention_test
  //kvstore/cuda:gpu_page_allocator_test
  //kvstore/cuda:gpu_compaction_test //bench/gpu:gpu_bench)
bazel build --jobs="${SLUICE_JOBS:-2}" "${targets[@]}"
rm -rf .gpu
stage=.gpu/stage
mkdir -p $stage/bin $stage/lib
for t in "${targets[@]}"; do
  path=".bazel/bin/$(echo "${t#//}" | tr ':' '/')"
  cp "$path" $stage/bin/
  chmod u+w "$stage/bin/$(basename "$path")"
  strip "$stage/bin/$(basename "$path")"
done
# Every shared library but the C runtime, the driver and cuBLAS.
for b in $stage/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*) ;;
    *) cp -L "$lib" $stage/lib/ ;;
  esac
done
tar -C $stage -cf - bin lib | xz -T"${SLUICE_JOBS:-2}" -6 >.gpu/bundle.tar.xz
rm -rf $stage
ls -l .gpu/bundle.tar.xz
echo "bundle ready: carry .gpu and run bench/gpu/run.sh on the GPU machine"
