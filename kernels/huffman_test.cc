// Huffman coding of quantization codes: round trips on skewed random data, the length limit,
// canonical codes, compression near the entropy, the codebook wire form against malformed
// input, and the encoder's and checked decoder's errors.
#include "kernels/huffman.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

using ::testing::HasSubstr;

constexpr uint8_t kGuard = 0xA5;

// A fresh seed per run, printed on failure; SLUICE_TEST_SEED=<n> replays one.
uint64_t TestSeed() {
  if (const char* env = std::getenv("SLUICE_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

// Quantization codes of Gaussian-ish values: most mass near the middle code.
std::vector<uint8_t> GaussianCodes(int alphabet, double sigma, size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal((alphabet - 1) / 2.0, sigma);
  std::vector<uint8_t> out(n);
  for (uint8_t& s : out) {
    s = static_cast<uint8_t>(std::clamp<double>(std::round(normal(rng)), 0, alphabet - 1));
  }
  return out;
}

std::vector<uint64_t> Histogram(int alphabet, const std::vector<uint8_t>& symbols) {
  std::vector<uint64_t> h(alphabet, 0);
  for (uint8_t s : symbols) ++h[s];
  return h;
}

double Entropy(const std::vector<uint64_t>& h) {
  const double total = std::accumulate(h.begin(), h.end(), 0.0);
  double bits = 0;
  for (uint64_t c : h) {
    if (c != 0) bits -= c / total * std::log2(c / total);
  }
  return bits;
}

// Kraft sum in units of 2^-max_length.
uint64_t KraftSum(const HuffmanCodebook& cb) {
  uint64_t sum = 0;
  for (int s = 0; s < cb.alphabet_size; ++s) sum += uint64_t{1} << (cb.max_length - cb.lengths[s]);
  return sum;
}

uint16_t Reverse(uint16_t code, int length) {
  uint16_t out = 0;
  for (int i = 0; i < length; ++i) out |= ((code >> i) & 1) << (length - 1 - i);
  return out;
}

// Unlimited Huffman code lengths by the textbook merge of the two lightest trees.
std::vector<int> ReferenceHuffmanLengths(const std::vector<uint64_t>& weights) {
  struct Tree {
    uint64_t weight;
    std::vector<int> symbols;
  };
  auto heavier = [](const Tree& a, const Tree& b) { return a.weight > b.weight; };
  std::priority_queue<Tree, std::vector<Tree>, decltype(heavier)> heap(heavier);
  for (size_t s = 0; s < weights.size(); ++s) heap.push({weights[s], {static_cast<int>(s)}});
  std::vector<int> lengths(weights.size(), 0);
  while (heap.size() > 1) {
    Tree a = heap.top();
    heap.pop();
    Tree b = heap.top();
    heap.pop();
    for (int s : a.symbols) ++lengths[s];
    for (int s : b.symbols) ++lengths[s];
    a.symbols.insert(a.symbols.end(), b.symbols.begin(), b.symbols.end());
    heap.push({a.weight + b.weight, std::move(a.symbols)});
  }
  return lengths;
}

struct Encoded {
  std::vector<uint8_t> bytes;  // data, padding, then guard bytes
  std::vector<uint32_t> offsets;
  uint64_t bits = 0;
};

Encoded EncodeOrDie(const HuffmanCodebook& cb, const std::vector<uint8_t>& symbols, int64_t rows,
                    int64_t row_len) {
  Encoded e;
  const uint64_t bits = EncodedBits(cb, symbols.data(), rows * row_len);
  const size_t capacity = (bits + 7) / 8 + HuffmanPaddingBytes();
  e.bytes.assign(capacity + 16, kGuard);
  e.offsets.assign(rows + 1, 0xdeadbeef);
  auto total =
      EncodeRows(cb, symbols.data(), rows, row_len, e.bytes.data(), capacity, e.offsets.data());
  EXPECT_TRUE(total.ok()) << total.status();
  if (!total.ok()) return e;
  EXPECT_EQ(*total, bits);
  e.bits = *total;
  for (size_t i = (bits + 7) / 8; i < capacity; ++i) {
    EXPECT_EQ(e.bytes[i], 0) << "padding byte " << i << " not zero-filled";
  }
  for (size_t i = capacity; i < e.bytes.size(); ++i) {
    EXPECT_EQ(e.bytes[i], kGuard) << "EncodeRows wrote past its capacity at byte " << i;
  }
  if ((bits % 8) != 0) {
    EXPECT_EQ(e.bytes[bits / 8] >> (bits % 8), 0) << "bits after the data are not zero";
  }
  return e;
}

// Encodes, then decodes every row with both decoders and compares; guard bytes after each
// decoded row must survive.
void ExpectRoundTrip(const HuffmanCodebook& cb, const std::vector<uint8_t>& symbols, int64_t rows,
                     int64_t row_len) {
  SCOPED_TRACE(testing::Message() << "alphabet " << cb.alphabet_size << ", max_length "
                                  << cb.max_length << ", " << rows << " rows of " << row_len);
  const Encoded e = EncodeOrDie(cb, symbols, rows, row_len);
  ASSERT_EQ(e.offsets[0], 0u);
  ASSERT_EQ(e.offsets[rows], e.bits);
  const std::string_view data(reinterpret_cast<const char*>(e.bytes.data()), (e.bits + 7) / 8);
  std::vector<uint8_t> all(rows * row_len + 8, kGuard);
  DecodeRows(cb, e.bytes.data(), e.offsets.data(), rows, row_len, all.data());
  ASSERT_TRUE(std::equal(symbols.begin(), symbols.end(), all.begin())) << "DecodeRows";
  ASSERT_TRUE(
      std::all_of(all.begin() + rows * row_len, all.end(), [](uint8_t b) { return b == kGuard; }));

  std::vector<uint8_t> out(row_len + 8);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* want = symbols.data() + r * row_len;
    ASSERT_EQ(e.offsets[r + 1] - e.offsets[r], EncodedBits(cb, want, row_len)) << "row " << r;

    std::fill(out.begin(), out.end(), kGuard);
    DecodeRow(cb, e.bytes.data(), e.offsets[r], row_len, out.data());
    ASSERT_TRUE(std::equal(want, want + row_len, out.begin())) << "DecodeRow, row " << r;
    ASSERT_TRUE(
        std::all_of(out.begin() + row_len, out.end(), [](uint8_t b) { return b == kGuard; }));

    std::fill(out.begin(), out.end(), kGuard);
    // Unpadded view: the checked decoder must not need the slack.
    const absl::Status st =
        DecodeRowChecked(cb, data, e.offsets[r], e.offsets[r + 1], row_len, out.data());
    ASSERT_TRUE(st.ok()) << "row " << r << ": " << st;
    ASSERT_TRUE(std::equal(want, want + row_len, out.begin())) << "DecodeRowChecked, row " << r;
    ASSERT_TRUE(
        std::all_of(out.begin() + row_len, out.end(), [](uint8_t b) { return b == kGuard; }));
  }
}

TEST(Huffman, RoundTripsSkewedCodesWithRaggedRows) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  for (int alphabet : {4, 16, 256}) {
    for (double sigma_fraction : {0.05, 0.15, 0.4}) {
      const double sigma = std::max(0.3, sigma_fraction * alphabet);
      // The codebook comes from a "prefill" sample; the encoded rows are a fresh "decode"
      // sample, with every symbol of the alphabet sprinkled in, seen in prefill or not.
      const auto prefill = GaussianCodes(alphabet, sigma, 4096, rng);
      for (int max_length :
           {kMaxHuffmanCodeLength, std::max(2, static_cast<int>(std::log2(alphabet)) + 1)}) {
        auto cb = BuildHuffmanCodebook(7, Histogram(alphabet, prefill), max_length);
        ASSERT_TRUE(cb.ok()) << cb.status();
        for (int64_t row_len : {1, 2, 63, 64, 127, 128}) {
          const int64_t rows = 1 + rng() % 40;
          auto symbols = GaussianCodes(alphabet, sigma, rows * row_len, rng);
          for (int s = 0; s < alphabet; ++s) symbols[rng() % symbols.size()] = s;
          ExpectRoundTrip(*cb, symbols, rows, row_len);
        }
      }
    }
  }
}

TEST(Huffman, EveryTableWidthRoundTrips) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  for (int max_length = 1; max_length <= kMaxHuffmanCodeLength; ++max_length) {
    const int alphabet = std::min(256, 1 << max_length);
    std::vector<uint64_t> h(alphabet);
    for (uint64_t& c : h) c = rng() % 1000;
    auto cb = BuildHuffmanCodebook(1, h, max_length);
    ASSERT_TRUE(cb.ok()) << cb.status();
    const int64_t rows = 9, row_len = 1 + rng() % 200;
    std::vector<uint8_t> symbols(rows * row_len);
    for (uint8_t& s : symbols) s = rng() % alphabet;
    ExpectRoundTrip(*cb, symbols, rows, row_len);
  }
}

