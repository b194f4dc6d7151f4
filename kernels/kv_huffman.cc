#include "kernels/kv_huffman.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::kernels {
namespace {

constexpr int kStreamsPerUnit = 2 * kKvHuffmanStreams;

uint32_t* Streams(uint8_t* page, const KvPageLayout& l) {
  return reinterpret_cast<uint32_t*>(page + l.streams);
}
const uint32_t* Streams(const uint8_t* page, const KvPageLayout& l) {
  return reinterpret_cast<const uint32_t*>(page + l.streams);
}

// Symbols of each K (and V) stream of a unit: a quarter of its D x U codes.
int64_t StreamSymbols(const KvHuffmanTier& t) {
  return static_cast<int64_t>(t.format.head_dim) * t.layout.unit_tokens / kKvHuffmanStreams;
}

// The valid bits of unit `index`'s U slots (U <= 64 and divides 64).
uint64_t UnitValidBits(const KvPageLayout& l, const uint8_t* page, int64_t index) {
  const int64_t first = index * l.unit_tokens;
  const uint64_t word = reinterpret_cast<const uint64_t*>(page + l.valid)[first / 64];
  const uint64_t mask = l.unit_tokens == 64 ? ~uint64_t{0} : (uint64_t{1} << l.unit_tokens) - 1;
  return (word >> (first % 64)) & mask;
}

// Everything of a unit page but its codes: metadata and valid bits.
void UnpackUnitMeta(const KvHuffmanTier& t, const uint8_t* page, int64_t index, uint8_t* unit) {
  const KvPageLayout& l = t.layout;
  const KvPageLayout& ul = t.unit_layout;
  const uint8_t* meta = page + l.unit_meta + index * l.unit_meta_bytes;
  std::memcpy(unit + ul.k_meta, meta, l.unit_k_meta_bytes);
  std::memcpy(unit + ul.v_meta, meta + l.unit_k_meta_bytes,
              l.unit_meta_bytes - l.unit_k_meta_bytes);
  *reinterpret_cast<uint64_t*>(unit + ul.valid) = UnitValidBits(l, page, index);
}

// Canonical decoding one bit at a time: a code of length n is the n-bit value read MSB first
// (the first bit of the stream is the code's top bit), and the codes of each length are
// consecutive from first[n], assigned to symbols in increasing order.
class CanonicalDecoder {
 public:
  explicit CanonicalDecoder(const HuffmanCodebook& cb) {
    for (int s = 0; s < cb.alphabet_size; ++s) count_[cb.lengths[s]]++;
    count_[0] = 0;
    int code = 0, index = 0;
    for (int n = 1; n <= kMaxHuffmanCodeLength; ++n) {
      code = (code + count_[n - 1]) << 1;
      first_[n] = code;
      index_[n] = index;
      index += count_[n];
    }
    for (int n = 1; n <= kMaxHuffmanCodeLength; ++n) {
      for (int s = 0; s < cb.alphabet_size; ++s) {
        if (cb.lengths[s] == n) sorted_.push_back(static_cast<uint8_t>(s));
      }
    }
  }

  // Decodes `n` symbols from bit `pos` of `bits`.
  void Decode(const uint8_t* bits, uint64_t pos, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; ++i) {
      int code = 0;
      for (int len = 1; len <= kMaxHuffmanCodeLength; ++len) {
        code = code << 1 | ((bits[pos / 8] >> (pos % 8)) & 1);
        ++pos;
        if (code - first_[len] < count_[len]) {
          out[i] = sorted_[index_[len] + code - first_[len]];
          break;
        }
      }
    }
  }

 private:
  int count_[kMaxHuffmanCodeLength + 1] = {};
  int first_[kMaxHuffmanCodeLength + 1] = {};
  int index_[kMaxHuffmanCodeLength + 1] = {};
  std::vector<uint8_t> sorted_;
};

}  // namespace

absl::StatusOr<KvHuffmanTier> MakeKvHuffmanTier(const KvTierFormat& format) {
  if (format.huffman_bits == 0.f) return absl::InvalidArgumentError("not a Huffman-coded tier");
  KvHuffmanTier t;
  t.format = format;
  SLUICE_ASSIGN_OR_RETURN(t.layout, ComputePageLayout(format));
  t.unit_format = KvUnitFormat(format);
  SLUICE_ASSIGN_OR_RETURN(t.unit_layout, ComputeUnitLayout(format));
  return t;
}

