#!/bin/bash
# Builds the GPU test and benchmark binaries here and packs them, with the shared libraries they
# need that the GPU machine may lack, into .gpu/bundle.tar.xz (git-ignored; about 15 MB, well
# inside the 64 MiB the device tool carries). bench/gpu/accept.sh unpacks and runs them there:
#
#   tools/gpu_bundle.sh            # then, with the device tool:
#   run(command="bench/gpu/accept.sh correctness", carry=[".gpu"]), then ... speed
#
# cuBLAS is not bundled (its libraries are hundreds of MiB): accept.sh finds the GPU machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries: GPU_BUNDLE_BINARIES in tools/BUILD (what //tools:gpu_bundle_test stages).
mapfile -t targets < <(bazel query --noshow_progress \
  'kind("cc_binary|cc_test", labels(data, //tools:gpu_bundle_test))' | sort)
(( ${#targets[@]} > 0 )) || { echo "no binaries in //tools:gpu_bundle_test" >&2; exit 1; }
bazel build --jobs="${SLUICE_JOBS:-2}" "${targets[@]}"
rm -rf .gpu
stage=.gpu/stage
paths=()
for t in "${targets[@]}"; do paths+=(".bazel/bin/$(echo "${t#//}" | tr ':' '/')"); done
tools/gpu_stage.sh "$stage" "${paths[@]}"
cat "$stage/MANIFEST"
tar -C $stage -cf - bin lib MANIFEST | xz -T"${SLUICE_JOBS:-2}" -6 >.gpu/bundle.tar.xz
rm -rf $stage
ls -l .gpu/bundle.tar.xz
echo "bundle ready: carry .gpu and run bench/gpu/accept.sh correctness, then speed, on the GPU machine"
