// Length-limited canonical Huffman coding of quantization codes; see huffman.h.
#include "kernels/huffman.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_format.h"

namespace sluice::kernels {
namespace {

constexpr uint8_t kCodebookWireVersion = 1;
constexpr size_t kCodebookHeaderBytes = 8;

// Smallest table width that can give every symbol of the alphabet its own code.
int MinMaxLength(int alphabet_size) {
  int bits = 1;
  while ((1 << bits) < alphabet_size) ++bits;
  return bits;
}

uint16_t ReverseBits(uint16_t code, int length) {
  uint16_t out = 0;
  for (int i = 0; i < length; ++i) out |= ((code >> i) & 1) << (length - 1 - i);
  return out;
}

uint64_t Load64(const uint8_t* at) {
  uint64_t v;
  std::memcpy(&v, at, sizeof(v));  // x86-64 and aarch64 Linux are little-endian
  return v;
}

// Optimal code lengths <= max_length for positive weights (n >= 2, 2^max_length >= n), by
// package-merge (Larmore and Hirschberg 1990). Level 0 lists the leaves by weight; level j
// merges the leaves with the pairs ("packages") of level j - 1. A symbol's code length is the
// number of levels whose selected prefix holds its leaf, where the last level selects its first
// 2n - 2 items and each level's selected packages select twice as many items one level down.
// Package weights never decrease along a level, so the selected packages are always its first
// ones and the items need not remember their children.
std::vector<uint8_t> PackageMergeLengths(const std::vector<uint64_t>& weights, int max_length) {
  const int n = static_cast<int>(weights.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return weights[a] < weights[b]; });

  struct Item {
    uint64_t weight;
    int symbol;  // -1 for a package
  };
  const size_t keep = 2 * static_cast<size_t>(n) - 2;  // items past this are never selected
  std::vector<std::vector<Item>> levels(max_length);
  for (int s : order) levels[0].push_back({weights[s], s});
  for (int j = 1; j < max_length; ++j) {
    const std::vector<Item>& prev = levels[j - 1];
    std::vector<Item>& cur = levels[j];
    size_t leaf = 0, pkg = 0;
    const size_t packages = prev.size() / 2;
    while (cur.size() < keep && (leaf < order.size() || pkg < packages)) {
      const uint64_t pkg_weight =
          pkg < packages ? prev[2 * pkg].weight + prev[2 * pkg + 1].weight : 0;
      if (pkg == packages || (leaf < order.size() && levels[0][leaf].weight <= pkg_weight)) {
        cur.push_back(levels[0][leaf++]);
      } else {
        cur.push_back({pkg_weight, -1});
        ++pkg;
      }
    }
  }

