#!/bin/bash
# profile.sh NAME [model_bench flags...]: model_bench from the GPU bundle under gperftools'
# sampling profiler, wall-clock samples at 1 kHz (CPUPROFILE_REALTIME=1: a thread waiting on
# the driver counts), on the GPU machine. The profiler's libraries travel in .gpu/prof (Debian's
# libgoogle-perftools4 and libunwind8; the bundle's binaries are stripped):
#
#   tools/gpu_bundle.sh && mkdir -p .gpu/prof &&
#     cp -L /usr/lib/x86_64-linux-gnu/{libprofiler.so.0,libunwind.so.8} .gpu/prof/
#   bench/gpu/profile.sh b1 --backend=cuda --random_model=smollm2 --batches=1   # there
#   tar xzf b1.tgz && bench/gpu/profile_report.py b1.prof .bazel/bin/bench/model_bench Forward
#
# The report (here) symbolizes from the unstripped binary of the same build (the build id
# matches). Filter on Forward rather than RunStep: stacks through cuBLAS often lose the frames
# above it, so the samples under a deep call may miss RunStep.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1
shift
out="${OUT:-/tmp/sluice-profile}"
mkdir -p "$out"
bundle=/tmp/sluice-gpu
if [[ ! -x $bundle/bin/model_bench ]]; then
  rm -rf $bundle && mkdir -p $bundle && tar -xJf .gpu/bundle.tar.xz -C $bundle
fi
cublas_dir="$(dirname "$(find /usr/local/cuda*/lib64 / -name 'libcublas.so.13' -not -path '/proc/*' \
  2>/dev/null | head -1)")"
export LD_LIBRARY_PATH="$bundle/lib:${cublas_dir}:$PWD/.gpu/prof:${LD_LIBRARY_PATH:-}"
LD_PRELOAD="$PWD/.gpu/prof/libprofiler.so.0" CPUPROFILE="$out/$name.prof" CPUPROFILE_REALTIME=1 \
  CPUPROFILE_FREQUENCY=1000 "$bundle/bin/model_bench" "$@" >"$out/$name.json" 2>"$out/$name.log"
tail -5 "$out/$name.log"
# The device tool brings back only a few files from $OUT: one archive per profile.
(cd "$out" && tar czf "$name.tgz" "$name.prof" "$name.json" "$name.log" &&
  rm "$name.prof" "$name.json" "$name.log")