absl::StatusOr<bool> KvAppendUnit(const KvHuffmanTier& t, const KvCodebooks& cb,
                                  const uint8_t* unit, int64_t index, uint8_t* page) {
  const KvPageLayout& l = t.layout;
  const KvPageLayout& ul = t.unit_layout;
  if (index < 0 || (index + 1) * l.unit_tokens > l.tokens) return false;
  uint32_t* streams = Streams(page, l);
  const uint64_t start_bits = index == 0 ? 0 : streams[index * kStreamsPerUnit];
  const int64_t start = static_cast<int64_t>((start_bits + 7) / 8);
  const int64_t n = StreamSymbols(t);
  const uint8_t* k = unit + ul.k_codes;
  const uint8_t* v = unit + ul.v_codes;
  const int64_t k_bytes =
      static_cast<int64_t>((EncodedBits(*cb.k, k, kKvHuffmanStreams * n) + 7) / 8);
  const int64_t v_bytes =
      static_cast<int64_t>((EncodedBits(*cb.v, v, kKvHuffmanStreams * n) + 7) / 8);
  const int64_t capacity = t.format.page_bytes - l.bitstream;
  if (start + k_bytes + v_bytes + static_cast<int64_t>(HuffmanPaddingBytes()) > capacity) {
    return false;
  }
  uint8_t* bits = page + l.bitstream;
  uint32_t offsets[kKvHuffmanStreams + 1];
  SLUICE_ASSIGN_OR_RETURN(const uint64_t kb, EncodeRows(*cb.k, k, kKvHuffmanStreams, n,
                                                        bits + start, capacity - start, offsets));
  uint32_t* out = streams + index * kStreamsPerUnit;
  for (int i = 0; i < kKvHuffmanStreams; ++i)
    out[i] = static_cast<uint32_t>(start * 8 + offsets[i]);
  const int64_t v_start = start + static_cast<int64_t>((kb + 7) / 8);
  SLUICE_ASSIGN_OR_RETURN(
      const uint64_t vb,
      EncodeRows(*cb.v, v, kKvHuffmanStreams, n, bits + v_start, capacity - v_start, offsets));
  for (int i = 0; i < kKvHuffmanStreams; ++i) {
    out[kKvHuffmanStreams + i] = static_cast<uint32_t>(v_start * 8 + offsets[i]);
  }
  out[kStreamsPerUnit] = static_cast<uint32_t>(v_start * 8 + vb);
  uint8_t* meta = page + l.unit_meta + index * l.unit_meta_bytes;
  std::memcpy(meta, unit + ul.k_meta, l.unit_k_meta_bytes);
  std::memcpy(meta + l.unit_k_meta_bytes, unit + ul.v_meta,
              l.unit_meta_bytes - l.unit_k_meta_bytes);
  const int64_t first = index * l.unit_tokens;
  uint64_t* valid = reinterpret_cast<uint64_t*>(page + l.valid);
  const uint64_t mask = l.unit_tokens == 64 ? ~uint64_t{0} : (uint64_t{1} << l.unit_tokens) - 1;
  valid[first / 64] = (valid[first / 64] & ~(mask << (first % 64))) |
                      (*reinterpret_cast<const uint64_t*>(unit + ul.valid) & mask) << (first % 64);
  return true;
}

void KvDecodeUnit(const KvHuffmanTier& t, const KvCodebooks& cb, const uint8_t* page, int64_t index,
                  uint8_t* unit) {
  const KvPageLayout& l = t.layout;
  const uint32_t* streams = Streams(page, l) + index * kStreamsPerUnit;
  const uint8_t* bits = page + l.bitstream;
  const int64_t n = StreamSymbols(t);
  DecodeRows(*cb.k, bits, streams, kKvHuffmanStreams, n, unit + t.unit_layout.k_codes);
  DecodeRows(*cb.v, bits, streams + kKvHuffmanStreams, kKvHuffmanStreams, n,
             unit + t.unit_layout.v_codes);
  UnpackUnitMeta(t, page, index, unit);
}

void KvDecodeUnitReference(const KvHuffmanTier& t, const KvCodebooks& cb, const uint8_t* page,
                           int64_t index, uint8_t* unit) {
  const KvPageLayout& l = t.layout;
  const uint32_t* streams = Streams(page, l) + index * kStreamsPerUnit;
  const uint8_t* bits = page + l.bitstream;
  const int64_t n = StreamSymbols(t);
  const CanonicalDecoder kd(*cb.k), vd(*cb.v);
  for (int i = 0; i < kKvHuffmanStreams; ++i) {
    kd.Decode(bits, streams[i], n, unit + t.unit_layout.k_codes + i * n);
    vd.Decode(bits, streams[kKvHuffmanStreams + i], n, unit + t.unit_layout.v_codes + i * n);
  }
  UnpackUnitMeta(t, page, index, unit);
}

