#!/bin/bash
# Runs on the lent GPU machine, from the repository root, with .gpu/ carried (tools/gpu_bundle.sh
# makes it): the CUDA op and memory-manager tests against their references, then the PyTorch
# SDPA peer and bench/gpu/gpu_bench in the same run. Logs and JSON go to $OUT (the device tool's
# output folder) or bench/results.
#   bench/gpu/run.sh            # everything (the full grid: a few minutes)
#   bench/gpu/run.sh --quick    # tests, then sluice/fp16/kvcomp at batch 8, 32 and 8k, 16k
set -uo pipefail
cd "$(dirname "$0")/../.."
sdpa_flags=()
bench_flags=()
if [[ "${1:-}" == "--quick" ]]; then
  grid=(--batches=8,32 --contexts=8192,16384 --shapes=llama3-8b)
  sdpa_flags=("${grid[@]}")
  bench_flags=("${grid[@]}" --presets=sluice,fp16,kvcomp --memory=false)
fi
out="${OUT:-bench/results}"
mkdir -p "$out"
bundle=/tmp/sluice-gpu
rm -rf $bundle && mkdir -p $bundle && tar -xJf .gpu/bundle.tar.xz -C $bundle || exit 2
# The bundle's libraries, then the machine's cuBLAS (the CUDA toolkit's, or PyTorch's wheel).
cublas_dir="$(dirname "$(find /usr/local/cuda*/lib64 / -name 'libcublas.so.13' -not -path '/proc/*' \
  2>/dev/null | head -1)")"
export LD_LIBRARY_PATH="$bundle/lib:${cublas_dir}:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
  | tee "$out/device.txt"
status=0
for t in backend_ops_test decode_attention_test gpu_page_allocator_test gpu_compaction_test; do
  echo "== $t"
  if ! $bundle/bin/$t --gtest_brief=1 >"$out/$t.log" 2>&1; then status=1; fi
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure' "$out/$t.log" | head -40
  tail -3 "$out/$t.log"
done
echo "== sdpa peer"
PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_peer.py --out "$out/sdpa.json" "${sdpa_flags[@]}" >"$out/sdpa.log" 2>&1 \
  || { status=1; tail -20 "$out/sdpa.log"; }
echo "== gpu_bench"
$bundle/bin/gpu_bench --sdpa_json "$out/sdpa.json" --out_dir "$out" "${bench_flags[@]}" >"$out/gpu_bench.log" 2>&1 \
  || status=1
# The end of the output is what the device tool returns: the summary lines last.
grep -E 'device:|huffman|gpu_bench:|error|wrote' "$out/gpu_bench.log" | head -40
grep -E '^ *(llama3-8b|smollm2) +sluice ' "$out/gpu_bench.log" | head -60
grep -A8 'gpu_alloc_us' "$out/gpu_bench.log"
exit $status
