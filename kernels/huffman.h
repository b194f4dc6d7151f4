// Length-limited canonical Huffman coding of quantized KV codes (KVComp §3): one codebook per
// layer, built on the host from a prefill histogram, shipped with pages, and used to encode
// rows (a head_dim vector each) independently so that any row decodes alone from its offset.
//
// Bit order: LSB-first, as in DEFLATE and zstd. Bit i of a stream is bit (i % 8) of byte
// i / 8, and a code's first bit is the lowest unwritten bit. `HuffmanCodebook::codes` holds the
// canonical codes bit-reversed accordingly, so that `bits |= codes[s] << n` appends symbol s.
// A decoder loads 8 bytes little-endian at byte pos / 8, shifts right by pos % 8, and looks the
// low `max_length` bits up in `decode_table`.
//
// Padding: decoders read whole 8-byte words, up to 7 bytes past the last byte a row uses.
// Every buffer handed to DecodeRow must therefore stay readable for HuffmanPaddingBytes()
// bytes past the last encoded byte; EncodeRows requires that room in its output and
// zero-fills it, so encoded bytes are deterministic.
#ifndef SLUICE_KERNELS_HUFFMAN_H_
#define SLUICE_KERNELS_HUFFMAN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::kernels {

// Longest code any codebook may use; the decode table has 1 << max_length entries (8 KiB).
inline constexpr int kMaxHuffmanCodeLength = 12;
// Largest alphabet: 8-bit quantization codes.
inline constexpr int kMaxHuffmanAlphabet = 256;

// Made by BuildHuffmanCodebook, CodebookFromLengths or ParseCodebook. Everything but `id`
// derives from `lengths`; do not edit the fields by hand.
struct HuffmanCodebook {
  uint32_t id = 0;
  int alphabet_size = 0;  // symbols are 0 .. alphabet_size - 1
  int max_length = 0;     // decode table width in bits; every length is <= max_length
  // Code length of each symbol in [1, max_length]; 0 for symbols outside the alphabet.
  std::array<uint8_t, kMaxHuffmanAlphabet> lengths{};
  // Canonical code of each symbol, bit-reversed for LSB-first packing (see above).
  std::array<uint16_t, kMaxHuffmanAlphabet> codes{};
  // [1 << max_length]: entry = symbol | length << 8 for the code found in the low bits of the
  // index. Entry 0 (length 0) marks bit patterns no code starts with (incomplete codes only).
  std::vector<uint16_t> decode_table;
  // Codebooks whose codes are all at most kHuffmanMultiBits long also decode several symbols
  // per lookup: [1 << kHuffmanMultiBits] entries, entry = up to 4 symbols (bytes 0..3), how many
  // (byte 4, at least 1) and the bits they take (byte 5), for the codes found in the low bits
  // of the index. Empty otherwise.
  std::vector<uint64_t> multi_table;
};

// Width of HuffmanCodebook::multi_table's index.
inline constexpr int kHuffmanMultiBits = 10;

// Builds a canonical code whose lengths minimize the encoded size of `histogram` under the
// length limit (package-merge). histogram[s] counts symbol s; its size is the alphabet size,
// 1..256. Symbols with a zero count still get a code (codes unseen in prefill can appear in
// decode), none shorter than a seen symbol's. With two or more symbols the code is
// complete (Kraft sum 1); a one-symbol alphabet gets the 1-bit code "0". The codebook's
// max_length (its decode table's width) is its longest code, which may be below the limit.
// InvalidArgument for an empty or oversized histogram, or max_length outside
// [ceil(log2(alphabet_size)), kMaxHuffmanCodeLength].
absl::StatusOr<HuffmanCodebook> BuildHuffmanCodebook(uint32_t id,
                                                     absl::Span<const uint64_t> histogram,
                                                     int max_length = kMaxHuffmanCodeLength);

// The canonical codebook with the given code lengths (one per symbol, 1..max_length, Kraft sum
// <= 1). InvalidArgument naming the first violation otherwise.
absl::StatusOr<HuffmanCodebook> CodebookFromLengths(uint32_t id, absl::Span<const uint8_t> lengths,
                                                    int max_length);

