// Huffman-coded KV pages (kvcomp) on every backend against ref: byte-identical pages, the
// table-driven decoder against the bit-at-a-time one, round-trip bounds with fewer levels than
// 2^bits, pages that fill before their slots do, layouts, and the errors of bad parameters.
#include "kernels/kv_huffman.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "kernels/device_buffer.h"
#include "kernels/ref/kv_quant.h"
#include "kernels/test_util/kv_coded_pages.h"
#include "kernels/test_util/kv_round_trip.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
using ::testing::HasSubstr;

KvQuantSpec Int8(KvGrouping grouping, int group, int levels, int block_channels = 0) {
  return {.codec = KvCodec::kInt,
          .bits = 8,
          .grouping = grouping,
          .group = group,
          .block_channels = block_channels,
          .levels = levels};
}

std::vector<KvTierFormat> CodedFormats() {
  using G = KvGrouping;
  return {
      // kvcomp as shipped
      {.k = Int8(G::kPerChannel, 32, 5),
       .v = Int8(G::kPerToken, 0, 7),
       .head_dim = 64,
       .huffman_bits = 2.4f},
      // KVComp 2D key blocks, token meta, a small page
      {.k = Int8(G::kBlock, 32, 21, 16),
       .v = Int8(G::kPerToken, 32, 16),
       .head_dim = 64,
       .page_bytes = 8192,
       .token_meta = true,
       .huffman_bits = 3.f},
      // per-token keys (units of 16), wide heads, many levels
      {.k = Int8(G::kPerToken, 32, 9),
       .v = Int8(G::kPerToken, 0, 200),
       .head_dim = 128,
       .huffman_bits = 5.f},
      // units of 64 tokens, narrow heads, all 256 levels
      {.k = Int8(G::kPerChannel, 64, 0),
       .v = Int8(G::kPerToken, 0, 3),
       .head_dim = 32,
       .huffman_bits = 4.f},
  };
}

// Keys with outlier channels (as real keys have), values plain.
std::vector<float> Rows(std::mt19937_64& rng, int64_t tokens, int64_t d, bool keys) {
  std::vector<float> x = testing::RandomFloats(rng, tokens * d, -1.5f, 1.5f);
  if (keys) {
    for (int64_t t = 0; t < tokens; ++t) {
      x[t * d + 3] *= 12.f;
      x[t * d + 17 % d] += 6.f;
    }
  }
  return x;
}

// A coded page, its rows, its codebooks and the tokens it took.
struct CodedPage {
  KvTierFormat format;
  KvPageLayout layout;
  std::vector<float> k, v;
  std::unique_ptr<testing::OwnedCodebooks> books;
  std::vector<uint8_t> bytes;
  int64_t written = 0;
};

CodedPage MakeCodedPage(std::mt19937_64& rng, const KvTierFormat& f) {
  CodedPage c;
  c.format = f;
  c.layout = ComputePageLayout(f).value();
  const int64_t n = c.layout.tokens, d = f.head_dim;
  c.k = Rows(rng, n, d, true);
  c.v = Rows(rng, n, d, false);
  // Codebooks from the first half, as a prefill would build them.
  const int64_t half = n / 2 / c.layout.unit_tokens * c.layout.unit_tokens;
  c.books = testing::CodebooksFromRows(f, c.k.data(), c.v.data(), half).value();
  c.bytes.assign(f.page_bytes, 0);
  c.written =
      testing::RefCodedWrite(f, c.books->view(), c.k.data(), c.v.data(), n, 0, c.bytes.data())
          .value();
  return c;
}

// A copy of host data in the backend's memory (device memory on CUDA).
template <typename T>
DeviceBuffer OnDevice(Backend& backend, const std::vector<T>& host) {
  auto b = DeviceBuffer::Create(backend, std::max<size_t>(1, host.size() * sizeof(T)));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  EXPECT_TRUE(b->Upload(host.data(), host.size() * sizeof(T)).ok());
  return std::move(*b);
}