// Short codes decode several at a time: codebooks whose codes fit kHuffmanMultiBits get a
// multi-symbol table (the round trips above run through it), wider ones do not.
TEST(Huffman, MultiSymbolTableOnlyForShortCodes) {
  std::vector<uint64_t> geometric(8);
  for (size_t s = 0; s < geometric.size(); ++s) geometric[s] = uint64_t{1} << (20 - 2 * s);
  auto narrow = BuildHuffmanCodebook(1, geometric);
  ASSERT_TRUE(narrow.ok());
  EXPECT_EQ(narrow->max_length, 7);  // the longest code, not the limit of 12
  ASSERT_EQ(narrow->multi_table.size(), size_t{1} << kHuffmanMultiBits);
  // Index 0 is the most frequent symbol's 1-bit code "0" four times over.
  EXPECT_EQ(narrow->multi_table[0], uint64_t{0} | uint64_t{4} << 32 | uint64_t{4} << 40);
  std::vector<uint64_t> skewed(256, 1);  // halving counts: codes up to the limit of 12
  for (int sym = 0; sym < 40; ++sym) skewed[sym] = uint64_t{1} << (40 - sym);
  auto wide = BuildHuffmanCodebook(2, skewed);
  ASSERT_TRUE(wide.ok());
  EXPECT_GT(wide->max_length, kHuffmanMultiBits);
  EXPECT_TRUE(wide->multi_table.empty());
}