  std::vector<uint8_t> lengths(n, 0);
  size_t selected = keep;
  for (int j = max_length - 1; j >= 0; --j) {
    size_t packages = 0;
    for (size_t i = 0; i < selected && i < levels[j].size(); ++i) {
      if (levels[j][i].symbol >= 0) {
        ++lengths[levels[j][i].symbol];
      } else {
        ++packages;
      }
    }
    selected = 2 * packages;
  }
  return lengths;
}

// Decodes n symbols from `bits` starting at bit `pos`; returns the end position. After each
// refill (an 8-byte load at pos / 8) at least 57 bits are valid, enough for kPerRefill codes,
// so the inner loop has no branches: mask, look up, shift. Reads stay below
// pos / 8 + 8 for every refill position. kChecked adds, per refill, a stop once the stream
// passes `limit` or hits a bit pattern without a code (then *ok = false), which bounds reads to
// limit / 8 + 8.
template <int kLen, bool kChecked>
uint64_t DecodeImpl(const uint16_t* table, const uint8_t* bits, uint64_t pos, int64_t n,
                    uint8_t* out, uint64_t limit, bool* ok) {
  constexpr int kPerRefill = 57 / kLen;
  constexpr uint64_t kMask = (uint64_t{1} << kLen) - 1;
  uint32_t invalid = 0;
  int64_t i = 0;
  for (; i + kPerRefill <= n; i += kPerRefill) {
    if constexpr (kChecked) {
      if (pos > limit || invalid != 0) {
        *ok = false;
        return pos;
      }
    }
    uint64_t buf = Load64(bits + (pos >> 3)) >> (pos & 7);
#pragma GCC unroll 16
    for (int k = 0; k < kPerRefill; ++k) {
      const uint32_t entry = table[buf & kMask];
      out[i + k] = static_cast<uint8_t>(entry);
      const uint32_t length = entry >> 8;
      buf >>= length;
      pos += length;
      if constexpr (kChecked) invalid |= static_cast<uint32_t>(entry < 0x100);
    }
  }
  if (i < n) {
    if constexpr (kChecked) {
      if (pos > limit || invalid != 0) {
        *ok = false;
        return pos;
      }
    }
    uint64_t buf = Load64(bits + (pos >> 3)) >> (pos & 7);
    for (; i < n; ++i) {
      const uint32_t entry = table[buf & kMask];
      out[i] = static_cast<uint8_t>(entry);
      const uint32_t length = entry >> 8;
      buf >>= length;
      pos += length;
      if constexpr (kChecked) invalid |= static_cast<uint32_t>(entry < 0x100);
    }
  }
  if constexpr (kChecked) *ok = *ok && invalid == 0;
  return pos;
}

// DecodeImpl on kWays rows at once, in lockstep: each row's table lookups form a dependency
// chain (mask, load, shift: about 8 cycles a symbol), and interleaving independent rows lets
// the core overlap the chains.
template <int kLen, int kWays>
void DecodeWaysImpl(const uint16_t* table, const uint8_t* bits, const uint32_t* offsets,
                    int64_t row_len, uint8_t* out) {
  constexpr int kPerRefill = 57 / kLen;
  constexpr uint64_t kMask = (uint64_t{1} << kLen) - 1;
  uint64_t pos[kWays];
  uint64_t buf[kWays];
#pragma GCC unroll 8
  for (int w = 0; w < kWays; ++w) pos[w] = offsets[w];
  int64_t i = 0;
  for (; i + kPerRefill <= row_len; i += kPerRefill) {
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) buf[w] = Load64(bits + (pos[w] >> 3)) >> (pos[w] & 7);
#pragma GCC unroll 16
    for (int k = 0; k < kPerRefill; ++k) {
#pragma GCC unroll 8
      for (int w = 0; w < kWays; ++w) {
        const uint32_t entry = table[buf[w] & kMask];
        out[w * row_len + i + k] = static_cast<uint8_t>(entry);
        buf[w] >>= entry >> 8;
        pos[w] += entry >> 8;
      }
    }
  }
  if (i < row_len) {
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) buf[w] = Load64(bits + (pos[w] >> 3)) >> (pos[w] & 7);
    for (; i < row_len; ++i) {
#pragma GCC unroll 8
      for (int w = 0; w < kWays; ++w) {
        const uint32_t entry = table[buf[w] & kMask];
        out[w * row_len + i] = static_cast<uint8_t>(entry);
        buf[w] >>= entry >> 8;
      }
    }
  }
}

constexpr int kDecodeWays = 4;

template <int kLen>
void DecodeRowsImpl(const uint16_t* table, const uint8_t* bits, const uint32_t* offsets,
                    int64_t rows, int64_t row_len, uint8_t* out) {
  int64_t r = 0;
  for (; r + kDecodeWays <= rows; r += kDecodeWays) {
    DecodeWaysImpl<kLen, kDecodeWays>(table, bits, offsets + r, row_len, out + r * row_len);
  }
  for (; r < rows; ++r) {
    bool ok = true;
    DecodeImpl<kLen, false>(table, bits, offsets[r], row_len, out + r * row_len, 0, &ok);
  }
}

