// Static rANS (range asymmetric numeral systems, Duda 2013) entropy coding with a 32-bit state
// and byte-wise renormalisation, the form of Giesen's ryg_rans: symbols cost their information
// (-log2 p) to within a fraction of a percent, where a Huffman code costs at least one bit each
// (the transform codec's low-rate components carry well under one bit of information a symbol).
//
// A table gives a run of symbols [lo, lo + freq.size()) frequencies summing to 2^kRansScaleBits;
// only symbols with a frequency can be coded. The encoder takes symbols in the reverse of the
// order the decoder gives them back; uniform values of 1..kRansScaleBits bits ride in the same
// stream at exactly their width. The decoder ends where the encoder started: a stream decoded
// with other tables or lengths, or corrupted, ends elsewhere, which Finish reports.
#ifndef SLUICE_KVSTORE_WIRE_RANS_H_
#define SLUICE_KVSTORE_WIRE_RANS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvstore/wire/byte_io.h"

namespace sluice::kvstore {

inline constexpr int kRansScaleBits = 12;
inline constexpr uint32_t kRansTotal = uint32_t{1} << kRansScaleBits;
// Symbols a table may span: every one with a count gets a frequency of at least 1.
inline constexpr int kRansMaxSymbols = 1024;

struct RansTable {
  int32_t lo = 0;               // the first symbol
  std::vector<uint16_t> freq;   // [symbols]: sums to kRansTotal
  std::vector<uint16_t> start;  // [symbols]: cumulative frequency before each
  std::vector<uint16_t> slot;   // [kRansTotal]: the symbol index of each cumulative position
  // The encoder's division by each frequency, as a multiply and shift (Giesen's form).
  struct Divide {
    uint32_t limit = 0;  // the state renormalises below this
    uint32_t rcp = 0;    // reciprocal of the frequency, 2^(32 + shift) / freq rounded up
    uint32_t bias = 0;   // start (or, for frequency 1, start + total - 1)
    uint16_t cmpl = 0;   // total - freq
    uint16_t shift = 0;
  };
  std::vector<Divide> divide;  // [symbols]
};

// A table for symbols [lo, lo + counts.size()) from their counts: frequencies in proportion,
// every counted symbol at least 1. InvalidArgument for no counts or more than kRansMaxSymbols
// symbols.
absl::StatusOr<RansTable> RansTableFromCounts(int32_t lo, absl::Span<const uint64_t> counts);
// Wire form: lo (zigzag varint), symbols (varint), each frequency (varint).
void AppendRansTable(const RansTable& table, std::string& out);
// InvalidArgument/DataLoss naming what is wrong; `what` starts each message.
absl::StatusOr<RansTable> ReadRansTable(ByteReader& r, std::string_view what);

class RansEncoder {
 public:
  RansEncoder();
  // Symbols in the reverse of decoding order. `symbol` must have a frequency in `table`.
  void Put(const RansTable& table, int32_t symbol);
  // A uniform value of `bits` (1..kRansScaleBits) bits.
  void PutBits(uint32_t value, int bits);
  // The stream, in decoding order; the encoder starts over.
  std::string Finish();

 private:
  uint32_t state_;
  std::string reversed_;  // bytes in the order written, the reverse of reading
};

class RansDecoder {
 public:
  // DataLoss for a stream shorter than its 4-byte state.
  static absl::StatusOr<RansDecoder> Open(std::string_view stream);
  // The next symbol under `table`.
  int32_t Get(const RansTable& table);
  uint32_t GetBits(int bits);
  // DataLoss unless every byte was read and the state is where encoding began.
  absl::Status Finish() const;

 private:
  explicit RansDecoder(std::string_view s) : stream_(s) {}
  void Renormalize();

  std::string_view stream_;
  size_t pos_ = 0;
  uint32_t state_ = 0;
  bool overrun_ = false;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_RANS_H_