TEST(Huffman, OneSymbolAlphabetsAndHistograms) {
  auto one = BuildHuffmanCodebook(3, std::vector<uint64_t>{5});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->alphabet_size, 1);
  EXPECT_EQ(one->lengths[0], 1);
  ExpectRoundTrip(*one, std::vector<uint8_t>(3 * 64, 0), 3, 64);
  // An incomplete code: the pattern "1" decodes to nothing.
  const std::string ones(16, '\xff');
  uint8_t out[4];
  EXPECT_EQ(DecodeRowChecked(*one, ones, 0, 4, 4, out).code(), absl::StatusCode::kDataLoss);

  // Only one code seen in prefill: it gets the shortest code, and the rest stay encodable.
  std::vector<uint64_t> h(16, 0);
  h[9] = 1000000;
  auto skewed = BuildHuffmanCodebook(4, h);
  ASSERT_TRUE(skewed.ok()) << skewed.status();
  EXPECT_EQ(skewed->lengths[9], 1);
  EXPECT_EQ(KraftSum(*skewed), uint64_t{1} << skewed->max_length);
  std::vector<uint8_t> symbols(4 * 32, 9);
  for (int s = 0; s < 16; ++s) symbols[s * 7] = s;
  ExpectRoundTrip(*skewed, symbols, 4, 32);
}

