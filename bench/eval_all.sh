#!/usr/bin/env bash
# Every compressed preset against fp16 on the three evaluation texts (bench/eval_texts.sh) at
# 1k and 4k context, then the table, bench/results/eval-texts-cpu.json and the plot
# bench/results/eval-frontier.png (bench/eval_report.py).
#
#   bench/eval_all.sh [WINDOWS_1K] [WINDOWS_4K]     (defaults 4 and 1)
#
# Windows are spread over each text (stride: its tokens / windows). On a 2-core CPU the whole
# run takes about an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
w1k="${1:-4}"
w4k="${2:-1}"
texts=bench/texts
runs=bench/results/eval-runs
bench/eval_texts.sh "$texts" >/dev/null
mkdir -p "$runs"
tokens() {  # tokens of a text, from a run that evaluates nothing but counts them
  ./sluice eval --text "$1" --preset int8 --context 4 --max_windows 1 2>/dev/null |
    sed -n 's/^[^:]*: \([0-9]*\) tokens.*/\1/p'
}
for text in vim-manual.txt node-streams.md licenses.txt; do
  n=$(tokens "$texts/$text")
  for spec in "1024 $w1k" "4096 $w4k"; do
    read -r context windows <<<"$spec"
    stride=$(((n - context) / (windows > 1 ? windows - 1 : 1)))
    ((stride >= context)) || stride=$context
    out="$runs/${text%.*}-$context.jsonl"
    echo "eval_all: $text ($n tokens), context $context, $windows window(s), stride $stride" >&2
    ./sluice eval --text "$texts/$text" --context "$context" --max_windows "$windows" \
      --stride "$stride" --json >"$out"
  done
done
device="$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) threads (no GPU)"
bench/eval_report.py bench/results/eval-texts-cpu.json bench/results/eval-frontier.png \
  "$runs"/*.jsonl --device "$device" --command "bench/eval_all.sh $w1k $w4k"
