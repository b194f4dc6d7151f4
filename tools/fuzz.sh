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
ABSL=$(pkg-config --cflags --libs absl_status absl_statusor absl_str_format)
COMMON=(-std=c++20 -g -O1 -I"$ROOT" -Wno-unused-command-line-argument)

# ---- page_wire: the page parser ----
target=page_wire
srcs=("$ROOT/kvstore/wire/page_wire.cc" "$ROOT/kvstore/wire/crc32c.cc")
corpus="$WORK/$target/corpus"
mkdir -p "$corpus" "$WORK/$target/findings"
# Seeds: valid pages of several shapes, written by a small program linked with the parser.
cat >"$WORK/$target/seed.cc" <<'CC'
#include <fstream>
#include <string>
#include "kvstore/wire/page_wire.h"
int main(int argc, char** argv) {
  using namespace sluice::kvstore;
  for (int i = 0; i < 4; ++i) {
    PageHeader h{.sequence_id = 1000u + i, .layer = uint32_t(i), .kv_head = uint32_t(i % 3),
                 .page_index = uint32_t(i), .tier = i % 2 ? PageTier::kLow : PageTier::kHigh,
                 .token_count = uint32_t(16 << i), .codebook_id = uint32_t(i)};
    auto bytes = EncodePage(h, std::string(size_t(i) * 37, char('a' + i)));
    std::ofstream(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary) << *bytes;
  }
}
CC
"$CXX" "${COMMON[@]}" "$WORK/$target/seed.cc" "${srcs[@]}" $ABSL -o "$WORK/$target/seed"
"$WORK/$target/seed" "$corpus"
"$CXX" "${COMMON[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$ROOT/kvstore/wire/page_wire_fuzz.cc" "${srcs[@]}" $ABSL -o "$WORK/$target/fuzzer"
echo "fuzz: $target for ${SECONDS_PER_TARGET}s (ASan + UBSan)" >&2
if ! "$WORK/$target/fuzzer" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -artifact_prefix="$WORK/$target/findings/" "$corpus" >"$WORK/$target/log" 2>&1; then
  tail -40 "$WORK/$target/log" >&2
  echo "fuzz: $target found a failure; inputs in $WORK/$target/findings/" >&2
  exit 1
fi
runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$WORK/$target/log" | grep -Eo '[0-9]+$' || echo "?")
echo "fuzz: $target clean after $runs executions" >&2