template <size_t... I>
constexpr auto MakeRowsDecoders(std::index_sequence<I...>) {
  return std::array{&DecodeRowsImpl<static_cast<int>(I) + 1>...};
}
constexpr auto kRowsDecoders = MakeRowsDecoders(std::make_index_sequence<kMaxHuffmanCodeLength>());

using DecodeFn = uint64_t (*)(const uint16_t*, const uint8_t*, uint64_t, int64_t, uint8_t*,
                              uint64_t, bool*);

// The table width becomes a compile-time constant: index max_length - 1.
template <bool kChecked, size_t... I>
constexpr std::array<DecodeFn, sizeof...(I)> MakeDecoders(std::index_sequence<I...>) {
  return {&DecodeImpl<static_cast<int>(I) + 1, kChecked>...};
}
constexpr auto kDecoders = MakeDecoders<false>(std::make_index_sequence<kMaxHuffmanCodeLength>());
constexpr auto kCheckedDecoders =
    MakeDecoders<true>(std::make_index_sequence<kMaxHuffmanCodeLength>());

// Multi-symbol decoding of kWays rows in lockstep (HuffmanCodebook::multi_table): each lookup
// stores 4 bytes and advances by the symbols it holds, so a row decodes this way while at least
// kLookups * 4 of its symbols are left; single-symbol lookups finish it.
template <int kWays>
void DecodeWaysMulti(const HuffmanCodebook& cb, const uint8_t* bits, const uint32_t* offsets,
                     int64_t row_len, uint8_t* out) {
  constexpr int kLookups = 57 / kHuffmanMultiBits;  // per refill
  constexpr uint64_t kMask = (uint64_t{1} << kHuffmanMultiBits) - 1;
  const uint64_t* table = cb.multi_table.data();
  uint64_t pos[kWays];
  int64_t done[kWays];
  for (int w = 0; w < kWays; ++w) {
    pos[w] = offsets[w];
    done[w] = 0;
  }
  const int64_t last = row_len - kLookups * 4;  // a refill starts at done <= last
  for (;;) {
    bool room = true;
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) room &= done[w] <= last;
    if (!room) break;
    uint64_t buf[kWays];
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) buf[w] = Load64(bits + (pos[w] >> 3)) >> (pos[w] & 7);
#pragma GCC unroll 8
    for (int k = 0; k < kLookups; ++k) {
#pragma GCC unroll 8
      for (int w = 0; w < kWays; ++w) {
        const uint64_t entry = table[buf[w] & kMask];
        const uint32_t symbols = static_cast<uint32_t>(entry);
        std::memcpy(out + w * row_len + done[w], &symbols, 4);
        done[w] += (entry >> 32) & 0xff;
        const uint32_t length = (entry >> 40) & 0xff;
        buf[w] >>= length;
        pos[w] += length;
      }
    }
  }
  for (int w = 0; w < kWays; ++w) {
    bool ok = true;
    kDecoders[cb.max_length - 1](cb.decode_table.data(), bits, pos[w], row_len - done[w],
                                 out + w * row_len + done[w], 0, &ok);
  }
}

}  // namespace

