#include "kvstore/wire/rans.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_format.h"

namespace sluice::kvstore {
namespace {

// The state stays in [kLow, kLow << 8) between symbols: a byte leaves or enters at a time.
constexpr uint32_t kLow = uint32_t{1} << 23;
constexpr uint32_t kMask = kRansTotal - 1;

uint32_t ZigZag(int32_t x) {
  return (static_cast<uint32_t>(x) << 1) ^ static_cast<uint32_t>(x >> 31);
}
int32_t UnZigZag(uint32_t x) { return static_cast<int32_t>(x >> 1) ^ -static_cast<int32_t>(x & 1); }

// x / freq as ((x * rcp) >> 32) >> shift, exact for every state below 2^31 (Giesen, "Arithmetic
// coding without division"); a frequency of 1 divides by nothing.
RansTable::Divide DivideBy(uint32_t start, uint32_t freq) {
  RansTable::Divide d;
  d.limit = ((kLow >> kRansScaleBits) << 8) * freq;
  d.cmpl = static_cast<uint16_t>(kRansTotal - freq);
  if (freq < 2) {
    d.rcp = ~0u;
    d.shift = 0;
    d.bias = start + kRansTotal - 1;
  } else {
    uint32_t shift = 0;
    while (freq > (1u << shift)) ++shift;
    d.rcp = static_cast<uint32_t>(((uint64_t{1} << (shift + 31)) + freq - 1) / freq);
    d.shift = static_cast<uint16_t>(shift - 1);
    d.bias = start;
  }
  return d;
}

void BuildSlots(RansTable& t) {
  t.start.resize(t.freq.size());
  t.divide.resize(t.freq.size());
  t.slot.assign(kRansTotal, 0);
  uint32_t at = 0;
  for (size_t i = 0; i < t.freq.size(); ++i) {
    t.start[i] = static_cast<uint16_t>(at);
    if (t.freq[i] > 0) t.divide[i] = DivideBy(at, t.freq[i]);
    std::fill_n(t.slot.begin() + at, t.freq[i], static_cast<uint16_t>(i));
    at += t.freq[i];
  }
}

}  // namespace

absl::StatusOr<RansTable> RansTableFromCounts(int32_t lo, absl::Span<const uint64_t> counts) {
  const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
  if (total == 0) return absl::InvalidArgumentError("a rANS table needs at least one count");
  if (counts.size() > static_cast<size_t>(kRansMaxSymbols)) {
    return absl::InvalidArgumentError(absl::StrFormat("a rANS table spans %d symbols, more than %d",
                                                      counts.size(), kRansMaxSymbols));
  }
  RansTable t;
  t.lo = lo;
  t.freq.resize(counts.size());
  int64_t sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const double share = static_cast<double>(counts[i]) * kRansTotal / static_cast<double>(total);
    t.freq[i] = static_cast<uint16_t>(std::max<int64_t>(1, std::llround(share)));
    sum += t.freq[i];
  }
  // Rounding leaves the sum off by a little: the most frequent symbols give or take it, none
  // below 1 (at most kRansMaxSymbols symbols hold 1 each, well under the total).
  std::vector<size_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.freq[a] > t.freq[b]; });
  while (sum != kRansTotal) {
    for (size_t i : order) {
      if (sum == kRansTotal) break;
      if (sum > kRansTotal && t.freq[i] > 1) {
        --t.freq[i];
        --sum;
      } else if (sum < kRansTotal && t.freq[i] > 0) {
        ++t.freq[i];
        ++sum;
      }
    }
  }
  BuildSlots(t);
  return t;
}

void AppendRansTable(const RansTable& t, std::string& out) {
  PutVarint(out, ZigZag(t.lo));
  PutVarint(out, static_cast<uint32_t>(t.freq.size()));
  for (uint16_t f : t.freq) PutVarint(out, f);
}

