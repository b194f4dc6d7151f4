#include "kvstore/wire/crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

namespace sluice::kvstore {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const uint8_t* p, size_t n,
                                                          uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool HasSse42() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  if (HasSse42()) return Crc32cHardware(static_cast<const uint8_t*>(data), n, crc);
  return Crc32cPortable(data, n, crc);
}

}  // namespace sluice::kvstore
