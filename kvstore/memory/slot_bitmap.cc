#include "kvstore/memory/slot_bitmap.h"

#include <bit>

// Without -mpopcnt, x86-64 std::popcount is a libgcc call; a popcnt clone is picked at load
// time where the CPU has the instruction.
#if defined(__x86_64__) && defined(__GNUC__)
#define SLUICE_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define SLUICE_POPCNT_CLONES
#endif

namespace sluice::kvstore {
namespace {

// Bits [0, slots % 64) of the last word; all ones when slots is a multiple of 64.
uint64_t TailMask(int64_t slots) {
  const int64_t rem = slots & 63;
  return rem == 0 ? ~uint64_t{0} : (uint64_t{1} << rem) - 1;
}

// The first slot in [from, slots) whose bit, XORed with `flip` (0 or ~0), is set; or -1.
int64_t FindFirst(const uint64_t* words, int64_t slots, int64_t from, uint64_t flip) {
  if (from < 0) from = 0;
  if (from >= slots) return -1;
  const int64_t num_words = SlotBitmapWords(slots);
  int64_t w = from >> 6;
  uint64_t bits = (words[w] ^ flip) & (~uint64_t{0} << (from & 63));
  while (bits == 0) {
    if (++w == num_words) return -1;
    bits = words[w] ^ flip;
  }
  const int64_t slot = (w << 6) + std::countr_zero(bits);
  return slot < slots ? slot : -1;
}

}  // namespace

SLUICE_POPCNT_CLONES int64_t CountValid(const uint64_t* words, int64_t slots) {
  if (slots <= 0) return 0;
  const int64_t full = slots >> 6;
  int64_t count = 0;
  for (int64_t w = 0; w < full; ++w) count += std::popcount(words[w]);
  if (slots & 63) count += std::popcount(words[full] & TailMask(slots));
  return count;
}

int64_t FindFirstClear(const uint64_t* words, int64_t slots, int64_t from) {
  return FindFirst(words, slots, from, ~uint64_t{0});
}

int64_t FindFirstSet(const uint64_t* words, int64_t slots, int64_t from) {
  return FindFirst(words, slots, from, 0);
}

}  // namespace sluice::kvstore