TEST(Huffman, UnseenSymbolsGetNoShorterCodesThanSeenOnes) {
  std::vector<uint64_t> h(256, 0);
  for (int s = 100; s < 156; ++s) h[s] = 1 + (s % 3);
  auto cb = BuildHuffmanCodebook(1, h);
  ASSERT_TRUE(cb.ok()) << cb.status();
  int longest_seen = 0, shortest_unseen = 99;
  for (int s = 0; s < 256; ++s) {
    ASSERT_GE(cb->lengths[s], 1) << "symbol " << s;
    if (h[s] != 0) longest_seen = std::max<int>(longest_seen, cb->lengths[s]);
    if (h[s] == 0) shortest_unseen = std::min<int>(shortest_unseen, cb->lengths[s]);
  }
  EXPECT_LE(longest_seen, shortest_unseen);
}

TEST(Huffman, LengthLimitHoldsOnFibonacciCounts) {
  // Fibonacci counts make unlimited Huffman codes as deep as the alphabet is large.
  for (int alphabet : {16, 32, 64}) {
    std::vector<uint64_t> h(alphabet);
    h[0] = h[1] = 1;
    for (int s = 2; s < alphabet; ++s) h[s] = h[s - 1] + h[s - 2];
    const std::vector<int> unlimited = ReferenceHuffmanLengths(h);
    ASSERT_GT(*std::max_element(unlimited.begin(), unlimited.end()), kMaxHuffmanCodeLength);
    const int min_length = static_cast<int>(std::ceil(std::log2(alphabet)));
    for (int limit : {kMaxHuffmanCodeLength, 9, min_length}) {
      SCOPED_TRACE(testing::Message() << "alphabet " << alphabet << ", limit " << limit);
      auto cb = BuildHuffmanCodebook(2, h, limit);
      ASSERT_TRUE(cb.ok()) << cb.status();
      EXPECT_EQ(*std::max_element(cb->lengths.begin(), cb->lengths.end()), limit);
      EXPECT_EQ(KraftSum(*cb), uint64_t{1} << limit);
      if (limit == min_length && alphabet == (1 << limit)) {
        EXPECT_TRUE(std::all_of(cb->lengths.begin(), cb->lengths.begin() + alphabet,
                                [&](uint8_t l) { return l == limit; }));
      }
      // The most frequent symbols keep the shortest codes.
      for (int s = 1; s < alphabet; ++s) EXPECT_LE(cb->lengths[s], cb->lengths[s - 1]);
      std::vector<uint8_t> symbols(5 * 127);
      for (size_t i = 0; i < symbols.size(); ++i) symbols[i] = (i * 37) % alphabet;
      ExpectRoundTrip(*cb, symbols, 5, 127);
    }
  }
}

TEST(Huffman, LengthsAreOptimal) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  int limit_binding = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int alphabet = 2 + rng() % 60;
    std::vector<uint64_t> h(alphabet);
    // Log-uniform counts in [1, 2^20]: sometimes deeper than 12 bits without a limit.
    for (uint64_t& c : h) c = 1 + (rng() >> (44 + rng() % 20));
    auto cb = BuildHuffmanCodebook(0, h);
    ASSERT_TRUE(cb.ok()) << cb.status();
    const std::vector<int> ref = ReferenceHuffmanLengths(h);
    uint64_t cost = 0, ref_cost = 0;
    for (int s = 0; s < alphabet; ++s) {
      cost += h[s] * cb->lengths[s];
      ref_cost += h[s] * ref[s];
    }
    if (*std::max_element(ref.begin(), ref.end()) <= kMaxHuffmanCodeLength) {
      EXPECT_EQ(cost, ref_cost) << "trial " << trial;
    } else {
      ++limit_binding;
      EXPECT_GE(cost, ref_cost) << "trial " << trial;
      EXPECT_LT(cost, ref_cost + ref_cost / 10) << "trial " << trial;
    }
  }
  RecordProperty("limit_binding_trials", limit_binding);
}

