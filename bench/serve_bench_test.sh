#!/bin/bash
# The GPU acceptance's serving check (bench/gpu/accept.sh serve) on this machine's CPU: a model of
# the bundled model's shapes and tokenizer with random weights, made from its description
# (tools/random_gguf), served by tools/up's cluster from a directory laid out as on the GPU
# machine, under streamed requests from bench/serve_bench.py; every request must succeed and the
# workers must name their backend.
#   serve_bench_test.sh RANDOM_GGUF UP ROUTER PREFILL DECODE SERVE_BENCH_PY
set -euo pipefail
random_gguf=$1 up=$2 router=$3 prefill=$4 decode=$5 serve_bench=$6
model="${SLUICE_MODEL:-$HOME/.cache/sluice/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$model" ]]; then
  echo "SKIP: no model at $model"
  exit 0
fi
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
"$random_gguf" --like="$model" --describe --out="$tmp/desc.gguf"
"$random_gguf" --like="$tmp/desc.gguf" --out="$tmp/random.gguf"
for b in router prefill decode; do
  mkdir -p "$tmp/cluster/$b"
  ln -sf "$(realpath "${!b}")" "$tmp/cluster/$b/$b"
done
python3 "$serve_bench" --up "$up" --bin_dir "$tmp/cluster" --model "$tmp/random.gguf" \
  --systems=sluice --backend=cpu --threads=1 --loads=streams --streams=4 --stream-prompt=64 \
  --max-tokens=8 --fail-on-errors --out "$tmp/serve.json"
python3 - "$tmp/serve.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]["sluice"]["streams"]
assert r["requests"] == 4 and r["errors"] == 0, r
assert d["sluice_workers"] and all(b.startswith("cpu (") for b in d["sluice_workers"].values()), d
print("ok:", r["requests"], "requests,", round(r["tokens_per_s"], 1), "tok/s on", d["sluice_workers"])
PY
# The chat workload, prefix cache on and off: every turn answers; with the cache on, later turns
# fork cached prefixes (the workers' count and the responses' usage agree), with it off none.
python3 "$serve_bench" --up "$up" --bin_dir "$tmp/cluster" --model "$tmp/random.gguf" \
  --workload=chat --systems=sluice,sluice-nocache --backend=cpu --threads=1 --conversations=2 \
  --turns=3 --system-tokens=160 --answer-tokens=4 --chunk-tokens=64 --fail-on-errors \
  --out "$tmp/chat.json"
python3 - "$tmp/chat.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
on, off = d["results"]["sluice"]["chat"], d["results"]["sluice-nocache"]["chat"]
for r in (on, off):
    assert r["requests"] == 6 and r["errors"] == 0 and r["turns"] == 6, r
assert on["cached_tokens"] > 0 and on["cached_tokens"] % 64 == 0, on
assert on["prefix_hit_tokens"] == on["cached_tokens"], on
assert off["cached_tokens"] == 0 and off["prefix_hit_tokens"] == 0, off
assert on["prefill_tokens"] + on["cached_tokens"] == off["prefill_tokens"], (on, off)
assert d["sluice_answers_equal_with_and_without_cache"], (on, off)
print("ok: chat,", on["cached_tokens"], "of", off["prefill_tokens"], "prompt tokens cached")
PY