class KvCodedQuantizeTest : public testing::OpTest<Op::kKvQuantize> {};

TEST_P(KvCodedQuantizeTest, PagesMatchReferenceBytes) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : CodedFormats()) {
    const KvPageLayout l = ComputePageLayout(f).value();
    const int64_t u = l.unit_tokens, n = l.tokens, d = f.head_dim;
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const std::vector<float> k = Rows(rng, n, d, true), v = Rows(rng, n, d, false);
    const std::vector<float> scores = testing::RandomFloats(rng, n, 0, 1);
    std::vector<int32_t> positions(n);
    for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(7 + t);
    auto books = testing::CodebooksFromRows(f, k.data(), v.data(), n / 2 / u * u);
    ASSERT_TRUE(books.ok()) << books.status();
    // Two appends: a random number of units, then everything else (the page may fill first).
    const int64_t first = u * (1 + static_cast<int64_t>(rng() % (n / u - 1)));
    std::vector<uint8_t> want(f.page_bytes, 0), got(f.page_bytes, 0);
    int64_t want_written[2], got_written[2];
    const DeviceBuffer dk = OnDevice(*backend_, k), dv = OnDevice(*backend_, v);
    const DeviceBuffer ds = OnDevice(*backend_, scores), dpos = OnDevice(*backend_, positions);
    const DeviceBuffer dpage = OnDevice(*backend_, got);
    for (int call = 0; call < 2; ++call) {
      const int64_t at = call == 0 ? 0 : want_written[0];
      const int64_t tokens = call == 0 ? first : n - at;
      KvQuantizeParams p{.k = HostView(k).subview(at * d),
                         .v = HostView(v).subview(at * d),
                         .stride = d,
                         .tokens = tokens,
                         .scores = HostView(scores).subview(at),
                         .positions = HostView(positions).subview(at),
                         .format = f,
                         .layout = l,
                         .page = HostView(want),
                         .slot = at,
                         .codebooks = (*books)->view(),
                         .tokens_written = &want_written[call]};
      ASSERT_TRUE(KvQuantizeHuffman(p, [](const KvQuantizeParams& q) { ref::KvQuantize(q); }).ok());
      p.k = dk.view<float>().subview(at * d);
      p.v = dv.view<float>().subview(at * d);
      p.scores = ds.view<float>().subview(at);
      p.positions = dpos.view<int32_t>().subview(at);
      p.page = dpage.view<uint8_t>();
      p.tokens_written = &got_written[call];
      ASSERT_TRUE(backend_->KvQuantize(p).ok());
      ASSERT_EQ(got_written[call], want_written[call]) << "call " << call;
    }
    ASSERT_TRUE(dpage.Download(got.data(), got.size()).ok());
    // Whole units, while they fit; a page that filled in the first call takes nothing more.
    EXPECT_GT(want_written[0], 0);
    EXPECT_EQ(want_written[0] % u, 0);
    EXPECT_EQ(want_written[1] % u, 0);
    if (want_written[0] < first) {
      EXPECT_EQ(want_written[1], 0);
    }
    int mismatches = 0;
    for (int i = 0; i < f.page_bytes && mismatches < 5; ++i) {
      if (got[i] != want[i]) {
        ADD_FAILURE() << "page byte " << i << ": got " << int{got[i]} << " want " << int{want[i]};
        ++mismatches;
      }
    }
  }
}