TEST(Huffman, CodesAreCanonical) {
  std::mt19937_64 rng(TestSeed());
  for (int alphabet : {4, 16, 256}) {
    const auto sample = GaussianCodes(alphabet, 0.1 * alphabet + 0.5, 10000, rng);
    auto cb = BuildHuffmanCodebook(1, Histogram(alphabet, sample));
    ASSERT_TRUE(cb.ok()) << cb.status();
    std::vector<int> order(alphabet);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return cb->lengths[a] < cb->lengths[b]; });
    // In (length, symbol) order, each code is the previous one plus one, shifted to its length.
    uint32_t expect = 0;
    for (int i = 0; i < alphabet; ++i) {
      const int s = order[i];
      if (i > 0) {
        expect = (expect + 1) << (cb->lengths[s] - cb->lengths[order[i - 1]]);
      }
      EXPECT_EQ(Reverse(cb->codes[s], cb->lengths[s]), expect) << "symbol " << s;
      // The table entry at the code's bits names the symbol, whatever follows.
      const uint16_t entry = cb->decode_table[cb->codes[s]];
      EXPECT_EQ(entry & 0xff, s);
      EXPECT_EQ(entry >> 8, cb->lengths[s]);
    }
    EXPECT_EQ(expect, (1u << cb->lengths[order.back()]) - 1) << "a complete code ends in all ones";
  }
}

TEST(Huffman, MeanCodeLengthIsNearTheEntropy) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  for (int alphabet : {4, 16, 256}) {
    for (double sigma : {0.5, 0.08 * alphabet + 0.5}) {
      SCOPED_TRACE(testing::Message() << "alphabet " << alphabet << ", sigma " << sigma);
      const auto sample = GaussianCodes(alphabet, sigma, 100000, rng);
      const auto h = Histogram(alphabet, sample);
      auto cb = BuildHuffmanCodebook(1, h);
      ASSERT_TRUE(cb.ok()) << cb.status();
      const double mean = MeanCodeLength(*cb, h);
      const double entropy = Entropy(h);
      EXPECT_GE(mean, entropy);
      EXPECT_LT(mean, entropy + 1);
      EXPECT_LT(mean, std::log2(alphabet)) << "no better than fixed width";
      EXPECT_DOUBLE_EQ(mean, static_cast<double>(EncodedBits(*cb, sample.data(), sample.size())) /
                                 sample.size());
    }
  }
  auto cb = BuildHuffmanCodebook(1, std::vector<uint64_t>{1, 1, 2});
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(MeanCodeLength(*cb, std::vector<uint64_t>{}), 0);
  EXPECT_EQ(MeanCodeLength(*cb, std::vector<uint64_t>{0, 0, 0, 1}),
            std::numeric_limits<double>::infinity());
}

