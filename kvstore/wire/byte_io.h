// Little-endian fields in and out of byte strings: what the wire's block and stream forms
// (kv_transform.h, kv_wire_codec.h) are written and read with.
#ifndef SLUICE_KVSTORE_WIRE_BYTE_IO_H_
#define SLUICE_KVSTORE_WIRE_BYTE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::kvstore {

inline void PutU8(std::string& s, uint8_t x) { s.push_back(static_cast<char>(x)); }
inline void PutU16(std::string& s, uint16_t x) { s.append(reinterpret_cast<const char*>(&x), 2); }
inline void PutU32(std::string& s, uint32_t x) { s.append(reinterpret_cast<const char*>(&x), 4); }
inline void PutF32s(std::string& s, const std::vector<float>& x) {
  s.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
}
// An unsigned LEB128 varint: 7 bits a byte, low first, the top bit set on every byte but the
// last.
inline void PutVarint(std::string& s, uint32_t x) {
  while (x >= 0x80) {
    s.push_back(static_cast<char>((x & 0x7f) | 0x80));
    x >>= 7;
  }
  s.push_back(static_cast<char>(x));
}

// Reads fields in order from a byte string; a read past the end takes nothing and says false.
class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  bool Take(void* out, size_t n) {
    if (b_.size() - pos_ < n) return false;
    std::memcpy(out, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n, std::string_view* out) {
    if (b_.size() - pos_ < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // An unsigned LEB128 varint of at most 5 bytes that fits 32 bits.
  bool TakeVarint(uint32_t* out) {
    uint64_t x = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      if (pos_ == b_.size()) return false;
      const uint8_t byte = static_cast<uint8_t>(b_[pos_++]);
      x |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        if (x > UINT32_MAX) return false;
        *out = static_cast<uint32_t>(x);
        return true;
      }
    }
    return false;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_BYTE_IO_H_
