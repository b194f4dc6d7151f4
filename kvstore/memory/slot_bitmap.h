// Slot-validity bitmaps (SpvLLM slot reuse): bit s of a page's bitmap says whether slot s holds
// a live token. Eviction clears the bit (attention masks the slot), a new token refills the
// first clear slot, and a page with no bit set goes back to the pool.
//
// A bitmap of `slots` bits is SlotBitmapWords(slots) little-endian uint64_t words; slot s is
// bit s % 64 of word s / 64. Bits at or past `slots` in the last word are ignored by the
// counting and search functions, so callers need not keep them clear.
#ifndef SLUICE_KVSTORE_MEMORY_SLOT_BITMAP_H_
#define SLUICE_KVSTORE_MEMORY_SLOT_BITMAP_H_

#include <cstdint>

namespace sluice::kvstore {

// Words needed for `slots` bits; 0 for slots <= 0.
inline int64_t SlotBitmapWords(int64_t slots) { return slots <= 0 ? 0 : (slots + 63) / 64; }

// Single-slot access. No bounds checks: `slot` must be in [0, slots) of a bitmap with enough
// words.
inline void SetSlot(uint64_t* words, int64_t slot) {
  words[slot >> 6] |= uint64_t{1} << (slot & 63);
}
inline void ClearSlot(uint64_t* words, int64_t slot) {
  words[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
}
inline bool TestSlot(const uint64_t* words, int64_t slot) {
  return (words[slot >> 6] >> (slot & 63)) & 1;
}

// Valid (set) slots among [0, slots).
int64_t CountValid(const uint64_t* words, int64_t slots);

// The first clear slot in [from, slots), or -1: where slot reuse puts the next token.
// A negative `from` counts as 0.
int64_t FindFirstClear(const uint64_t* words, int64_t slots, int64_t from = 0);

// The first set slot in [from, slots), or -1. A negative `from` counts as 0.
int64_t FindFirstSet(const uint64_t* words, int64_t slots, int64_t from = 0);

// A read-only view of one page's bitmap for planning (see compaction.h). Slots
// [0, used_slots) have been written since the page was allocated; bits at or past used_slots
// are ignored, since a recycled page keeps whatever bitmap its last owner left.
struct SlotBitmapView {
  const uint64_t* words = nullptr;  // [SlotBitmapWords(used_slots)] at least
  int32_t used_slots = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_SLOT_BITMAP_H_