// Wire form, little-endian, 8 + ceil(alphabet_size / 2) bytes:
//   offset  field          type  meaning
//        0  version        u8    1
//        1  max_length     u8    1..kMaxHuffmanCodeLength
//        2  alphabet_size  u16   1..256
//        4  id             u32
//        8  lengths        u4[]  one nibble per symbol, low nibble first; a trailing pad nibble
//                                for odd alphabets is 0
// Canonical codes are rebuilt from the lengths.
std::string SerializeCodebook(const HuffmanCodebook& codebook);

// Never crashes on any input. DataLoss for truncated or overlong input, InvalidArgument for
// fields out of range (version, alphabet size, max_length, a length of 0 or above max_length,
// lengths whose Kraft sum exceeds 1); messages name the field.
absl::StatusOr<HuffmanCodebook> ParseCodebook(std::string_view bytes);

// Readable bytes a decoder may touch past the last encoded byte, and the room EncodeRows
// needs (and zero-fills) after its output.
constexpr size_t HuffmanPaddingBytes() { return 8; }

// Encoded size of n symbols; symbols outside the alphabet count 0 bits (EncodeRows rejects
// them).
uint64_t EncodedBits(const HuffmanCodebook& codebook, const uint8_t* symbols, int64_t n);

// Encodes `rows` rows of `row_len` symbols back to back, from bit 0 of `out`, and writes each
// row's starting bit to row_bit_offsets[r] and the end to row_bit_offsets[rows]. Returns the
// total bits. out_capacity_bytes must be at least ceil(bits / 8) + HuffmanPaddingBytes();
// otherwise ResourceExhausted, and nothing is written. InvalidArgument for a symbol outside the
// alphabet, negative sizes, or more than 2^32 - 1 bits (offsets are 32-bit).
absl::StatusOr<uint64_t> EncodeRows(const HuffmanCodebook& codebook,
                                    const uint8_t* symbols,  // [rows, row_len]
                                    int64_t rows, int64_t row_len,
                                    uint8_t* out,  // [out_capacity_bytes]
                                    size_t out_capacity_bytes,
                                    uint32_t* row_bit_offsets);  // [rows + 1]

// Decodes row_len symbols starting at bit_offset of `bits`. Hot path for trusted data (made by
// EncodeRows here, or checked once): table-driven, no per-symbol branches, no checks; garbage
// in gives garbage symbols, never reads past bit_offset / 8 + row_len * max_length / 8 + 8.
// `bits` must be readable HuffmanPaddingBytes() past the row's last byte.
void DecodeRow(const HuffmanCodebook& codebook, const uint8_t* bits, uint64_t bit_offset,
               int64_t row_len,
               uint8_t* out);  // [row_len]

// DecodeRow on rows r = 0 .. rows - 1 starting at row_bit_offsets[r]. Decodes 4 rows in
// lockstep so that their table lookups overlap: about 3x DecodeRow's symbols per second, and
// several times that again for codebooks with a multi_table (up to 4 symbols per lookup).
void DecodeRows(const HuffmanCodebook& codebook, const uint8_t* bits,
                const uint32_t* row_bit_offsets,  // [rows]
                int64_t rows, int64_t row_len,
                uint8_t* out);  // [rows, row_len]

// DecodeRow for untrusted data: reads only inside `bits` (no padding needed) and returns
// DataLoss unless the row's row_len codes are valid and end exactly at bit_end.
// InvalidArgument for offsets outside `bits` or a negative row_len. `out` may be partly
// written on error.
absl::Status DecodeRowChecked(const HuffmanCodebook& codebook, std::string_view bits,
                              uint64_t bit_offset, uint64_t bit_end, int64_t row_len,
                              uint8_t* out);  // [row_len]
// DecodeRowChecked for a row known only to end by `bit_limit` (one padded to a byte boundary):
// returns the bit after its last code. DataLoss unless its row_len codes are valid and end by
// bit_limit; InvalidArgument as DecodeRowChecked.
absl::StatusOr<uint64_t> DecodeRowWithin(const HuffmanCodebook& codebook, std::string_view bits,
                                         uint64_t bit_offset, uint64_t bit_limit, int64_t row_len,
                                         uint8_t* out);  // [row_len]

// Bits per symbol the codebook spends on data with this histogram (indexed by symbol); 0 for
// an empty histogram, +infinity if a counted symbol has no code.
double MeanCodeLength(const HuffmanCodebook& codebook, absl::Span<const uint64_t> histogram);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_HUFFMAN_H_
