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
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_BYTE_IO_H_