TEST(Huffman, BuildRejectsBadArguments) {
  auto code = [](std::vector<uint64_t> h, int max_length = kMaxHuffmanCodeLength) {
    return BuildHuffmanCodebook(5, h, max_length).status();
  };
  EXPECT_THAT(code({}).message(), HasSubstr("histogram is empty"));
  EXPECT_EQ(code(std::vector<uint64_t>(257, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(code(std::vector<uint64_t>(256, 1), 7).message(),
              HasSubstr("max_length 7 outside [8, 12] for a 256-symbol alphabet"));
  EXPECT_EQ(code(std::vector<uint64_t>(5, 1), 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(code(std::vector<uint64_t>(5, 1), 3).ok());
  EXPECT_EQ(code({1, 2}, 13).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2}, 0).code(), absl::StatusCode::kInvalidArgument);
  // Counts near 2^64 do not overflow the construction.
  auto huge = BuildHuffmanCodebook(5, std::vector<uint64_t>(256, ~uint64_t{0}));
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_EQ(huge->lengths[17], 8);
}

TEST(Huffman, SerializationRoundTripsAndHasAFixedLayout) {
  auto cb = CodebookFromLengths(7, std::vector<uint8_t>{2, 1, 3, 3, 4, 4, 4}, 5);
  ASSERT_FALSE(cb.ok()) << "Kraft sum 19/16 must be rejected";
  cb = CodebookFromLengths(7, std::vector<uint8_t>{2, 1, 3, 4, 4}, 5);
  ASSERT_TRUE(cb.ok()) << cb.status();
  const std::string bytes = SerializeCodebook(*cb);
  EXPECT_EQ(bytes, std::string("\x01\x05\x05\x00\x07\x00\x00\x00\x12\x43\x04", 11));
  auto parsed = ParseCodebook(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->id, 7u);
  EXPECT_EQ(parsed->alphabet_size, 5);
  EXPECT_EQ(parsed->max_length, 5);
  EXPECT_EQ(parsed->lengths, cb->lengths);
  EXPECT_EQ(parsed->codes, cb->codes);
  EXPECT_EQ(parsed->decode_table, cb->decode_table);

  std::mt19937_64 rng(TestSeed());
  for (int alphabet : {1, 4, 16, 255, 256}) {
    std::vector<uint64_t> h(alphabet);
    for (uint64_t& c : h) c = rng() % 50;
    auto built = BuildHuffmanCodebook(0xfeedbeef, h);
    ASSERT_TRUE(built.ok()) << built.status();
    const std::string wire = SerializeCodebook(*built);
    EXPECT_EQ(wire.size(), 8 + (alphabet + 1) / 2);
    auto back = ParseCodebook(wire);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->id, 0xfeedbeef);
    EXPECT_EQ(back->lengths, built->lengths);
    EXPECT_EQ(back->codes, built->codes);
  }
}

TEST(Huffman, ParseNamesEveryMalformedField) {
  const std::string good = SerializeCodebook(
      *CodebookFromLengths(7, std::vector<uint8_t>{2, 1, 3, 4, 4}, 5));  // 11 bytes
  auto err = [](const std::string& b) { return ParseCodebook(b).status(); };
  auto patch = [&](size_t at, char v) {
    std::string b = good;
    b[at] = v;
    return b;
  };
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(err(good.substr(0, n)).code(), absl::StatusCode::kDataLoss) << n << " bytes";
  }
  EXPECT_THAT(err(good.substr(0, 5)).message(), HasSubstr("truncated"));
  EXPECT_THAT(err(good.substr(0, 10)).message(), HasSubstr("10 bytes, but a 5-symbol"));
  EXPECT_EQ(err(good + "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(err(patch(0, 2)).message(), HasSubstr("version 2 is not supported"));
  EXPECT_THAT(err(patch(1, 0)).message(), HasSubstr("max_length 0 outside [1, 12]"));
  EXPECT_THAT(err(patch(1, 13)).message(), HasSubstr("max_length 13 outside"));
  EXPECT_THAT(err(patch(1, 3)).message(), HasSubstr("symbol 3 has code length 4, outside [1, 3]"));
  EXPECT_THAT(err(patch(2, 0)).message(), HasSubstr("alphabet of 0 symbols"));
  std::string wide = good;
  wide[2] = 1;
  wide[3] = 1;  // 257 symbols
  EXPECT_THAT(err(wide).message(), HasSubstr("alphabet of 257 symbols outside [1, 256]"));
  EXPECT_THAT(err(patch(8, 0x10)).message(), HasSubstr("symbol 0 has code length 0"));
  EXPECT_THAT(err(patch(8, 0x11)).message(), HasSubstr("Kraft sum 40/32 exceeds 1"));
  EXPECT_THAT(err(patch(10, 0x14)).message(), HasSubstr("pad nibble"));
}

TEST(Huffman, ParseSurvivesTruncationAndMutation) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  const auto sample = GaussianCodes(16, 2.0, 4096, rng);
  const std::string good = SerializeCodebook(*BuildHuffmanCodebook(9, Histogram(16, sample)));
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseCodebook(good.substr(0, n)).ok()) << "truncated to " << n;
  }
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string b = good;
    const int edits = 1 + rng() % 3;
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 3) {
        case 0:
          b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 1:
          b[rng() % b.size()] = static_cast<char>(rng());
          break;
        default:
          if (rng() % 2) {
            b.resize(rng() % (b.size() + 1));
          } else {
            b.push_back(static_cast<char>(rng()));
          }
          if (b.empty()) b.push_back('\x01');
      }
    }
    auto cb = ParseCodebook(b);
    if (!cb.ok()) {
      EXPECT_THAT(cb.status().code(), ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                                       absl::StatusCode::kDataLoss));
      EXPECT_FALSE(cb.status().message().empty());
      continue;
    }
    ++accepted;
    // Whatever parses is a working codebook.
    ASSERT_LE(KraftSum(*cb), uint64_t{1} << cb->max_length);
    const int64_t rows = 3, row_len = 1 + trial % 70;
    std::vector<uint8_t> symbols(rows * row_len);
    for (uint8_t& s : symbols) s = rng() % cb->alphabet_size;
    ExpectRoundTrip(*cb, symbols, rows, row_len);
    if (HasFailure()) return;
  }
  RecordProperty("mutations_accepted", accepted);
  EXPECT_GT(accepted, 0) << "mutations never produced a valid codebook; the test is too weak";
}

