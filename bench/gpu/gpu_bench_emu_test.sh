#!/bin/bash
# gpu_bench's host code, checked in CI: the benchmark runs on the emulated CUDA device on a tiny
# grid (every preset, one batch and context, one repetition; the memory benchmark at 2 sequences
# of 2 layers) and must write a row per preset and the memory rows. Timings there mean nothing; a failure here would be a failure of
# the first GPU run.
#   gpu_bench_emu_test.sh GPU_BENCH_EMU
set -euo pipefail
bench=$1
out="${TEST_TMPDIR:-$(mktemp -d)}/out"
mkdir -p "$out"
"$bench" --out_dir "$out" --batches=2 --contexts=1024 --shapes=smollm2 --reps=1 \
  --pool_pages=32 --roofline_mib=1 --memory=true --memory_batches=2 --memory_layers=2
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
attention = json.load(open(os.path.join(out, "gpu-attention.json")))
presets = sorted({r["preset"] for r in attention["rows"] if "time_us" in r})
print("rows:", len(attention["rows"]), "presets:", " ".join(presets))
if len(presets) < 13:
    sys.exit("FAIL: expected a timed row for each of the 13 presets")
codec = json.load(open(os.path.join(out, "gpu-codec-memory.json")))
if not codec["huffman"]:
    sys.exit("FAIL: no Huffman codec rows")
if not codec["memory"] or codec["memory"][0].get("gpu_alloc_us") is None:
    sys.exit("FAIL: no allocation and compaction rows")
print("ok")
PY
