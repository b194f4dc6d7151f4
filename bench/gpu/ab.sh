#!/bin/bash
# ab.sh OLD NEW ROUNDS OUT_DIR [gpu_bench flags...]: an A/B of two gpu_bench builds on the GPU
# machine, run in turn (old, new, old, new, ...) so that clock and thermal drift fall on both;
# then a table of each configuration's median time per build and the change. The old build
# travels next to the bundle (tools/gpu_bundle.sh packs the new one), for example
#   cp .bazel/bin/bench/gpu/gpu_bench /tmp/old   # before the change, then after it:
#   tools/gpu_bundle.sh && mkdir -p .gpu/old && cp /tmp/old .gpu/old/gpu_bench
#   bench/gpu/ab.sh .gpu/old/gpu_bench /tmp/sluice-gpu/bin/gpu_bench 2 $OUT/ab --presets=sluice
set -euo pipefail
old=$1 new=$2 rounds=$3 out=$4
shift 4
for ((i = 0; i < rounds; ++i)); do
  for side in old new; do
    bin=$old
    [[ $side == new ]] && bin=$new
    mkdir -p "$out/$side-$i"
    "$bin" --memory=false --out_dir "$out/$side-$i" "$@" >"$out/$side-$i/log" 2>&1
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
times = {}
for side in ("old", "new"):
    for i in range(rounds):
        for r in json.load(open(os.path.join(out, f"{side}-{i}", "gpu-attention.json")))["rows"]:
            if "time_us" not in r:
                continue
            key = (r["shape"], r["preset"], r["batch"], r["context"])
            times.setdefault(key, {}).setdefault(side, []).append(r["time_us"])
            times[key].setdefault(side + "_chunks", r.get("chunks"))
rows = []
print(f"{'shape':10} {'preset':8} {'batch':>5} {'ctx':>6} {'old_us':>9} {'new_us':>9} {'change':>7} chunks")
for key in sorted(times):
    t = times[key]
    if "old" not in t or "new" not in t:
        continue
    o, n = statistics.median(t["old"]), statistics.median(t["new"])
    rows.append(dict(zip(("shape", "preset", "batch", "context"), key), old_us=o, new_us=n,
                     old_runs=t["old"], new_runs=t["new"], old_chunks=t.get("old_chunks"),
                     new_chunks=t.get("new_chunks")))
    print(f"{key[0]:10} {key[1]:8} {key[2]:5} {key[3]:6} {o:9.1f} {n:9.1f} {n / o - 1:+7.1%} "
          f"{t.get('old_chunks')}->{t.get('new_chunks')}")
json.dump({"rounds": rounds, "rows": rows}, open(os.path.join(out, "ab.json"), "w"), indent=1)
PY