TEST(Huffman, EncodeRowsChecksCapacityBeforeWriting) {
  std::mt19937_64 rng(TestSeed());
  const auto symbols = GaussianCodes(16, 2.0, 8 * 64, rng);
  auto cb = BuildHuffmanCodebook(3, Histogram(16, symbols));
  ASSERT_TRUE(cb.ok());
  const uint64_t bits = EncodedBits(*cb, symbols.data(), symbols.size());
  const size_t need = (bits + 7) / 8 + HuffmanPaddingBytes();
  std::vector<uint8_t> out(need, kGuard);
  std::vector<uint32_t> offsets(9, 0);
  for (size_t capacity : {size_t{0}, need / 2, need - 1}) {
    auto st = EncodeRows(*cb, symbols.data(), 8, 64, out.data(), capacity, offsets.data());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kResourceExhausted) << capacity;
    EXPECT_THAT(st.status().message(), HasSubstr(absl::StrFormat("the buffer holds %d", capacity)));
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == kGuard; }));
  }
  auto st = EncodeRows(*cb, symbols.data(), 8, 64, out.data(), need, offsets.data());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, bits);

  // Zero rows still zero-fill the padding.
  std::vector<uint8_t> pad(HuffmanPaddingBytes(), kGuard);
  uint32_t end = 1;
  auto none = EncodeRows(*cb, symbols.data(), 0, 64, pad.data(), pad.size(), &end);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0u);
  EXPECT_EQ(end, 0u);
  EXPECT_TRUE(std::all_of(pad.begin(), pad.end(), [](uint8_t b) { return b == 0; }));
}