absl::StatusOr<HuffmanCodebook> CodebookFromLengths(uint32_t id, absl::Span<const uint8_t> lengths,
                                                    int max_length) {
  const size_t n = lengths.size();
  if (n == 0 || n > kMaxHuffmanAlphabet) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: alphabet of %d symbols outside [1, %d]", id, n, kMaxHuffmanAlphabet));
  }
  if (max_length < 1 || max_length > kMaxHuffmanCodeLength) {
    return absl::InvalidArgumentError(absl::StrFormat("codebook %d: max_length %d outside [1, %d]",
                                                      id, max_length, kMaxHuffmanCodeLength));
  }
  std::array<int, kMaxHuffmanCodeLength + 1> count{};
  uint64_t kraft = 0;  // in units of 2^-max_length
  for (size_t s = 0; s < n; ++s) {
    if (lengths[s] < 1 || lengths[s] > max_length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("codebook %d: symbol %d has code length %d, outside [1, %d]", id, s,
                          lengths[s], max_length));
    }
    ++count[lengths[s]];
    kraft += uint64_t{1} << (max_length - lengths[s]);
  }
  if (kraft > (uint64_t{1} << max_length)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: code lengths are not a prefix code (Kraft sum %d/%d exceeds 1)", id, kraft,
        uint64_t{1} << max_length));
  }

  HuffmanCodebook cb;
  cb.id = id;
  cb.alphabet_size = static_cast<int>(n);
  cb.max_length = max_length;
  // Canonical codes (DEFLATE's construction): shorter codes first, ties by symbol.
  std::array<uint32_t, kMaxHuffmanCodeLength + 2> next_code{};
  uint32_t code = 0;
  for (int len = 1; len <= max_length; ++len) {
    code = (code + count[len - 1]) << 1;
    next_code[len] = code;
  }
  cb.decode_table.assign(size_t{1} << max_length, 0);
  for (size_t s = 0; s < n; ++s) {
    const int len = lengths[s];
    const uint16_t reversed = ReverseBits(static_cast<uint16_t>(next_code[len]++), len);
    cb.lengths[s] = static_cast<uint8_t>(len);
    cb.codes[s] = reversed;
    const uint16_t entry = static_cast<uint16_t>(s | (len << 8));
    for (size_t hi = 0; hi < (size_t{1} << (max_length - len)); ++hi) {
      cb.decode_table[reversed | (hi << len)] = entry;
    }
  }
  if (max_length <= kHuffmanMultiBits) {
    // Each index: as many whole codes (up to 4) as its kHuffmanMultiBits bits hold. Bit
    // patterns no code starts with (incomplete codes, garbage input) give symbol 0 for one bit,
    // so that decoding always moves on.
    cb.multi_table.resize(size_t{1} << kHuffmanMultiBits);
    for (uint32_t index = 0; index < cb.multi_table.size(); ++index) {
      uint64_t symbols = 0, count = 0;
      int used = 0;
      while (count < 4) {
        const uint16_t e = cb.decode_table[(index >> used) & ((1u << max_length) - 1)];
        const int len = e >> 8;
        if (len == 0 || used + len > kHuffmanMultiBits) break;
        symbols |= static_cast<uint64_t>(e & 0xff) << (8 * count);
        ++count;
        used += len;
      }
      if (count == 0) used = 1;
      cb.multi_table[index] =
          symbols | std::max<uint64_t>(count, 1) << 32 | static_cast<uint64_t>(used) << 40;
    }
  }
  return cb;
}

absl::StatusOr<HuffmanCodebook> BuildHuffmanCodebook(uint32_t id,
                                                     absl::Span<const uint64_t> histogram,
                                                     int max_length) {
  const size_t n = histogram.size();
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d: the histogram is empty; it needs one count per symbol", id));
  }
  if (n > kMaxHuffmanAlphabet) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d: histogram of %d symbols; codes are at most 8-bit (%d)", id, n,
                        kMaxHuffmanAlphabet));
  }
  const int min_length = MinMaxLength(static_cast<int>(n));
  if (max_length < min_length || max_length > kMaxHuffmanCodeLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d: max_length %d outside [%d, %d] for a %d-symbol alphabet", id,
                        max_length, min_length, kMaxHuffmanCodeLength, n));
  }
  if (n == 1) {
    const uint8_t one = 1;
    return CodebookFromLengths(id, absl::MakeConstSpan(&one, 1), max_length);
  }
  // Scale counts below 2^40 so package weights (at most max_length sums of all weights) fit
  // in 64 bits. Unseen symbols weigh 1, seen ones at least 2: every symbol gets a code and an
  // unseen one never gets a shorter code than a seen one.
  const uint64_t max_count = *std::max_element(histogram.begin(), histogram.end());
  int shift = 0;
  while ((max_count >> shift) >= (uint64_t{1} << 40)) ++shift;
  std::vector<uint64_t> weights(n);
  for (size_t s = 0; s < n; ++s) {
    weights[s] = histogram[s] == 0 ? 1 : 2 * std::max<uint64_t>(histogram[s] >> shift, 1);
  }
  const std::vector<uint8_t> lengths = PackageMergeLengths(weights, max_length);
  // The decode table is only as wide as the longest code: small alphabets get small tables and
  // more symbols per refill.
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  return CodebookFromLengths(id, lengths, longest);
}