// A batch of coded items (the cache's commit flush: every list's page in one call) writes what
// each item alone would, and reports each item's tokens written.
TEST_P(KvCodedQuantizeTest, BatchWritesWhatEachCallWould) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::vector<std::unique_ptr<testing::OwnedCodebooks>> books;
  std::vector<std::vector<float>> rows;
  std::vector<DeviceBuffer> buffers;
  std::vector<std::vector<uint8_t>> want;
  std::vector<KvQuantizeParams> items;
  constexpr int kPerFormat = 3;
  const std::vector<KvTierFormat> formats = CodedFormats();
  std::vector<int64_t> want_written(formats.size() * kPerFormat);
  std::vector<int64_t> got_written(want_written.size(), -1);
  for (const KvTierFormat& f : formats) {
    const KvPageLayout l = ComputePageLayout(f).value();
    const int64_t u = l.unit_tokens, d = f.head_dim;
    const std::vector<float> sk = Rows(rng, l.tokens, d, true), sv = Rows(rng, l.tokens, d, false);
    auto b = testing::CodebooksFromRows(f, sk.data(), sv.data(), l.tokens / u * u);
    ASSERT_TRUE(b.ok()) << b.status();
    books.push_back(std::move(*b));
    for (int j = 0; j < kPerFormat; ++j) {
      const size_t i = items.size();
      // Up to the page's slots; the codes may fill its bitstream first, and the item then stops.
      const int64_t tokens = u * (1 + static_cast<int64_t>(rng() % (l.tokens / u)));
      rows.push_back(Rows(rng, tokens, d, true));
      rows.push_back(Rows(rng, tokens, d, false));
      const std::vector<float>& k = rows[rows.size() - 2];
      const std::vector<float>& v = rows.back();
      KvQuantizeParams p{.k = HostView(k),
                         .v = HostView(v),
                         .stride = d,
                         .tokens = tokens,
                         .format = f,
                         .layout = l,
                         .codebooks = books.back()->view(),
                         .tokens_written = &want_written[i]};
      want.emplace_back(f.page_bytes, 0);
      p.page = HostView(want.back());
      ASSERT_TRUE(KvQuantizeHuffman(p, [](const KvQuantizeParams& q) { ref::KvQuantize(q); }).ok());
      buffers.push_back(OnDevice(*backend_, k));
      buffers.push_back(OnDevice(*backend_, v));
      buffers.push_back(OnDevice(*backend_, std::vector<uint8_t>(f.page_bytes, 0)));
      p.k = buffers[buffers.size() - 3].view<float>();
      p.v = buffers[buffers.size() - 2].view<float>();
      p.page = buffers.back().view<uint8_t>();
      p.tokens_written = &got_written[i];
      items.push_back(p);
    }
  }
  const absl::Status st = backend_->KvQuantizeBatch(items);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < items.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "item " << i);
    EXPECT_EQ(got_written[i], want_written[i]);
    std::vector<uint8_t> got(want[i].size());
    ASSERT_TRUE(buffers[3 * i + 2].Download(got.data(), got.size()).ok());
    EXPECT_TRUE(got == want[i]) << "page bytes differ";
  }
}

TEST_P(KvCodedQuantizeTest, RejectsMissingOrShortCodebooks) {
  const KvTierFormat f = CodedFormats()[0];
  const KvPageLayout l = ComputePageLayout(f).value();
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<float> k = Rows(rng, 64, 64, true), v = Rows(rng, 64, 64, false);
  auto books = testing::CodebooksFromRows(f, k.data(), v.data(), 64);
  ASSERT_TRUE(books.ok());
  const DeviceBuffer dk = OnDevice(*backend_, k), dv = OnDevice(*backend_, v);
  const DeviceBuffer page = OnDevice(*backend_, std::vector<uint8_t>(f.page_bytes, 0));
  int64_t written = 0;
  KvQuantizeParams p{.k = dk.view<float>(),
                     .v = dv.view<float>(),
                     .stride = 64,
                     .tokens = 64,
                     .format = f,
                     .layout = l,
                     .page = page.view<uint8_t>(),
                     .codebooks = (*books)->view(),
                     .tokens_written = &written};
  KvQuantizeParams bad = p;
  bad.codebooks.v = nullptr;
  EXPECT_THAT(backend_->KvQuantize(bad).message(), HasSubstr("v codebook"));
  // A K codebook of 4 symbols cannot code 5 levels.
  const uint64_t hist[4] = {1, 2, 3, 4};
  const HuffmanCodebook small = BuildHuffmanCodebook(9, hist).value();
  bad = p;
  bad.codebooks.k = &small;
  EXPECT_THAT(backend_->KvQuantize(bad).message(), HasSubstr("does not cover 5 levels"));
  bad = p;
  bad.tokens_written = nullptr;
  EXPECT_THAT(backend_->KvQuantize(bad).message(), HasSubstr("tokens_written"));
  bad = p;
  bad.tokens = 16;  // half a unit
  EXPECT_THAT(backend_->KvQuantize(bad).message(), HasSubstr("token group"));
  EXPECT_TRUE(backend_->KvQuantize(p).ok());
  EXPECT_EQ(written, 64);
  // Nothing to write reports nothing written.
  p.tokens = 0;
  EXPECT_TRUE(backend_->KvQuantize(p).ok());
  EXPECT_EQ(written, 0);
}

