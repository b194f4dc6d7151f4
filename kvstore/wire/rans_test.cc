#include "kvstore/wire/rans.h"

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

// Symbols as the transform codec makes them: rounded Laplacian-like values of a spread.
std::vector<int32_t> Draw(std::mt19937& rng, int64_t n, double spread) {
  std::exponential_distribution<double> e(1.0 / spread);
  std::bernoulli_distribution sign(0.5);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) {
    x = static_cast<int32_t>(std::lround(e(rng))) * (sign(rng) ? 1 : -1);
  }
  return out;
}

RansTable TableOf(const std::vector<int32_t>& symbols) {
  std::map<int32_t, uint64_t> counts;
  for (int32_t s : symbols) ++counts[s];
  const int32_t lo = counts.begin()->first, hi = counts.rbegin()->first;
  std::vector<uint64_t> dense(hi - lo + 1, 0);
  for (auto [s, c] : counts) dense[s - lo] = c;
  auto t = RansTableFromCounts(lo, dense);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

double Entropy(const std::vector<int32_t>& symbols) {
  std::map<int32_t, double> counts;
  for (int32_t s : symbols) ++counts[s];
  double bits = 0;
  for (auto [s, c] : counts) bits -= c * std::log2(c / symbols.size());
  return bits;
}

// Several tables interleaved with raw bits, as the codec interleaves components: the decoder
// gives back every symbol, and the stream is within 1% (plus its state) of the symbols'
// information under their own counts.
TEST(Rans, RoundTripsNearTheEntropy) {
  std::mt19937 rng(std::random_device{}());
  const int64_t n = 20000 + rng() % 1000;
  std::vector<std::vector<int32_t>> runs = {Draw(rng, n, 0.1), Draw(rng, n, 1.0),
                                            Draw(rng, n, 20.0), std::vector<int32_t>(n, 3)};
  std::vector<RansTable> tables;
  double entropy = 0;
  for (const auto& r : runs) {
    tables.push_back(TableOf(r));
    entropy += Entropy(r);
  }
  std::vector<uint32_t> raw(n);
  for (uint32_t& x : raw) x = rng() % 32;
  RansEncoder enc;
  for (int64_t t = n - 1; t >= 0; --t) {
    enc.PutBits(raw[t], 5);
    for (int k = static_cast<int>(runs.size()) - 1; k >= 0; --k) enc.Put(tables[k], runs[k][t]);
  }
  const std::string stream = enc.Finish();
  const double bits = 8.0 * static_cast<double>(stream.size());
  EXPECT_LT(bits, 1.01 * (entropy + 5.0 * n) + 64) << "entropy " << entropy;
  EXPECT_GT(bits, entropy + 5.0 * n - 64);
  auto dec = RansDecoder::Open(stream);
  ASSERT_TRUE(dec.ok());
  for (int64_t t = 0; t < n; ++t) {
    for (size_t k = 0; k < runs.size(); ++k) ASSERT_EQ(dec->Get(tables[k]), runs[k][t]) << t;
    ASSERT_EQ(dec->GetBits(5), raw[t]) << t;
  }
  EXPECT_TRUE(dec->Finish().ok()) << dec->Finish();
  // A table that knows one symbol codes it in no bits.
  RansEncoder one;
  for (int i = 0; i < 1000; ++i) one.Put(tables[3], 3);
  EXPECT_EQ(one.Finish().size(), 4u);
}

// Every frequency the encoder divides by (as a multiply and shift) round-trips: a table of
// kRansMaxSymbols symbols with counts spread over four orders of magnitude, drawn at random.
TEST(Rans, EveryFrequencyRoundTrips) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint64_t> counts(kRansMaxSymbols);
  for (uint64_t& c : counts) c = 1 + static_cast<uint64_t>(std::pow(10.0, (rng() % 4000) / 1000.0));
  auto t = RansTableFromCounts(-7, counts);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> symbols(200000);
  for (int32_t& x : symbols) x = -7 + static_cast<int32_t>(rng() % kRansMaxSymbols);
  RansEncoder enc;
  for (auto it = symbols.rbegin(); it != symbols.rend(); ++it) enc.Put(*t, *it);
  const std::string stream = enc.Finish();
  auto dec = RansDecoder::Open(stream);
  ASSERT_TRUE(dec.ok());
  for (size_t i = 0; i < symbols.size(); ++i) ASSERT_EQ(dec->Get(*t), symbols[i]) << i;
  EXPECT_TRUE(dec->Finish().ok());
}

TEST(Rans, CorruptOrShortStreamsAreReported) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<int32_t> symbols = Draw(rng, 3000, 2.0);
  const RansTable table = TableOf(symbols);
  RansEncoder enc;
  for (auto it = symbols.rbegin(); it != symbols.rend(); ++it) enc.Put(table, *it);
  const std::string stream = enc.Finish();
  const auto decode = [&](std::string_view s) {
    auto d = RansDecoder::Open(s);
    if (!d.ok()) return d.status();
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (d->Get(table) != symbols[i]) return absl::DataLossError("another symbol");
    }
    return d->Finish();
  };
  EXPECT_TRUE(decode(stream).ok());
  EXPECT_EQ(decode(stream.substr(0, 3)).code(), absl::StatusCode::kDataLoss);
  for (size_t len : {size_t{4}, stream.size() / 2, stream.size() - 1}) {
    EXPECT_FALSE(decode(stream.substr(0, len)).ok()) << len;
  }
  EXPECT_FALSE(decode(stream + "x").ok());
  int caught = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string bad = stream;
    bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    caught += !decode(bad).ok();
  }
  EXPECT_EQ(caught, 200);
}

TEST(Rans, TablesKeepEveryCountedSymbolAndRoundTrip) {
  std::mt19937 rng(std::random_device{}());
  // One dominant symbol and many rare ones: each rare one still gets a frequency.
  std::vector<uint64_t> counts(kRansMaxSymbols, 0);
  for (size_t i = 0; i < counts.size(); i += 1 + rng() % 3) counts[i] = 1;
  counts[rng() % counts.size()] = 1'000'000'000;
  auto t = RansTableFromCounts(-500, counts);
  ASSERT_TRUE(t.ok()) << t.status();
  uint32_t sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(t->freq[i] > 0, counts[i] > 0) << i;
    sum += t->freq[i];
  }
  EXPECT_EQ(sum, kRansTotal);
  std::string wire;
  AppendRansTable(*t, wire);
  ByteReader r(wire);
  auto back = ReadRansTable(r, "table");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->lo, -500);
  EXPECT_EQ(back->freq, t->freq);
  EXPECT_EQ(back->slot, t->slot);
  EXPECT_EQ(r.left(), 0u);
  // Refusals.
  EXPECT_FALSE(RansTableFromCounts(0, std::vector<uint64_t>(4, 0)).ok());
  EXPECT_FALSE(RansTableFromCounts(0, std::vector<uint64_t>(kRansMaxSymbols + 1, 1)).ok());
  for (size_t len = 0; len < wire.size(); ++len) {
    ByteReader short_reader(std::string_view(wire).substr(0, len));
    EXPECT_FALSE(ReadRansTable(short_reader, "table").ok()) << len;
  }
  std::string off_sum;
  PutVarint(off_sum, 0);
  PutVarint(off_sum, 2);
  PutVarint(off_sum, 4000);
  PutVarint(off_sum, 95);
  ByteReader off_reader(off_sum);
  auto s = ReadRansTable(off_reader, "class 3's table").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("class 3's table"), std::string::npos) << s;
}

}  // namespace
}  // namespace sluice::kvstore