std::string SerializeCodebook(const HuffmanCodebook& cb) {
  const size_t n = static_cast<size_t>(cb.alphabet_size);
  std::string out(kCodebookHeaderBytes + (n + 1) / 2, '\0');
  out[0] = static_cast<char>(kCodebookWireVersion);
  out[1] = static_cast<char>(cb.max_length);
  const uint16_t alphabet = static_cast<uint16_t>(n);
  std::memcpy(out.data() + 2, &alphabet, sizeof(alphabet));
  std::memcpy(out.data() + 4, &cb.id, sizeof(cb.id));
  for (size_t s = 0; s < n; ++s) {
    out[kCodebookHeaderBytes + s / 2] |= static_cast<char>((cb.lengths[s] & 0xf) << (4 * (s % 2)));
  }
  return out;
}

absl::StatusOr<HuffmanCodebook> ParseCodebook(std::string_view bytes) {
  if (bytes.size() < kCodebookHeaderBytes) {
    return absl::DataLossError(
        absl::StrFormat("Huffman codebook truncated: %d bytes, the header alone takes %d",
                        bytes.size(), kCodebookHeaderBytes));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (p[0] != kCodebookWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Huffman codebook version %d is not supported (this build speaks %d)", p[0],
                        kCodebookWireVersion));
  }
  uint16_t alphabet;
  uint32_t id;
  std::memcpy(&alphabet, p + 2, sizeof(alphabet));
  std::memcpy(&id, p + 4, sizeof(id));
  const int max_length = p[1];
  if (alphabet < 1 || alphabet > kMaxHuffmanAlphabet) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: alphabet of %d symbols outside [1, %d]", id, alphabet, kMaxHuffmanAlphabet));
  }
  if (max_length < 1 || max_length > kMaxHuffmanCodeLength) {
    return absl::InvalidArgumentError(absl::StrFormat("codebook %d: max_length %d outside [1, %d]",
                                                      id, max_length, kMaxHuffmanCodeLength));
  }
  const size_t want = kCodebookHeaderBytes + (alphabet + 1) / 2;
  if (bytes.size() != want) {
    return absl::DataLossError(
        absl::StrFormat("codebook %d: %d bytes, but a %d-symbol codebook takes %d", id,
                        bytes.size(), alphabet, want));
  }
  std::vector<uint8_t> lengths(alphabet);
  for (size_t s = 0; s < alphabet; ++s) {
    lengths[s] = (p[kCodebookHeaderBytes + s / 2] >> (4 * (s % 2))) & 0xf;
  }
  if (alphabet % 2 == 1 && (p[want - 1] >> 4) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d: the pad nibble after the last length is not 0", id));
  }
  return CodebookFromLengths(id, lengths, max_length);
}

uint64_t EncodedBits(const HuffmanCodebook& cb, const uint8_t* symbols, int64_t n) {
  uint64_t bits = 0;
  for (int64_t i = 0; i < n; ++i) bits += cb.lengths[symbols[i]];
  return bits;
}