SLUICE_INSTANTIATE_OP_TEST(KvCodedQuantizeTest);

class KvCodedDequantizeTest : public testing::OpTest<Op::kKvDequantize> {};

TEST_P(KvCodedDequantizeTest, MatchesTheBitAtATimeReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : CodedFormats()) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const CodedPage c = MakeCodedPage(rng, f);
    const int64_t d = f.head_dim;
    const int64_t slot = static_cast<int64_t>(rng() % c.written);
    const int64_t tokens = 1 + static_cast<int64_t>(rng() % (c.written - slot));
    std::vector<float> want_k(tokens * d), want_v(tokens * d), got_k(tokens * d), got_v(tokens * d);
    KvDequantizeParams p{.page = HostView(c.bytes),
                         .format = f,
                         .layout = c.layout,
                         .slot = slot,
                         .tokens = tokens,
                         .k = HostView(want_k),
                         .v = HostView(want_v),
                         .codebooks = c.books->view()};
    ASSERT_TRUE(ref::KvDequantizeAny(p).ok());
    const DeviceBuffer dpage = OnDevice(*backend_, c.bytes);
    const DeviceBuffer dk = OnDevice(*backend_, got_k), dv = OnDevice(*backend_, got_v);
    p.page = dpage.view<uint8_t>();
    p.k = dk.view<float>();
    p.v = dv.view<float>();
    ASSERT_TRUE(backend_->KvDequantize(p).ok());
    ASSERT_TRUE(dk.Download(got_k.data(), got_k.size() * 4).ok());
    ASSERT_TRUE(dv.Download(got_v.data(), got_v.size() * 4).ok());
    testing::ExpectNear(got_k, want_k, {1e-6f}, 1e-7f, "k");
    testing::ExpectNear(got_v, want_v, {1e-6f}, 1e-7f, "v");
  }
}

SLUICE_INSTANTIATE_OP_TEST(KvCodedDequantizeTest);

TEST(KvCodedPages, TableAndBitAtATimeDecodersGiveTheSameUnitPages) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : CodedFormats()) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const CodedPage c = MakeCodedPage(rng, f);
    const KvHuffmanTier tier = MakeKvHuffmanTier(f).value();
    std::vector<uint8_t> fast(tier.unit_layout.bytes_used), slow(fast.size());
    for (int64_t u = 0; u < c.written / c.layout.unit_tokens; ++u) {
      KvDecodeUnit(tier, c.books->view(), c.bytes.data(), u, fast.data());
      KvDecodeUnitReference(tier, c.books->view(), c.bytes.data(), u, slow.data());
      ASSERT_EQ(fast, slow) << "unit " << u;
      // And they are the unit page the fixed-width quantizer makes of the same rows.
      std::vector<uint8_t> direct(fast.size(), 0);
      const int64_t t0 = u * c.layout.unit_tokens;
      ref::KvQuantize({.k = HostView(c.k).subview(t0 * f.head_dim),
                       .v = HostView(c.v).subview(t0 * f.head_dim),
                       .stride = f.head_dim,
                       .tokens = c.layout.unit_tokens,
                       .format = tier.unit_format,
                       .layout = tier.unit_layout,
                       .page = HostView(direct)});
      ASSERT_EQ(fast, direct) << "unit " << u;
    }
  }
}

