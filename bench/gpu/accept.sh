#!/bin/bash
# The one-shot GPU acceptance: the whole check of the CUDA wing on a lent GPU machine in two runs
# of under 10 minutes each, from the repository root with .gpu/ carried (tools/gpu_bundle.sh):
#
#   bench/gpu/accept.sh correctness [--sync]   # run 1
#   bench/gpu/accept.sh speed [--sync]         # run 2
#   bench/gpu/accept.sh serve                  # run 3
#
# correctness: every CUDA test (the op tests' cuda cases, decode attention, the page allocator,
#   compaction, the paged KV cache and the model on the CUDA backend); then compute-sanitizer memcheck on all
#   of them, racecheck and synccheck on the small shapes (racecheck.sh: any hazard in a sluice
#   kernel fails, warnings too; cuBLAS's own are counted, not failed).
# speed: the PyTorch SDPA peer, then gpu_bench one preset per process (a sticky fault in one
#   preset cannot poison the others' rows), merged into gpu-attention.json; the model's prefill
#   and decode on the GPU and on the CPU (model_bench, model-cuda.json, model-cpu.json; on the GPU
#   once more with CUDA graphs off, model-cuda-unrecorded.json); allocation and
#   compaction with the sluice preset; ncu on the sluice and fp16 chunk kernels at batch 32 x 16k;
#   the resource table of every kernel as built (cuobjdump -res-usage).
# serve: the whole cluster (tools/up: router, a prefill and a decode worker) with --backend=cuda,
#   serving a model of SmolLM2-135M's shapes and tokenizer with random weights (tools/random_gguf
#   from .gpu/model-desc.gguf: the real file is more than a call carries) under 16 streamed
#   requests (bench/serve_bench.py, serve-cuda.json); then the same cluster on the machine's CPU
#   (serve-cpu.json). SLUICE_SERVE_BACKENDS picks the backends ("cuda cpu"; "cpu" checks the
#   mode on a machine without a GPU).
# --sync sets CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel, so a fault is reported
#   by the launch that caused it (each Launch* function returns cudaGetLastError()), naming it.
#
# Every step appends a record to $OUT/summary.json as it goes (name, ok, seconds, log), so a run
# cut short still says how far it got; a run that ends packs $OUT into accept-<mode>.tgz. A run stops starting steps when its budget is spent
# (SLUICE_ACCEPT_BUDGET_S, default 540 s: the device tool allows 600 s a call); steps run in order
# of importance and the ones left are recorded as not run. Logs and results go to $OUT (the device
# tool's output folder) or bench/results/gpu-accept.
set -uo pipefail
deadline=$(($(date +%s) + ${SLUICE_ACCEPT_BUDGET_S:-540}))
cd "$(dirname "$0")/../.."
mode=${1:-}
shift || true
if [[ "${1:-}" == "--sync" ]]; then export CUDA_LAUNCH_BLOCKING=1; fi
out="${OUT:-bench/results/gpu-accept}"
mkdir -p "$out"
summary="$out/summary.json"
[[ -f "$summary" ]] || echo '{"steps": []}' >"$summary"

bundle=/tmp/sluice-gpu
if [[ ! -x $bundle/bin/backend_ops_test ]]; then
  rm -rf $bundle && mkdir -p $bundle && tar -xJf .gpu/bundle.tar.xz -C $bundle || exit 2
fi
cublas_dir="$(dirname "$(find /usr/local/cuda*/lib64 / -name 'libcublas.so.13' -not -path '/proc/*' \
  2>/dev/null | head -1)")"
