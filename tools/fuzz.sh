#!/usr/bin/env bash
# Builds and runs sluice's libFuzzer targets under ASan and UBSan with clang.
#   tools/fuzz.sh [SECONDS] [TARGET...]   (default 60 s per target; every target)
# A target NAME is DIR/NAME_fuzz.cc (LLVMFuzzerTestOneInput), built on the sources listed
# below, and DIR/NAME_fuzz_seeds.cc, a program writing valid inputs into the directory it is
# given. The corpus persists in ${XDG_CACHE_HOME:-~/.cache}/sluice/fuzz/NAME/corpus, seeded at
# every run; a failing input is kept in NAME/findings/. Objects are compiled once into
# fuzz/obj/ and again only when their source or a header they include changes. Exits
# non-zero when any target finds a failure.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_PER_TARGET=${1:-60}
shift || true
WORK="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fuzz"
CXX=${CXX_FUZZ:-clang++}
JOBS=$(nproc)
for tool in "$CXX" g++ protoc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz: $tool is not installed (run tools/setup.sh)" >&2
    exit 1
  fi
done
mkdir -p "$WORK"
LIBS=$(pkg-config --libs absl_status absl_statusor absl_str_format absl_strings absl_cord \
  absl_raw_hash_set absl_hash absl_random_random protobuf icu-uc)
SANITIZE=("-fsanitize=address,undefined" -fno-sanitize-recover=undefined)
# Everything the targets run, instrumented for libFuzzer's coverage.
FUZZ_FLAGS=(-std=c++20 -g -O1 -I"$ROOT" -I"$WORK/gen" "${SANITIZE[@]}" -fsanitize=fuzzer-no-link)
# The CUDA compactor the paged KV cache links, under the project's CPU emulation of CUDA
# (kernels/cuda/emu), as Bazel's _emu twins build it: linked, never run (the fuzzers' caches are
# on the reference backend), so g++ without instrumentation.
EMU_FLAGS=(-std=c++20 -O0 -I"$ROOT" -I"$ROOT/kernels/cuda/emu/include" -DSLUICE_CUDA_EMU
  -include cuda_runtime.h -Wno-unknown-pragmas -x c++)

# Compiles each source with `compiler flags...` into $WORK/obj/<flags' hash>/, JOBS at a time,
# skipping those whose object is newer than the source and every header it included; sets
# OBJECTS to the objects, in order.
OBJECTS=()
compile() {
  local compiler=$1
  shift
  local flags=() src obj dep stale
  while [[ $1 != -- ]]; do
    flags+=("$1")
    shift
  done
  shift
  local dir
  dir="$WORK/obj/$(echo "$compiler ${flags[*]}" | md5sum | cut -c1-12)"
  OBJECTS=()
  for src in "$@"; do
    obj="$src"
    obj="${obj#"$ROOT"/}"
    obj="$dir/${obj#"$WORK"/}"
    obj="$obj.o"  # x.cc.o: x.cc and x.cu both have one
    OBJECTS+=("$obj")
    stale=0
    if [[ -f $obj && -f $obj.d ]]; then
      # shellcheck disable=SC2013  # a dependency file is words: the object, then its inputs
      for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
        if [[ ! -e $dep || $dep -nt $obj ]]; then stale=1 && break; fi
      done
    else
      stale=1
    fi
    ((stale)) || continue
    mkdir -p "$(dirname "$obj")"
    rm -f "$obj"
    while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
    nice "$compiler" "${flags[@]}" -MMD -MF "$obj.d" -c "$src" -o "$obj" &
  done
  wait
  for obj in "${OBJECTS[@]}"; do
    if [[ ! -f $obj ]]; then
      echo "fuzz: compiling ${obj#"$dir"/} failed" >&2
      return 1
    fi
  done
}