absl::StatusOr<RansTable> ReadRansTable(ByteReader& r, std::string_view what) {
  uint32_t lo = 0, symbols = 0;
  if (!r.TakeVarint(&lo) || !r.TakeVarint(&symbols)) {
    return absl::DataLossError(absl::StrFormat("%s: truncated in its first symbol or count", what));
  }
  if (symbols < 1 || symbols > static_cast<uint32_t>(kRansMaxSymbols)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d symbols, not 1 to %d", what, symbols, kRansMaxSymbols));
  }
  RansTable t;
  t.lo = UnZigZag(lo);
  t.freq.resize(symbols);
  uint32_t sum = 0;
  for (uint32_t i = 0; i < symbols; ++i) {
    uint32_t f = 0;
    if (!r.TakeVarint(&f)) {
      return absl::DataLossError(absl::StrFormat("%s: truncated in frequency %d", what, i));
    }
    if (f > kRansTotal - sum) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: frequencies exceed %d at symbol %d", what, kRansTotal, i));
    }
    t.freq[i] = static_cast<uint16_t>(f);
    sum += f;
  }
  if (sum != kRansTotal) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: frequencies sum to %d, not %d", what, sum, kRansTotal));
  }
  BuildSlots(t);
  return t;
}

RansEncoder::RansEncoder() : state_(kLow) {}

void RansEncoder::Put(const RansTable& t, int32_t symbol) {
  const RansTable::Divide& d = t.divide[static_cast<size_t>(symbol - t.lo)];
  uint32_t x = state_;
  while (x >= d.limit) {
    reversed_.push_back(static_cast<char>(x & 0xff));
    x >>= 8;
  }
  // x + start + (x / freq) * (total - freq) = ((x / freq) << scale) + x % freq + start.
  const uint32_t q = static_cast<uint32_t>((static_cast<uint64_t>(x) * d.rcp) >> 32) >> d.shift;
  state_ = x + d.bias + q * d.cmpl;
}

void RansEncoder::PutBits(uint32_t value, int bits) {
  // A frequency of 2^(scale - bits): the division is a shift.
  const int freq_bits = kRansScaleBits - bits;
  const uint32_t limit = ((kLow >> kRansScaleBits) << 8) << freq_bits;
  uint32_t x = state_;
  while (x >= limit) {
    reversed_.push_back(static_cast<char>(x & 0xff));
    x >>= 8;
  }
  state_ =
      ((x >> freq_bits) << kRansScaleBits) + (x & ((1u << freq_bits) - 1)) + (value << freq_bits);
}

std::string RansEncoder::Finish() {
  for (int shift = 24; shift >= 0; shift -= 8) {
    reversed_.push_back(static_cast<char>((state_ >> shift) & 0xff));
  }
  std::string out(reversed_.rbegin(), reversed_.rend());
  reversed_.clear();
  state_ = kLow;
  return out;
}

absl::StatusOr<RansDecoder> RansDecoder::Open(std::string_view stream) {
  if (stream.size() < 4) {
    return absl::DataLossError(
        absl::StrFormat("a rANS stream of %d bytes, shorter than its state", stream.size()));
  }
  RansDecoder d(stream);
  for (int i = 0; i < 4; ++i) {
    d.state_ |= static_cast<uint32_t>(static_cast<uint8_t>(stream[i])) << (8 * i);
  }
  d.pos_ = 4;
  return d;
}

void RansDecoder::Renormalize() {
  while (state_ < kLow) {
    if (pos_ == stream_.size()) {
      // Nothing left to read: the stream is short (or corrupt); Finish says so.
      overrun_ = true;
      state_ = kLow;
      return;
    }
    state_ = (state_ << 8) | static_cast<uint8_t>(stream_[pos_++]);
  }
}

int32_t RansDecoder::Get(const RansTable& t) {
  const uint32_t i = t.slot[state_ & kMask];
  state_ = t.freq[i] * (state_ >> kRansScaleBits) + (state_ & kMask) - t.start[i];
  Renormalize();
  return t.lo + static_cast<int32_t>(i);
}

uint32_t RansDecoder::GetBits(int bits) {
  const uint32_t freq = kRansTotal >> bits;
  const uint32_t value = (state_ & kMask) / freq;
  state_ = freq * (state_ >> kRansScaleBits) + (state_ & kMask) - value * freq;
  Renormalize();
  return value;
}

absl::Status RansDecoder::Finish() const {
  if (overrun_) return absl::DataLossError("the rANS stream ended before its symbols did");
  if (pos_ != stream_.size()) {
    return absl::DataLossError(absl::StrFormat("the rANS stream has %d bytes after its last symbol",
                                               stream_.size() - pos_));
  }
  if (state_ != kLow) {
    return absl::DataLossError(
        "the rANS stream does not end where it began (corrupt, or read "
        "with other tables)");
  }
  return absl::OkStatus();
}

}  // namespace sluice::kvstore
