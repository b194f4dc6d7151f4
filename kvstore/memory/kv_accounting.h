// KV cache accounting: what the compressed pages hold and what they cost, summed over page
// tables, sequences or a whole worker and exported as metrics (pages by tier, bytes, internal
// fragmentation, compression ratio against FP16).
#ifndef SLUICE_KVSTORE_MEMORY_KV_ACCOUNTING_H_
#define SLUICE_KVSTORE_MEMORY_KV_ACCOUNTING_H_

#include <cstdint>
#include <string>

namespace sluice::kvstore {

struct KvAccounting {
  int64_t pages_high = 0;
  int64_t pages_low = 0;
  int64_t page_bytes = 0;       // bytes of one page; 0 while nothing is counted
  int64_t live_slots = 0;       // valid token slots held: tokens x kv heads x layers
  int64_t allocated_slots = 0;  // slots of the allocated pages, valid or not
  int64_t fp16_bytes = 0;       // what the live tokens would take as FP16 K + V (Fp16KvBytes)

  int64_t pages() const { return pages_high + pages_low; }
  int64_t bytes() const { return pages() * page_bytes; }

  // Internal fragmentation: 1 - live_slots / allocated_slots; 0 when nothing is allocated.
  double fragmentation() const;

  // fp16_bytes / bytes(): how many times smaller than FP16 the cache is; 0 with no pages.
  double compression_ratio() const;

  // Adds another account's counts. Both must use the same page size (or one none yet): pages of
  // different sizes cannot be summed into one count (asserted in debug builds).
  KvAccounting& operator+=(const KvAccounting& other);

  // "pages 12 high + 30 low (688128 bytes), 1700 of 2400 slots live (fragmentation 0.292),
  // 4.92x smaller than fp16"
  std::string ToString() const;

  bool operator==(const KvAccounting&) const = default;
};

inline KvAccounting operator+(KvAccounting a, const KvAccounting& b) { return a += b; }

// FP16 K + V bytes of `live_slots` token slots (each one token of one kv head of one layer) of
// head_dim channels: live_slots * head_dim * 2 (K and V) * 2 bytes.
inline int64_t Fp16KvBytes(int64_t live_slots, int64_t head_dim) {
  return live_slots * head_dim * 4;
}

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_KV_ACCOUNTING_H_