absl::StatusOr<uint64_t> EncodeRows(const HuffmanCodebook& cb, const uint8_t* symbols, int64_t rows,
                                    int64_t row_len, uint8_t* out, size_t out_capacity_bytes,
                                    uint32_t* row_bit_offsets) {
  if (rows < 0 || row_len < 0 || (row_len > 0 && rows > INT64_MAX / row_len)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d: cannot encode %d rows of %d symbols", cb.id, rows, row_len));
  }
  const int64_t n = rows * row_len;
  // Sizing pass; out-of-alphabet symbols have length 0 and are found by the max.
  uint64_t total_bits = 0;
  uint8_t max_symbol = 0;
  for (int64_t i = 0; i < n; ++i) {
    total_bits += cb.lengths[symbols[i]];
    max_symbol = std::max(max_symbol, symbols[i]);
  }
  if (n > 0 && max_symbol >= cb.alphabet_size) {
    const int64_t at =
        std::find_if(symbols, symbols + n, [&](uint8_t s) { return s >= cb.alphabet_size; }) -
        symbols;
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: symbol %d at row %d, position %d is outside its %d-symbol alphabet", cb.id,
        symbols[at], at / row_len, at % row_len, cb.alphabet_size));
  }
  if (total_bits > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: %d rows encode to %d bits; row offsets are 32-bit, encode fewer rows", cb.id,
        rows, total_bits));
  }
  const size_t data_bytes = (total_bits + 7) / 8;
  const size_t need = data_bytes + HuffmanPaddingBytes();
  if (out_capacity_bytes < need) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "codebook %d: %d rows encode to %d bytes (+%d bytes of decoder padding), the buffer "
        "holds %d",
        cb.id, rows, data_bytes, HuffmanPaddingBytes(), out_capacity_bytes));
  }

  static_assert(7 + 4 * kMaxHuffmanCodeLength <= 64, "four codes must fit the bit writer");
  // Bit writer: `acc` holds `fill` < 8 pending bits after each flush, and four codes of at most
  // 12 bits still fit. A flush stores all 8 bytes of acc at p, so it writes at most 7 bytes past
  // the data, inside the padding checked above.
  uint8_t* p = out;
  uint64_t acc = 0;
  int fill = 0;
  auto put = [&](uint8_t s) {
    acc |= static_cast<uint64_t>(cb.codes[s]) << fill;
    fill += cb.lengths[s];
  };
  auto flush = [&]() {
    std::memcpy(p, &acc, sizeof(acc));
    p += fill >> 3;
    acc >>= fill & ~7;
    fill &= 7;
  };
  for (int64_t r = 0; r < rows; ++r) {
    row_bit_offsets[r] = static_cast<uint32_t>((p - out) * 8 + fill);
    const uint8_t* row = symbols + r * row_len;
    int64_t j = 0;
    for (; j + 4 <= row_len; j += 4) {
      put(row[j]);
      put(row[j + 1]);
      put(row[j + 2]);
      put(row[j + 3]);
      flush();
    }
    for (; j < row_len; ++j) {
      put(row[j]);
      flush();
    }
  }
  row_bit_offsets[rows] = static_cast<uint32_t>(total_bits);
  std::memcpy(p, &acc, sizeof(acc));
  std::memset(out + data_bytes, 0, HuffmanPaddingBytes());
  return total_bits;
}

void DecodeRow(const HuffmanCodebook& cb, const uint8_t* bits, uint64_t bit_offset, int64_t row_len,
               uint8_t* out) {
  bool ok = true;
  kDecoders[cb.max_length - 1](cb.decode_table.data(), bits, bit_offset, row_len, out, 0, &ok);
}

void DecodeRows(const HuffmanCodebook& cb, const uint8_t* bits, const uint32_t* row_bit_offsets,
                int64_t rows, int64_t row_len, uint8_t* out) {
  if (!cb.multi_table.empty()) {
    int64_t r = 0;
    for (; r + kDecodeWays <= rows; r += kDecodeWays) {
      DecodeWaysMulti<kDecodeWays>(cb, bits, row_bit_offsets + r, row_len, out + r * row_len);
    }
    for (; r < rows; ++r)
      DecodeWaysMulti<1>(cb, bits, row_bit_offsets + r, row_len, out + r * row_len);
    return;
  }
  kRowsDecoders[cb.max_length - 1](cb.decode_table.data(), bits, row_bit_offsets, rows, row_len,
                                   out);
}