export LD_LIBRARY_PATH="$bundle/lib:${cublas_dir}:${LD_LIBRARY_PATH:-}"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit (cut to what is left of the
# budget), logs it, records the outcome; exit status 124 is a timeout, 125 not run for lack of time.
step() {
  local name=$1 limit=$2
  shift 2
  local log="$out/$name.log" start end rc left
  left=$((deadline - $(date +%s)))
  ((limit > left)) && limit=$left
  start=$(date +%s.%N)
  if ((limit < 5)); then
    echo "not run: the run's time budget is spent" >"$log"
    rc=125
  else
    timeout "$limit" "$@" >"$log" 2>&1
    rc=$?
  fi
  end=$(date +%s.%N)
  python3 - "$summary" "$name" "$rc" "$start" "$end" "$log" <<'PY'
import json, sys
path, name, rc, start, end, log = sys.argv[1:]
s = json.load(open(path))
tail = open(log, errors="replace").read().splitlines()[-6:]
s["steps"].append({"name": name, "ok": rc == "0", "exit": int(rc),
                   "seconds": round(float(end) - float(start), 1), "log": log, "tail": tail})
if name == "device":
    s["device"] = open(log, errors="replace").read().strip()
json.dump(s, open(path, "w"), indent=1)
PY
  printf '%-40s %s (%ss)\n' "$name" "$([[ $rc == 0 ]] && echo ok || echo "FAILED rc=$rc")" \
    "$(python3 -c "print(round($end - $start, 1))")"
  return $rc
}

tests=(
  "warp_mma_test"
  "huffman_unit_test"
  "decode_attention_test"
  "backend_ops_test --gtest_filter=*/cuda"
  "gpu_page_allocator_test"
  "gpu_compaction_test"
  "compactor_test --gtest_filter=*/cuda"
  "paged_kv_cache_backends_test --gtest_filter=*/cuda"
  "llama_backends_test --gtest_filter=*/cuda"
)
small_tests=(
  "warp_mma_test"
  "huffman_unit_test"
  "backend_ops_test --gtest_filter=*/cuda"
  "decode_attention_test --gtest_filter=*Small*"
  "gpu_page_allocator_test --gtest_filter=-*Large*"
  "gpu_compaction_test --gtest_filter=*f16*:*fp8_meta*"
)

status=0
step device 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv,noheader || status=1
case "$mode" in
  correctness)
    for t in "${tests[@]}"; do
      read -r bin args <<<"$t"
      step "test-$bin" 120 $bundle/bin/$bin --gtest_brief=1 $args || status=1
    done
    if [[ -z "$sanitizer" ]]; then
      echo "compute-sanitizer not found: the sanitizer steps did not run"
      status=1
    else
      for t in "${tests[@]}"; do
        read -r bin args <<<"$t"
        step "memcheck-$bin" 150 "$sanitizer" --tool memcheck --error-exitcode 1 \
          --leak-check full $bundle/bin/$bin --gtest_brief=1 $args || status=1
      done
      for t in "${small_tests[@]}"; do
        read -r bin args <<<"$t"
        step "racecheck-$bin" 60 bench/gpu/racecheck.sh "$sanitizer" \
          $bundle/bin/$bin --gtest_brief=1 $args || status=1
      done
      for t in "${small_tests[@]}"; do
        read -r bin args <<<"$t"
        step "synccheck-$bin" 60 "$sanitizer" --tool synccheck --error-exitcode 1 \
          $bundle/bin/$bin --gtest_brief=1 $args || status=1
      done
    fi
    ;;
  speed)
    step sdpa-peer 180 env PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_peer.py --out "$out/sdpa.json" \
      || status=1
    # sluice first, with the memory benchmark (its share of a step needs sluice's own rows); then
    # fp16, the profiles and the other presets, as far as the budget goes.
    bench_preset() {
      local p=$1 limit=$2
      shift 2
      mkdir -p "$out/presets/$p"
      step "bench-$p" "$limit" $bundle/bin/gpu_bench --sdpa_json "$out/sdpa.json" --presets=$p \
        --out_dir "$out/presets/$p" "$@"
    }
    bench_preset sluice 180 --memory=true || status=1
    bench_preset fp16 90 --memory=false || status=1
    # The whole model on the GPU (random weights at SmolLM2's shapes: the real file is more than
    # a call carries), and on this machine's CPU in the same run.
    for b in cuda cpu; do
      step "model-$b" 120 sh -c "$bundle/bin/model_bench --backend=$b --random_model=smollm2 \
        --batches=1,16,64 --prompt_lengths=512 --decode_tokens=32 --repeats=1 --preset=sluice \
        >$out/model-$b.json" || status=1
    done
    # Decode with each op launched one by one (no recorded segments: CUDA graphs off), at the
    # batches whose steps are recorded (up to 16 rows), for the same run's comparison.
    step "model-cuda-unrecorded" 90 sh -c "$bundle/bin/model_bench --backend=cuda \
      --random_model=smollm2 --batches=1,16 --prompt_lengths=512 --decode_tokens=32 --repeats=1 \
      --preset=sluice --record_steps=false >$out/model-cuda-unrecorded.json" || status=1
    if [[ -n "$ncu" ]]; then
      for p in sluice fp16; do
        step "ncu-$p" 120 "$ncu" --clock-control none --kernel-name regex:ChunkKernel \
          --launch-skip 2 --launch-count 1 --set full -f -o "$out/ncu-$p" \
          $bundle/bin/gpu_bench --presets=$p --batches=32 --contexts=16384 --shapes=llama3-8b \
          --reps=3 --memory=false --out_dir /tmp || status=1
        "$ncu" --import "$out/ncu-$p.ncu-rep" --page details --csv >"$out/ncu-$p.csv" 2>/dev/null
      done
    else
      echo "ncu not found: the profiles did not run"
      status=1
    fi
    if [[ -n "$cuobjdump" ]]; then
      # One binary a call: given two, cuobjdump prints its usage and exits 0.
      step resources 30 sh -c "for b in gpu_bench backend_ops_test; do \
        '$cuobjdump' -res-usage $bundle/bin/\$b || exit 1; done" || status=1
    fi
    for p in kvcomp int8 kivi4 kivi2 minikv leankv-k8v4 leankv-k4v2 sinks snapkv pyramid h2o; do
      bench_preset $p 90 --memory=false || status=1
    done
    python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
