#!/usr/bin/env bash
# Builds and runs sluice's libFuzzer targets under ASan and UBSan with clang.
#   tools/fuzz.sh [SECONDS]      (default 60 per target)
# The corpus persists in ${XDG_CACHE_HOME:-~/.cache}/sluice/fuzz/<target>/, seeded with valid
# inputs. Exits non-zero on any finding; the crashing input is kept beside the corpus.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_PER_TARGET=${1:-60}
WORK="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fuzz"
CXX=${CXX_FUZZ:-clang++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz: $CXX is not installed (run tools/setup.sh)" >&2
  exit 1
fi
mkdir -p "$WORK"
ABSL=$(pkg-config --cflags --libs absl_status absl_statusor absl_str_format absl_strings \
  absl_raw_hash_set absl_hash)
COMMON=(-std=c++20 -g -O1 -I"$ROOT" -Wno-unused-command-line-argument)

# ---- gguf: the model file parser (a model file is input from outside) ----
target=gguf
srcs=("$ROOT/model/gguf.cc" "$ROOT/kernels/ggml_quant.cc")
corpus="$WORK/$target/corpus"
mkdir -p "$corpus" "$WORK/$target/findings"
# Seeds: small valid files with metadata of every type and tensors of every element type,
# written by the tests' GGUF writer.
cat >"$WORK/$target/seed.cc" <<'CC'
#include <fstream>
#include <string>
#include "model/test_util/gguf_writer.h"
int main(int argc, char** argv) {
  using namespace sluice;
  using kernels::GgmlType;
  for (int i = 0; i < 3; ++i) {
    model::testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.block_count", 2 + i);
    w.AddInt32("signed", -7 * i);
    w.AddUint64("big", uint64_t{1} << (20 + i));
    w.AddFloat32("llama.rope.freq_base", 10000.f);
    w.AddBool("tokenizer.ggml.add_bos_token", i % 2 == 0);
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>", ""});
    w.AddInt32Array("tokenizer.ggml.token_type", {1, 1, 3, 1});
    w.AddFloat32Array("scores", {0.5f, -1.f});
    std::vector<float> ramp(128);
    for (size_t j = 0; j < ramp.size(); ++j) ramp[j] = 0.25f * float(j) - 7.f;
    const GgmlType types[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                              GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1};
    for (GgmlType t : types) {
      w.AddTensorFromFloats("t" + std::to_string(int(t)), {64, 2}, t, ramp);
    }
    std::ofstream(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary)
        << w.Build(3, i == 2 ? 64 : 32);
  }
}
CC
"$CXX" "${COMMON[@]}" "$WORK/$target/seed.cc" "$ROOT/model/test_util/gguf_writer.cc" \
  "${srcs[@]}" $ABSL -o "$WORK/$target/seed"
"$WORK/$target/seed" "$corpus"
"$CXX" "${COMMON[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$ROOT/model/gguf_fuzz.cc" "${srcs[@]}" $ABSL -o "$WORK/$target/fuzzer"
echo "fuzz: $target for ${SECONDS_PER_TARGET}s (ASan + UBSan)" >&2
if ! "$WORK/$target/fuzzer" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -artifact_prefix="$WORK/$target/findings/" "$corpus" >"$WORK/$target/log" 2>&1; then
  tail -40 "$WORK/$target/log" >&2
  echo "fuzz: $target found a failure; inputs in $WORK/$target/findings/" >&2
  exit 1
fi
runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$WORK/$target/log" | grep -Eo '[0-9]+$' || echo "?")
echo "fuzz: $target clean after $runs executions" >&2
