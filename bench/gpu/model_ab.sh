#!/bin/bash
# model_ab.sh OLD NEW ROUNDS OUT_DIR [model_bench flags...]: an A/B of two model_bench builds on
# the GPU machine, run in turn (old, new, old, new, ...) so that clock and thermal drift fall on
# both; then a table of each case's median prefill and decode rate per build and the change. The
# old build travels next to the bundle, as for ab.sh:
#   cp .bazel/bin/bench/model_bench /tmp/old   # before the change, then after it:
#   tools/gpu_bundle.sh && mkdir -p .gpu/old && cp /tmp/old .gpu/old/model_bench
#   bench/gpu/model_ab.sh .gpu/old/model_bench /tmp/sluice-gpu/bin/model_bench 2 $OUT/ab \
#     --backend=cuda --random_model=smollm2 --batches=1,16,64
set -euo pipefail
old=$1 new=$2 rounds=$3 out=$4
shift 4
mkdir -p "$out"
for ((i = 0; i < rounds; ++i)); do
  for side in old new; do
    bin=$old
    [[ $side == new ]] && bin=$new
    "$bin" "$@" >"$out/$side-$i.json" 2>"$out/$side-$i.log"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rates = {}
backend = None
for side in ("old", "new"):
    for i in range(rounds):
        d = json.load(open(os.path.join(out, f"{side}-{i}.json")))
        backend = d.get("backend", backend)
        for c in d["cases"]:
            for what in ("prefill_tokens_per_s", "decode_tokens_per_s"):
                rates.setdefault((c["batch"], c["prompt"], what), {}).setdefault(side, []).append(c[what])
rows = []
print(backend)
print(f"{'batch':>5} {'prompt':>6} {'rate':8} {'old tok/s':>10} {'new tok/s':>10} {'change':>7}")
for key in sorted(rates):
    r = rates[key]
    o, n = statistics.median(r["old"]), statistics.median(r["new"])
    rows.append(dict(batch=key[0], prompt=key[1], rate=key[2], old=o, new=n, old_runs=r["old"],
                     new_runs=r["new"]))
    print(f"{key[0]:5} {key[1]:6} {key[2].split('_')[0]:8} {o:10.1f} {n:10.1f} {n / o - 1:+7.1%}")
json.dump({"backend": backend, "rounds": rounds, "rows": rows},
          open(os.path.join(out, "ab.json"), "w"), indent=1)
PY