# Builds target NAME of directory DIR on the library sources after them (paths from the root;
# gen/... are protoc's, emu:... are compiled as the CUDA emulation's), writes its seeds into its
# corpus and fuzzes it for SECONDS_PER_TARGET seconds. Returns non-zero on a finding or when
# the target does not build.
fuzz_target() {
  local name=$1 dir=$2
  shift 2
  local work="$WORK/$name" srcs=() emu_srcs=() src
  for src in "$@"; do
    case $src in
      gen/*) srcs+=("$WORK/$src") ;;
      emu:*) emu_srcs+=("$ROOT/${src#emu:}") ;;
      *) srcs+=("$ROOT/$src") ;;
    esac
  done
  mkdir -p "$work/corpus" "$work/findings"
  compile "$CXX" "${FUZZ_FLAGS[@]}" -- "$ROOT/$dir/${name}_fuzz.cc" \
    "$ROOT/$dir/${name}_fuzz_seeds.cc" "${srcs[@]}" || return 1
  local fuzzer_obj=${OBJECTS[0]} seeds_obj=${OBJECTS[1]} lib=("${OBJECTS[@]:2}")
  if ((${#emu_srcs[@]})); then
    compile g++ "${EMU_FLAGS[@]}" -- "${emu_srcs[@]}" || return 1
    lib+=("${OBJECTS[@]}")
  fi
  # shellcheck disable=SC2086  # LIBS is a list of flags
  if ! nice "$CXX" "${SANITIZE[@]}" "$seeds_obj" "${lib[@]}" $LIBS -o "$work/seeds" ||
    ! nice "$CXX" "${SANITIZE[@]}" -fsanitize=fuzzer "$fuzzer_obj" "${lib[@]}" $LIBS \
      -o "$work/fuzzer" ||
    ! "$work/seeds" "$work/corpus"; then
    echo "fuzz: $name does not build or its seeds fail" >&2
    return 1
  fi
  echo "fuzz: $name for ${SECONDS_PER_TARGET}s (ASan + UBSan)" >&2
  if ! "$work/fuzzer" -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -print_final_stats=1 \
    -artifact_prefix="$work/findings/" "$work/corpus" >"$work/log" 2>&1; then
    tail -40 "$work/log" >&2
    echo "fuzz: $name found a failure; inputs in $work/findings/" >&2
    return 1
  fi
  local runs
  runs=$(grep -aEo 'stat::number_of_executed_units: *[0-9]+' "$work/log" | grep -Eo '[0-9]+$' ||
    echo "?")
  echo "fuzz: $name clean after $runs executions" >&2
}

# The messages a worker accepts from the router and the KV state from a peer, as C++; a file
# that did not change keeps its time, so that what includes it is not compiled again.
rm -rf "$WORK/gen.new" && mkdir -p "$WORK/gen.new" "$WORK/gen"
(cd "$ROOT" && protoc -I. --cpp_out="$WORK/gen.new" proto/sluice.proto \
  kvstore/wire/kv_sequence_state.proto)
(cd "$WORK/gen.new" && find . -type f) | while read -r f; do
  if ! cmp -s "$WORK/gen.new/$f" "$WORK/gen/$f"; then
    mkdir -p "$(dirname "$WORK/gen/$f")" && cp "$WORK/gen.new/$f" "$WORK/gen/$f"
  fi
done

# The paged KV cache on the reference backend, with the CUDA compactor it links (emu:).
KV_CACHE_SRCS=(kvstore/cache/paged_kv_cache.cc kvstore/cache/paged_kv_cache_transfer.cc
  kvstore/cache/row_window.cc kvstore/cache/kv_codebooks.cc kvstore/kv_preset.cc
  kvstore/policy/token_policy.cc kvstore/policy/snapkv.cc kvstore/policy/sinks.cc
  kvstore/policy/leankv.cc kvstore/policy/h2o.cc kvstore/memory/slot_bitmap.cc
  kvstore/memory/page_table.cc kvstore/memory/page_pool.cc kvstore/memory/kv_accounting.cc
  kvstore/memory/compactor.cc kvstore/memory/compaction.cc kvstore/wire/crc32c.cc
  kernels/kv_huffman.cc kernels/kv_format.cc kernels/huffman.cc kernels/ggml_quant.cc
  kernels/device_buffer.cc kernels/backend.cc kernels/host_backend.cc kernels/ref/swiglu.cc
  kernels/ref/softmax.cc kernels/ref/rope.cc kernels/ref/rmsnorm.cc kernels/ref/ref_backend.cc
  kernels/ref/paged_attention.cc kernels/ref/matmul.cc kernels/ref/kv_quant.cc
  kernels/ref/get_rows.cc kernels/ref/attention.cc gen/kvstore/wire/kv_sequence_state.pb.cc
  emu:kvstore/memory/cuda/gpu_compaction.cc emu:kvstore/memory/cuda/gpu_compaction.cu
  emu:kvstore/memory/cuda/device_scan.cu emu:kvstore/memory/cuda/gpu_page_allocator.cc
  emu:kvstore/memory/cuda/gpu_page_allocator.cu emu:kernels/cuda/kv_slot_copy.cu
  emu:kernels/cuda/cuda_status.cc emu:kernels/cuda/emu/cublas.cc emu:kernels/cuda/emu/fiber.cc
  emu:kernels/cuda/emu/runtime.cc emu:kernels/cuda/emu/scheduler.cc)

# ---- The targets: name, directory, the sources they run on ----
run_target() {
  case $1 in
    # The model file parser (a model file is input from outside).
    gguf) fuzz_target gguf model model/gguf.cc kernels/ggml_quant.cc \
      model/test_util/gguf_writer.cc ;;
    # Request bodies of the OpenAI API and what the router builds from them.
    openai_request) fuzz_target openai_request router router/openai_api.cc \
      model/chat_template.cc model/sampler.cc model/unicode_utf8.cc kvstore/kv_preset.cc \
      kernels/kv_format.cc ;;
    # Generated tokens to streamed text: detokenization, UTF-8 holdback, stop strings.
    sse_text) fuzz_target sse_text router router/text_assembler.cc router/openai_api.cc \
      model/tokenizer.cc model/unicode_pretokenizer.cc model/unicode_utf8.cc model/gguf.cc \
      kernels/ggml_quant.cc model/sampler.cc model/chat_template.cc gen/proto/sluice.pb.cc ;;
    # What a decode worker accepts from its peers: the KV sequence state and its pages, and the
    # router's requests.
    peer_state) fuzz_target peer_state tests "${KV_CACHE_SRCS[@]}" model/sampler.cc \
      gen/proto/sluice.pb.cc ;;
    *)
      echo "fuzz: unknown target $1" >&2
      return 2
      ;;
  esac
}

targets=("$@")
((${#targets[@]})) || targets=(gguf openai_request sse_text peer_state)
failed=()
for target in "${targets[@]}"; do
  run_target "$target" || failed+=("$target")
done
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}" >&2
  exit 1
fi