absl::StatusOr<uint64_t> DecodeRowWithin(const HuffmanCodebook& cb, std::string_view bits,
                                         uint64_t bit_offset, uint64_t bit_limit, int64_t row_len,
                                         uint8_t* out) {
  if (cb.max_length < 1 || cb.max_length > kMaxHuffmanCodeLength ||
      cb.decode_table.size() != (size_t{1} << cb.max_length)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d was not built by BuildHuffmanCodebook or ParseCodebook", cb.id));
  }
  if (row_len < 0 || bit_offset > bit_limit || bit_limit > uint64_t{bits.size()} * 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codebook %d: row of %d symbols at bits [%d, %d) is not inside a %d-byte buffer", cb.id,
        row_len, bit_offset, bit_limit, bits.size()));
  }
  // Every code takes at least one bit.
  if (static_cast<uint64_t>(row_len) > bit_limit - bit_offset) {
    return absl::DataLossError(
        absl::StrFormat("codebook %d: %d symbols cannot fit in the row's %d bits", cb.id, row_len,
                        bit_limit - bit_offset));
  }
  // The decoder reads up to byte bit_limit / 8 + 7. Near the end of `bits`, decode a
  // zero-padded copy of the row instead.
  const auto* data = reinterpret_cast<const uint8_t*>(bits.data());
  uint64_t begin = bit_offset, limit = bit_limit;
  std::vector<uint8_t> copy;
  if ((bit_limit >> 3) + HuffmanPaddingBytes() > bits.size()) {
    const size_t first = bit_offset >> 3;
    copy.assign(bits.size() - first + HuffmanPaddingBytes(), 0);
    std::memcpy(copy.data(), data + first, bits.size() - first);
    data = copy.data();
    begin -= first * 8;
    limit -= first * 8;
  }
  bool ok = true;
  const uint64_t stop = kCheckedDecoders[cb.max_length - 1](cb.decode_table.data(), data, begin,
                                                            row_len, out, limit, &ok);
  if (!ok && stop <= limit) {
    return absl::DataLossError(absl::StrFormat(
        "codebook %d: row at bit %d holds a bit pattern that is no code", cb.id, bit_offset));
  }
  if (stop > limit) {
    return absl::DataLossError(
        absl::StrFormat("codebook %d: row of %d symbols at bit %d should end by bit %d but runs "
                        "past it",
                        cb.id, row_len, bit_offset, bit_limit));
  }
  return stop - begin + bit_offset;
}

absl::Status DecodeRowChecked(const HuffmanCodebook& cb, std::string_view bits, uint64_t bit_offset,
                              uint64_t bit_end, int64_t row_len, uint8_t* out) {
  const absl::StatusOr<uint64_t> stop =
      DecodeRowWithin(cb, bits, bit_offset, bit_end, row_len, out);
  if (!stop.ok()) return stop.status();
  if (*stop != bit_end) {
    return absl::DataLossError(
        absl::StrFormat("codebook %d: row of %d symbols at bit %d should end at bit %d but ends "
                        "at bit %d",
                        cb.id, row_len, bit_offset, bit_end, *stop));
  }
  return absl::OkStatus();
}

double MeanCodeLength(const HuffmanCodebook& cb, absl::Span<const uint64_t> histogram) {
  double count = 0, bits = 0;
  for (size_t s = 0; s < histogram.size(); ++s) {
    if (histogram[s] == 0) continue;
    if (s >= static_cast<size_t>(cb.alphabet_size)) return std::numeric_limits<double>::infinity();
    count += static_cast<double>(histogram[s]);
    bits += static_cast<double>(histogram[s]) * cb.lengths[s];
  }
  return count == 0 ? 0.0 : bits / count;
}

}  // namespace sluice::kernels