// A page from elsewhere is checked before the decoders, which trust its offsets and codes, run
// on it: the quantizer's own pages pass; a moved stream offset, codes that run long, an offset
// past the page and a unit count past the page's are refused.
TEST(KvCodedPages, CheckAcceptsWrittenPagesAndRefusesDamagedOnes) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : CodedFormats()) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const CodedPage c = MakeCodedPage(rng, f);
    const KvHuffmanTier tier = MakeKvHuffmanTier(f).value();
    const int64_t units = c.written / c.layout.unit_tokens;
    ASSERT_GT(units, 1);
    ASSERT_TRUE(KvCheckUnits(tier, c.books->view(), c.bytes.data(), units).ok());
    ASSERT_TRUE(KvCheckUnits(tier, c.books->view(), c.bytes.data(), 1).ok());
    EXPECT_EQ(KvCheckUnits(tier, c.books->view(), c.bytes.data(), c.layout.tokens + 1).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(KvCheckUnits(tier, {}, c.bytes.data(), units).code(),
              absl::StatusCode::kInvalidArgument);

    auto refused = [&](auto damage) {
      std::vector<uint8_t> page = c.bytes;
      damage(page.data(), reinterpret_cast<uint32_t*>(page.data() + c.layout.streams));
      return KvCheckUnits(tier, c.books->view(), page.data(), units);
    };
    // The last unit's third K row starts a bit late, or far past the page.
    const int64_t last = (units - 1) * 2 * kKvHuffmanStreams;
    EXPECT_EQ(refused([&](uint8_t*, uint32_t* s) { s[last + 2] += 1; }).code(),
              absl::StatusCode::kDataLoss);
    const absl::Status far = refused([&](uint8_t*, uint32_t* s) { s[last + 2] = 0xFFFFFF00u; });
    EXPECT_EQ(far.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(far.message(), HasSubstr(absl::StrCat("unit ", units - 1, " row 1")));
    // The first unit's codes are all ones: no row of them ends where the next begins.
    EXPECT_EQ(refused([&](uint8_t* p, uint32_t* s) {
                std::memset(p + c.layout.bitstream, 0xFF, s[2 * kKvHuffmanStreams] / 8);
              }).code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(KvCodedPages, RoundTripWithinTheQuantizationBound) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : CodedFormats()) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const CodedPage c = MakeCodedPage(rng, f);
    const int64_t n = c.written, d = f.head_dim;
    std::vector<float> k(n * d), v(n * d);
    ASSERT_TRUE(ref::KvDequantizeAny({.page = HostView(c.bytes),
                                      .format = f,
                                      .layout = c.layout,
                                      .tokens = n,
                                      .k = HostView(k),
                                      .v = HostView(v),
                                      .codebooks = c.books->view()})
                    .ok());
    EXPECT_TRUE(testing::RoundTripWithinBound(f.k, d, c.k.data(), k.data(), n)) << "k";
    EXPECT_TRUE(testing::RoundTripWithinBound(f.v, d, c.v.data(), v.data(), n)) << "v";
  }
}

