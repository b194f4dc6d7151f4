#include "kvstore/memory/kv_accounting.h"

#include <cassert>

#include "absl/strings/str_format.h"

namespace sluice::kvstore {

double KvAccounting::fragmentation() const {
  if (allocated_slots <= 0) return 0.0;
  return 1.0 - static_cast<double>(live_slots) / static_cast<double>(allocated_slots);
}

double KvAccounting::compression_ratio() const {
  const int64_t b = bytes();
  if (b <= 0) return 0.0;
  return static_cast<double>(fp16_bytes) / static_cast<double>(b);
}

KvAccounting& KvAccounting::operator+=(const KvAccounting& other) {
  assert(page_bytes == 0 || other.page_bytes == 0 || page_bytes == other.page_bytes);
  if (page_bytes == 0) page_bytes = other.page_bytes;
  pages_high += other.pages_high;
  pages_low += other.pages_low;
  live_slots += other.live_slots;
  allocated_slots += other.allocated_slots;
  fp16_bytes += other.fp16_bytes;
  return *this;
}

std::string KvAccounting::ToString() const {
  return absl::StrFormat(
      "pages %d high + %d low (%d bytes), %d of %d slots live (fragmentation %.3f), %.2fx "
      "smaller than fp16",
      pages_high, pages_low, bytes(), live_slots, allocated_slots, fragmentation(),
      compression_ratio());
}

}  // namespace sluice::kvstore