merged = None
for f in sorted(glob.glob(os.path.join(out, "presets", "*", "gpu-attention.json"))):
    d = json.load(open(f))
    if merged is None:
        merged = dict(d, rows=[])
    merged["rows"] += d["rows"]
if merged:
    json.dump(merged, open(os.path.join(out, "gpu-attention.json"), "w"), indent=1)
    print("merged", len(merged["rows"]), "rows into gpu-attention.json")
# The memory rows are sluice's (only its process runs the memory benchmark); the Huffman rows
# come from the presets with Huffman-coded tiers (kvcomp).
codec = None
for f in sorted(glob.glob(os.path.join(out, "presets", "*", "gpu-codec-memory.json"))):
    d = json.load(open(f))
    if codec is None:
        codec = dict(d, huffman=[], memory=[])
    codec["huffman"] += d.get("huffman", [])
    if os.path.basename(os.path.dirname(f)) == "sluice":
        codec["memory"] = d.get("memory", [])
if codec:
    json.dump(codec, open(os.path.join(out, "gpu-codec-memory.json"), "w"), indent=1)
PY
    ;;
  serve)
    model=/tmp/sluice-random.gguf
    step random-model 60 "$bundle/bin/random_gguf" --like=.gpu/model-desc.gguf --out=$model ||
      status=1
    # up finds the servers as prefill/prefill, decode/decode and router/router.
    cluster=/tmp/sluice-cluster
    for b in prefill decode router; do
      mkdir -p $cluster/$b && ln -sf "$bundle/bin/$b" $cluster/$b/$b
    done
    for b in ${SLUICE_SERVE_BACKENDS:-cuda cpu}; do
      step "serve-$b" 240 env PYTHONUNBUFFERED=1 python3 bench/serve_bench.py \
        --up "$bundle/bin/up" --bin_dir $cluster --model $model --systems=sluice --backend="$b" \
        --threads="$(nproc)" --loads=streams --streams=16 --stream-prompt=512 --max-tokens=32 \
        --fail-on-errors --out "$out/serve-$b.json" || status=1
    done
    ;;
  *)
    echo "usage: bench/gpu/accept.sh correctness|speed|serve [--sync]" >&2
    exit 2
    ;;
esac
echo "summary: $summary"
# The device tool brings back only a few files from $OUT: there, leave one archive per mode
# (logs, summary and results; not ncu's binary reports) in place of the loose files.
if [[ -n "${OUT:-}" ]]; then
  archive="accept-$mode.tgz"
  (cd "$out" && tar czf "/tmp/$archive" --exclude='*.tgz' --exclude='*.ncu-rep' . &&
    find . -mindepth 1 -not -name '*.tgz' -delete && mv "/tmp/$archive" .) &&
    echo "results: $out/$archive"
fi
exit $status