TEST(Huffman, EncodeRowsRejectsSymbolsOutsideTheAlphabet) {
  auto cb = BuildHuffmanCodebook(3, std::vector<uint64_t>{5, 3, 1, 1});
  ASSERT_TRUE(cb.ok());
  std::vector<uint8_t> symbols(3 * 10, 1);
  symbols[2 * 10 + 6] = 4;
  std::vector<uint8_t> out(64);
  std::vector<uint32_t> offsets(4);
  auto st = EncodeRows(*cb, symbols.data(), 3, 10, out.data(), out.size(), offsets.data());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.status().message(),
              HasSubstr("symbol 4 at row 2, position 6 is outside its 4-symbol alphabet"));
  EXPECT_EQ(EncodeRows(*cb, symbols.data(), -1, 10, out.data(), out.size(), offsets.data())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Huffman, CheckedDecodeCatchesRowsOfTheWrongLength) {
  std::mt19937_64 rng(TestSeed());
  const int64_t rows = 6, row_len = 64;
  const auto symbols = GaussianCodes(16, 2.0, rows * row_len, rng);
  auto cb = BuildHuffmanCodebook(3, Histogram(16, symbols));
  ASSERT_TRUE(cb.ok());
  const Encoded e = EncodeOrDie(*cb, symbols, rows, row_len);
  const std::string_view data(reinterpret_cast<const char*>(e.bytes.data()), (e.bits + 7) / 8);
  std::vector<uint8_t> out(row_len + 1);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t begin = e.offsets[r], end = e.offsets[r + 1];
    auto check = [&](uint64_t b, uint64_t en, int64_t n) {
      return DecodeRowChecked(*cb, data, b, en, n, out.data());
    };
    ASSERT_TRUE(check(begin, end, row_len).ok());
    EXPECT_THAT(check(begin, end - 1, row_len).message(), HasSubstr("runs past it"));
    EXPECT_EQ(check(begin, end, row_len + 1).code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(check(begin, end, row_len - 1).message(), HasSubstr("but ends at bit"));
    if (end < e.bits) {
      EXPECT_EQ(check(begin, end + 1, row_len).code(), absl::StatusCode::kDataLoss);
    }
  }
  EXPECT_EQ(DecodeRowChecked(*cb, data, 0, data.size() * 8 + 1, 1, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRowChecked(*cb, data, 10, 9, 1, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRowChecked(*cb, data, 0, 10, 11, out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeRowChecked(HuffmanCodebook{}, data, 0, 10, 1, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// A row known only to end by a limit (padded to a byte) decodes to where its codes end.
TEST(Huffman, DecodeWithinALimitFindsTheRowsEnd) {
  std::mt19937_64 rng(TestSeed());
  const int64_t rows = 4, row_len = 48;
  const auto symbols = GaussianCodes(16, 2.0, rows * row_len, rng);
  auto cb = BuildHuffmanCodebook(5, Histogram(16, symbols));
  ASSERT_TRUE(cb.ok());
  const Encoded e = EncodeOrDie(*cb, symbols, rows, row_len);
  const std::string_view data(reinterpret_cast<const char*>(e.bytes.data()), (e.bits + 7) / 8);
  std::vector<uint8_t> out(row_len);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t begin = e.offsets[r], end = e.offsets[r + 1];
    for (uint64_t limit : {uint64_t{end}, std::min<uint64_t>(end + 7, data.size() * 8)}) {
      absl::StatusOr<uint64_t> stop = DecodeRowWithin(*cb, data, begin, limit, row_len, out.data());
      ASSERT_TRUE(stop.ok()) << stop.status();
      EXPECT_EQ(*stop, end);
      EXPECT_TRUE(std::equal(out.begin(), out.end(), symbols.begin() + r * row_len));
    }
    EXPECT_THAT(DecodeRowWithin(*cb, data, begin, end - 1, row_len, out.data()).status().message(),
                HasSubstr("runs past it"));
  }
  EXPECT_EQ(DecodeRowWithin(*cb, data, 0, data.size() * 8 + 1, 1, out.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Huffman, RowsDecodeAloneInAnyOrder) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "SLUICE_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  const int64_t rows = 200, row_len = 127;
  const auto symbols = GaussianCodes(256, 6.0, rows * row_len, rng);
  auto cb = BuildHuffmanCodebook(3, Histogram(256, symbols));
  ASSERT_TRUE(cb.ok());
  const Encoded e = EncodeOrDie(*cb, symbols, rows, row_len);
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t> decoded(rows * row_len, 0);
  for (int64_t r : order) {
    // Only this row's bytes and the padding are visible.
    const size_t first = e.offsets[r] / 8, last = (e.offsets[r + 1] + 7) / 8;
    std::vector<uint8_t> alone(last - first + HuffmanPaddingBytes(), 0);
    std::memcpy(alone.data(), e.bytes.data() + first, last - first);
    DecodeRow(*cb, alone.data(), e.offsets[r] - first * 8, row_len, &decoded[r * row_len]);
  }
  EXPECT_EQ(decoded, symbols);
}

}  // namespace
}  // namespace sluice::kernels