TEST(KvCodedPages, PageClosesWhenItsCodesRunLongerThanSized) {
  // Sized for 1 bit per value; uniform codes over 256 levels need about 8.
  const KvTierFormat f{.k = Int8(KvGrouping::kPerChannel, 32, 0),
                       .v = Int8(KvGrouping::kPerToken, 0, 0),
                       .head_dim = 64,
                       .huffman_bits = 1.f};
  const KvPageLayout l = ComputePageLayout(f).value();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t n = l.tokens;
  const std::vector<float> k = testing::RandomFloats(rng, n * 64, -1, 1);
  const std::vector<float> v = testing::RandomFloats(rng, n * 64, -1, 1);
  auto books = testing::CodebooksFromRows(f, k.data(), v.data(), n);
  ASSERT_TRUE(books.ok());
  std::vector<uint8_t> page(f.page_bytes, 0);
  auto written = testing::RefCodedWrite(f, (*books)->view(), k.data(), v.data(), n, 0, page.data());
  ASSERT_TRUE(written.ok());
  EXPECT_GT(*written, 0);
  EXPECT_LT(*written, n / 4);
  EXPECT_EQ(*written % l.unit_tokens, 0);
  // Nothing more fits; the page is as it was.
  const std::vector<uint8_t> before = page;
  auto more = testing::RefCodedWrite(f, (*books)->view(), k.data(), v.data(), l.unit_tokens,
                                     *written, page.data());
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(*more, 0);
  EXPECT_EQ(page, before);
}

TEST(KvCodedPages, LayoutsFitThePage) {
  for (const KvTierFormat& f : CodedFormats()) {
    SCOPED_TRACE(KvTierFormatName(f));
    auto l = ComputePageLayout(f);
    ASSERT_TRUE(l.ok()) << l.status();
    const int64_t units = l->tokens / l->unit_tokens;
    EXPECT_EQ(l->tokens % l->unit_tokens, 0);
    EXPECT_EQ(l->token_group, l->unit_tokens);
    EXPECT_GE(l->unit_meta, l->streams + (units * 8 + 1) * 4);
    EXPECT_GE(l->valid, l->unit_meta + units * l->unit_meta_bytes);
    EXPECT_GE(l->bitstream, l->valid + (l->tokens + 63) / 64 * 8);
    // The bitstream holds the page's slots at the nominal bits, plus padding.
    EXPECT_GE(f.page_bytes - l->bitstream, l->tokens * 2 * f.head_dim * f.huffman_bits / 8 + 8);
    auto ul = ComputeUnitLayout(f);
    ASSERT_TRUE(ul.ok());
    EXPECT_EQ(ul->tokens, l->unit_tokens);
    // The unit page's metadata segments hold what a unit's metadata record carries.
    EXPECT_LE(l->unit_k_meta_bytes, ul->v_codes - ul->k_meta);
    EXPECT_LE(l->unit_meta_bytes - l->unit_k_meta_bytes, ul->valid - ul->v_meta);
  }
  // kvcomp at head_dim 64: about 2.4 bits per value and 16 bytes of metadata per token.
  auto kvcomp = ComputePageLayout(CodedFormats()[0]);
  ASSERT_TRUE(kvcomp.ok());
  EXPECT_GE(kvcomp->tokens, 256);
  EXPECT_LE(kvcomp->tokens, 384);
}

TEST(KvCodedPages, RejectsUnsupportedFormats) {
  auto msg = [](KvTierFormat f) { return std::string(ComputePageLayout(f).status().message()); };
  KvTierFormat f = CodedFormats()[0];
  f.k.bits = 4;
  f.k.levels = 0;
  EXPECT_THAT(msg(f), HasSubstr("8-bit"));
  f = CodedFormats()[0];
  f.k.group = 128;
  EXPECT_THAT(msg(f), HasSubstr("16, 32 or 64"));
  f = CodedFormats()[0];
  f.huffman_bits = 20;
  EXPECT_THAT(msg(f), HasSubstr("huffman_bits"));
  f = CodedFormats()[0];
  f.v.levels = 300;
  EXPECT_THAT(msg(f), HasSubstr("levels 300"));
  f = CodedFormats()[0];
  f.v = {};  // f16 values
  EXPECT_THAT(msg(f), HasSubstr("8-bit"));
  EXPECT_THAT(std::string(ComputeUnitLayout({.head_dim = 64}).status().message()),
              HasSubstr("not a Huffman-coded tier"));
}

}  // namespace
}  // namespace sluice::kernels