absl::Status KvCheckUnits(const KvHuffmanTier& t, const KvCodebooks& cb, const uint8_t* page,
                          int64_t units) {
  const KvPageLayout& l = t.layout;
  if (units < 0 || units * l.unit_tokens > l.tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d units of %d tokens in a page of %d", units, l.unit_tokens, l.tokens));
  }
  if (units > 0 && (cb.k == nullptr || cb.v == nullptr)) {
    return absl::InvalidArgumentError("Huffman-coded units without codebooks");
  }
  // The bits a row may occupy: the decoders read up to HuffmanPaddingBytes() past a row's end.
  const int64_t code_bytes =
      t.format.page_bytes - l.bitstream - static_cast<int64_t>(HuffmanPaddingBytes());
  if (code_bytes < 0) return absl::InvalidArgumentError("a page with no room for codes");
  const std::string_view bits(reinterpret_cast<const char*>(page + l.bitstream), code_bytes);
  const uint32_t* streams = Streams(page, l);
  const int64_t n = StreamSymbols(t);
  std::vector<uint8_t> symbols(n);
  for (int64_t u = 0; u < units; ++u) {
    // Offsets [0, 2 * kKvHuffmanStreams) start the unit's rows; the one after them is where
    // its codes end (the last unit) or the next unit starts, at the next byte.
    const uint32_t* at = streams + u * kStreamsPerUnit;
    if (u == 0 && at[0] != 0) {
      return absl::DataLossError(absl::StrFormat("unit 0 starts at bit %d, not 0", at[0]));
    }
    for (int r = 0; r < kStreamsPerUnit; ++r) {
      const uint64_t next = at[r + 1];
      if (next < at[r] || next > uint64_t{bits.size()} * 8) {
        return absl::DataLossError(
            absl::StrFormat("unit %d row %d spans bits [%d, %d) of a %d-bit bitstream", u, r, at[r],
                            next, bits.size() * 8));
      }
      absl::StatusOr<uint64_t> stop = DecodeRowWithin(r < kKvHuffmanStreams ? *cb.k : *cb.v, bits,
                                                      at[r], next, n, symbols.data());
      if (!stop.ok()) {
        return absl::DataLossError(
            absl::StrFormat("unit %d row %d: %s", u, r, stop.status().message()));
      }
      // Rows follow one another, but V's first row and the next unit start at a byte.
      const uint64_t end = *stop;
      const bool padded = r == kKvHuffmanStreams - 1 || r == kStreamsPerUnit - 1;
      if (padded ? next - end >= 8 : end != next) {
        return absl::DataLossError(absl::StrFormat(
            "unit %d row %d ends at bit %d, the next row starts at bit %d", u, r, end, next));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvQuantizeHuffman(const KvQuantizeParams& p,
                               absl::FunctionRef<void(const KvQuantizeParams&)> quantize_unit) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier t, MakeKvHuffmanTier(p.format));
  const int64_t u = t.layout.unit_tokens;
  std::vector<uint8_t> unit(t.unit_layout.bytes_used);
  int64_t written = 0;
  for (; written < p.tokens; written += u) {
    std::memset(unit.data() + t.unit_layout.valid, 0, 8);
    quantize_unit({.k = p.k.subview(written * p.stride),
                   .v = p.v.subview(written * p.stride),
                   .stride = p.stride,
                   .tokens = u,
                   .format = t.unit_format,
                   .layout = t.unit_layout,
                   .page = HostView(unit),
                   .slot = 0});
    const int64_t slot = p.slot + written;
    SLUICE_ASSIGN_OR_RETURN(const bool fits,
                            KvAppendUnit(t, p.codebooks, unit.data(), slot / u, p.page.data));
    if (!fits) break;
    KvWriteTokenMeta(p.format, t.layout, p.page.data, slot, u,
                     p.scores.data ? p.scores.data + written : nullptr,
                     p.positions.data ? p.positions.data + written : nullptr);
  }
  *p.tokens_written = written;
  return absl::OkStatus();
}

absl::Status KvDequantizeHuffman(
    const KvDequantizeParams& p, bool reference,
    absl::FunctionRef<void(const KvDequantizeParams&)> dequantize_unit) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier t, MakeKvHuffmanTier(p.format));
  const int64_t u = t.layout.unit_tokens, d = p.format.head_dim;
  std::vector<uint8_t> unit(t.unit_layout.bytes_used);
  for (int64_t s = p.slot; s < p.slot + p.tokens;) {
    const int64_t index = s / u, first = s % u;
    const int64_t n = std::min(u - first, p.slot + p.tokens - s);
    if (reference) {
      KvDecodeUnitReference(t, p.codebooks, p.page.data, index, unit.data());
    } else {
      KvDecodeUnit(t, p.codebooks, p.page.data, index, unit.data());
    }
    const int64_t at = s - p.slot;
    dequantize_unit({.page = HostView(unit),
                     .format = t.unit_format,
                     .layout = t.unit_layout,
                     .slot = first,
                     .tokens = n,
                     .k = p.k.subview(at * d),
                     .v = p.v.subview(at * d)});
    s += n;
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
