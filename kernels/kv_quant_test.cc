// KV page quantizers on every backend against ref: byte-identical pages, matching
// dequantization, round-trip error bounds per codec, and page layouts.
#include "kernels/ref/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "kernels/kv_format.h"
#include "kernels/test_util/kv_round_trip.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
using ::testing::HasSubstr;

KvQuantSpec Int(int bits, KvGrouping grouping, int group, int block_channels = 0) {
  return {.codec = KvCodec::kInt,
          .bits = bits,
          .grouping = grouping,
          .group = group,
          .block_channels = block_channels};
}
constexpr KvQuantSpec kF16{};
KvQuantSpec Fp8(int group) {
  return {.codec = KvCodec::kFp8, .bits = 8, .grouping = KvGrouping::kPerToken, .group = group};
}

std::vector<KvTierFormat> Formats() {
  using G = KvGrouping;
  std::vector<KvTierFormat> out;
  auto add = [&](KvQuantSpec k, KvQuantSpec v, int d, bool token_meta = false) {
    out.push_back({.k = k, .v = v, .head_dim = d, .page_bytes = 16384, .token_meta = token_meta});
  };
  add(kF16, kF16, 64);
  add(Int(8, G::kPerToken, 0), Int(8, G::kPerToken, 0), 64);
  add(Int(2, G::kPerChannel, 32), Int(2, G::kPerToken, 0), 64);
  add(Int(4, G::kPerChannel, 32), Int(4, G::kPerToken, 32), 64, true);
  add(Int(2, G::kPerChannel, 16), Int(2, G::kPerToken, 32), 128);
  add(Int(4, G::kPerChannel, 64), Int(2, G::kPerToken, 0), 32);
  add(Int(2, G::kBlock, 32, 16), Int(4, G::kPerToken, 0), 64);
  add(Int(4, G::kPerToken, 32), Int(2, G::kPerToken, 64), 128, true);
  add(Fp8(32), Fp8(0), 64);
  add(Int(8, G::kPerChannel, 16), kF16, 64);
  return out;
}

// Keys with a few large outlier channels (as real keys have), values plain.
std::vector<float> KvRows(std::mt19937_64& rng, int64_t tokens, int64_t stride, bool keys) {
  std::vector<float> x = testing::RandomFloats(rng, tokens * stride, -1.5f, 1.5f);
  if (keys) {
    for (int64_t t = 0; t < tokens; ++t) {
      x[t * stride + 3] *= 12.f;
      x[t * stride + 17] += 6.f;
    }
  }
  return x;
}

// A page of `format` filled by the reference quantizer with rows k and v ([tokens, head_dim]).
std::vector<uint8_t> RefPage(const KvTierFormat& f, const KvPageLayout& l,
                             const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<uint8_t> page(f.page_bytes, 0);
  ref::KvQuantize({.k = HostView(k),
                   .v = HostView(v),
                   .stride = f.head_dim,
                   .tokens = l.tokens,
                   .format = f,
                   .layout = l,
                   .page = HostView(page)});
  return page;
}

class KvQuantizeTest : public testing::OpTest<Op::kKvQuantize> {};

TEST_P(KvQuantizeTest, PagesMatchReferenceBytes) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : Formats()) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const int64_t g = layout->token_group;
    // A write into the middle of the page, after a group-aligned number of slots.
    const int64_t groups = layout->tokens / g;
    const int64_t slot = g * static_cast<int64_t>(rng() % groups);
    const int64_t tokens = g * (1 + static_cast<int64_t>(rng() % (groups - slot / g)));
    const int64_t stride = f.head_dim * 3 + 5;  // one head of a [tokens, 3 heads] row, ragged
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " d=" << f.head_dim << " slot="
                                      << slot << " tokens=" << tokens << " seed=" << seed);
    const std::vector<float> k = KvRows(rng, tokens, stride, true);
    const std::vector<float> v = KvRows(rng, tokens, stride, false);
    std::vector<float> scores = testing::RandomFloats(rng, tokens, 0, 1);
    std::vector<int32_t> positions(tokens);
    for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(100 + t);
    std::vector<uint8_t> want(f.page_bytes, 0);
    KvQuantizeParams p{.k = HostView(k),
                       .v = HostView(v),
                       .stride = stride,
                       .tokens = tokens,
                       .scores = HostView(scores),
                       .positions = HostView(positions),
                       .format = f,
                       .layout = *layout,
                       .page = HostView(want),
                       .slot = slot};
    ref::KvQuantize(p);

    auto kb = GuardedBuffer::Create(*backend_, k.size());
    auto vb = GuardedBuffer::Create(*backend_, v.size());
    auto sb = GuardedBuffer::Create(*backend_, scores.size());
    auto pb = GuardedBuffer::Create(*backend_, f.page_bytes / 4);
    auto posb = GuardedBuffer::Create(*backend_, positions.size());
    ASSERT_TRUE(kb.ok() && vb.ok() && sb.ok() && pb.ok() && posb.ok());
    std::vector<float> pos_bits(tokens);
    std::memcpy(pos_bits.data(), positions.data(), tokens * 4);
    ASSERT_TRUE(kb->Upload(k).ok() && vb->Upload(v).ok() && sb->Upload(scores).ok() &&
                pb->Upload(std::vector<float>(f.page_bytes / 4, 0.f)).ok() &&
                posb->Upload(pos_bits).ok());
    p.k = kb->view();
    p.v = vb->view();
    p.scores = sb->view();
    p.positions = posb->view<const int32_t>();
    p.page = pb->view<uint8_t>();
    ASSERT_TRUE(backend_->KvQuantize(p).ok());
    auto got = pb->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    int mismatches = 0;
    for (int i = 0; i < f.page_bytes && mismatches < 5; ++i) {
      const uint8_t b = reinterpret_cast<const uint8_t*>(got->data())[i];
      if (b != want[i]) {
        ADD_FAILURE() << "page byte " << i << ": got " << int{b} << " want " << int{want[i]};
        ++mismatches;
      }
    }
  }
}

// Every format at once, three items of each (a device backend runs them as one launch), each
// into a page of its own at a random token group, some rows wider than head_dim, scores and
// positions where the format keeps them: the bytes of each page are what a call of its own
// gives on the reference backend.
TEST_P(KvQuantizeTest, BatchWritesWhatEachCallWould) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const std::vector<KvTierFormat> formats = Formats();
  std::vector<KvPageLayout> layouts;
  std::vector<std::vector<float>> rows;  // k, v per item
  std::vector<std::vector<uint8_t>> want;
  std::vector<GuardedBuffer> buffers;  // k, v, page per item
  std::vector<KvQuantizeParams> items;
  for (const KvTierFormat& f : formats) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layouts.push_back(*layout);
  }
  std::vector<size_t> format_of;
  std::vector<GuardedBuffer> meta_buffers;  // scores, positions of the items that have them
  for (int copy = 0; copy < 3; ++copy) {
    for (size_t i = 0; i < formats.size(); ++i) {
      const KvTierFormat& f = formats[i];
      const KvPageLayout& l = layouts[i];
      const int64_t g = l.token_group, groups = l.tokens / g;
      const int64_t slot = g * static_cast<int64_t>(rng() % groups);
      const int64_t tokens = g * (1 + static_cast<int64_t>(rng() % (groups - slot / g)));
      const int64_t stride = f.head_dim + (copy == 1 ? 8 : 0);
      const std::vector<float> k = KvRows(rng, tokens, stride, true);
      const std::vector<float> v = KvRows(rng, tokens, stride, false);
      const std::vector<float> scores = testing::RandomFloats(rng, tokens, 0.f, 4.f);
      std::vector<int32_t> positions(tokens);
      for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(rng() % 100000);
      const bool meta = f.token_meta && copy != 2;  // the third: none given, 0 and -1 stored
      KvQuantizeParams p{.k = HostView(k),
                         .v = HostView(v),
                         .stride = stride,
                         .tokens = tokens,
                         .format = f,
                         .layout = l,
                         .slot = slot};
      if (meta) {
        p.scores = HostView(scores);
        p.positions = HostView(positions);
      }
      want.emplace_back(f.page_bytes, 0);
      p.page = HostView(want.back());
      ref::KvQuantize(p);
      for (const std::vector<float>* src : {&k, &v}) {
        auto b = GuardedBuffer::Create(*backend_, src->size());
        ASSERT_TRUE(b.ok() && b->Upload(*src).ok());
        buffers.push_back(std::move(*b));
      }
      auto page = GuardedBuffer::Create(*backend_, f.page_bytes / 4);
      ASSERT_TRUE(page.ok() && page->Upload(std::vector<float>(f.page_bytes / 4, 0.f)).ok());
      buffers.push_back(std::move(*page));
      p.k = buffers[buffers.size() - 3].view();
      p.v = buffers[buffers.size() - 2].view();
      p.page = buffers.back().view<uint8_t>();
      if (meta) {
        auto s = GuardedBuffer::Create(*backend_, tokens);
        auto pos = GuardedBuffer::Create(*backend_, tokens);
        std::vector<float> pos_bits(tokens);
        std::memcpy(pos_bits.data(), positions.data(), tokens * sizeof(int32_t));
        ASSERT_TRUE(s.ok() && s->Upload(scores).ok() && pos.ok() && pos->Upload(pos_bits).ok());
        p.scores = s->view();
        p.positions = pos->view<int32_t>();
        meta_buffers.push_back(std::move(*s));
        meta_buffers.push_back(std::move(*pos));
      }
      items.push_back(p);
      format_of.push_back(i);
    }
  }
  const absl::Status st = backend_->KvQuantizeBatch(items);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < items.size(); ++i) {
    auto got = buffers[3 * i + 2].DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::memcmp(got->data(), want[i].data(), want[i].size()), 0)
        << KvTierFormatName(formats[format_of[i]]) << " (item " << i << ")";
  }
  items[1].slot = 1;  // off its token group or past the page: refused, named
  items[1].tokens = layouts[1].tokens;
  const absl::Status bad = backend_->KvQuantizeBatch(items);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(bad.message(), ::testing::HasSubstr("item 1")) << bad;
}

TEST_P(KvQuantizeTest, RejectsWritesOffTheTokenGroup) {
  const KvTierFormat f = Formats()[2];  // K per channel, groups of 32 tokens
  auto layout = ComputePageLayout(f);
  ASSERT_TRUE(layout.ok());
  std::vector<float> x(64 * 64);
  std::vector<uint8_t> page(f.page_bytes);
  KvQuantizeParams p{.k = HostView(x),
                     .v = HostView(x),
                     .stride = 64,
                     .tokens = 16,
                     .format = f,
                     .layout = *layout,
                     .page = HostView(page),
                     .slot = 0};
  EXPECT_THAT(backend_->KvQuantize(p).message(), HasSubstr("token group"));
  p.tokens = 32;
  p.slot = layout->tokens;  // past the page
  EXPECT_EQ(backend_->KvQuantize(p).code(), absl::StatusCode::kInvalidArgument);
  p.slot = 0;
  p.layout.tokens += 1;  // a layout that is not the format's
  EXPECT_THAT(backend_->KvQuantize(p).message(), HasSubstr("layout"));
}

// Views that do not cover the op's shapes, or live in memory the backend does not compute in,
// are refused by name before anything runs.
TEST_P(KvQuantizeTest, RefusesShortViewsAndViewsInOtherMemory) {
  const KvTierFormat f = Formats()[0];
  auto layout = ComputePageLayout(f);
  ASSERT_TRUE(layout.ok());
  const int64_t d = f.head_dim, tokens = 8;
  auto rows = GuardedBuffer::Create(*backend_, tokens * d);
  auto page = GuardedBuffer::Create(*backend_, f.page_bytes / 4);
  ASSERT_TRUE(rows.ok() && page.ok());
  const KvQuantizeParams good{.k = rows->view(),
                              .v = rows->view(),
                              .stride = d,
                              .tokens = tokens,
                              .format = f,
                              .layout = *layout,
                              .page = page->view<uint8_t>()};
  ASSERT_TRUE(backend_->KvQuantize(good).ok());
  KvQuantizeParams p = good;
  p.k.size = (tokens - 1) * d;  // one row short
  EXPECT_THAT(backend_->KvQuantize(p).message(), HasSubstr("k holds"));
  p = good;
  p.page.size = f.page_bytes - 1;
  EXPECT_THAT(backend_->KvQuantize(p).message(), HasSubstr("page holds"));
  p = good;
  p.v.space =
      backend_->memory_space() == MemorySpace::kHost ? MemorySpace::kDevice : MemorySpace::kHost;
  EXPECT_THAT(
      backend_->KvQuantize(p).message(),
      HasSubstr(absl::StrCat("v is in ", std::string(MemorySpaceName(p.v.space)), " memory")));
  // Dequantizing back into views too short, or elsewhere.
  const KvDequantizeParams back{.page = page->view<const uint8_t>(),
                                .format = f,
                                .layout = *layout,
                                .tokens = tokens,
                                .k = rows->view(),
                                .v = rows->view()};
  if (backend_->Supports(Op::kKvDequantize)) {
    ASSERT_TRUE(backend_->KvDequantize(back).ok());
    KvDequantizeParams q = back;
    q.k.size = 1;
    EXPECT_THAT(backend_->KvDequantize(q).message(), HasSubstr("k holds"));
    q = back;
    q.page.space = p.v.space;
    EXPECT_THAT(backend_->KvDequantize(q).message(), HasSubstr("page is in"));
  }
}

SLUICE_INSTANTIATE_OP_TEST(KvQuantizeTest);

class KvDequantizeTest : public testing::OpTest<Op::kKvDequantize> {};

TEST_P(KvDequantizeTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : Formats()) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok());
    const int64_t n = layout->tokens, d = f.head_dim;
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const std::vector<float> k = KvRows(rng, n, d, true), v = KvRows(rng, n, d, false);
    const std::vector<uint8_t> page = RefPage(f, *layout, k, v);
    const int64_t slot = static_cast<int64_t>(rng() % n), tokens = 1 + rng() % (n - slot);
    std::vector<float> want_k(tokens * d), want_v(tokens * d);
    KvDequantizeParams p{.page = HostView(page),
                         .format = f,
                         .layout = *layout,
                         .slot = slot,
                         .tokens = tokens,
                         .k = HostView(want_k),
                         .v = HostView(want_v)};
    ref::KvDequantize(p);
    auto pb = GuardedBuffer::Create(*backend_, f.page_bytes / 4);
    auto kb = GuardedBuffer::Create(*backend_, want_k.size());
    auto vb = GuardedBuffer::Create(*backend_, want_v.size());
    ASSERT_TRUE(pb.ok() && kb.ok() && vb.ok());
    std::vector<float> page_words(f.page_bytes / 4);
    std::memcpy(page_words.data(), page.data(), f.page_bytes);
    ASSERT_TRUE(pb->Upload(page_words).ok());
    p.page = pb->view<const uint8_t>();
    p.k = kb->view();
    p.v = vb->view();
    ASSERT_TRUE(backend_->KvDequantize(p).ok());
    auto got_k = kb->DownloadChecked();
    auto got_v = vb->DownloadChecked();
    ASSERT_TRUE(got_k.ok() && got_v.ok());
    testing::ExpectNear(*got_k, want_k, {1e-5f}, 1e-6f, "k");
    testing::ExpectNear(*got_v, want_v, {1e-5f}, 1e-6f, "v");
  }
}

SLUICE_INSTANTIATE_OP_TEST(KvDequantizeTest);

// The error of every value after a round trip stays within what its codec promises.
TEST(KvQuantRoundTrip, ErrorWithinCodecBound) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : Formats()) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok());
    const int64_t n = layout->tokens, d = f.head_dim;
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const std::vector<float> k = KvRows(rng, n, d, true), v = KvRows(rng, n, d, false);
    const std::vector<uint8_t> page = RefPage(f, *layout, k, v);
    std::vector<float> rk(n * d), rv(n * d);
    ref::KvDequantize({.page = HostView(page),
                       .format = f,
                       .layout = *layout,
                       .slot = 0,
                       .tokens = n,
                       .k = HostView(rk),
                       .v = HostView(rv)});
    EXPECT_TRUE(testing::RoundTripWithinBound(f.k, f.head_dim, k.data(), rk.data(), n)) << "k";
    EXPECT_TRUE(testing::RoundTripWithinBound(f.v, f.head_dim, v.data(), rv.data(), n)) << "v";
  }
}

TEST(KvPageLayout, SegmentsFitThePageAndDoNotOverlap) {
  for (const KvTierFormat& f : Formats()) {
    auto l = ComputePageLayout(f);
    ASSERT_TRUE(l.ok()) << l.status();
    SCOPED_TRACE(KvTierFormatName(f));
    EXPECT_GT(l->tokens, 0);
    EXPECT_EQ(l->tokens % l->token_group, 0);
    EXPECT_LE(l->bytes_used, f.page_bytes);
    EXPECT_GE(l->k_meta, l->k_codes + l->tokens * l->k_row_bytes);
    EXPECT_GE(l->v_codes, l->k_meta);
    EXPECT_GE(l->v_meta, l->v_codes + l->tokens * l->v_row_bytes);
    EXPECT_GT(l->valid, l->v_meta - 1);
    // One more tile (or token group) would not fit.
    const int64_t step = std::max(l->token_group, l->k_tile);
    EXPECT_EQ(l->tokens % step, 0);
    const double per_token = static_cast<double>(l->valid) / l->tokens;  // codes and metadata
    EXPECT_GT(l->bytes_used + step * per_token, f.page_bytes - 64 * 7);
  }
  // fp16 at head_dim 64: 128 bytes of K and V per token plus the bitmap.
  auto f16 = ComputePageLayout({.head_dim = 64});
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->tokens, 63);
  // KIVI-2: 16 + 16 code bytes per token, 256 bytes of K scale/zero per 32 tokens, 4 of V.
  auto kivi2 = ComputePageLayout({.k = Int(2, KvGrouping::kPerChannel, 32),
                                  .v = Int(2, KvGrouping::kPerToken, 0),
                                  .head_dim = 64});
  ASSERT_TRUE(kivi2.ok());
  EXPECT_EQ(kivi2->tokens, 352);
}

// Moving a token between pages (or within one, to an earlier slot: compaction) carries its
// codes and metadata: it dequantizes to the same values in its new slot.
TEST(KvMoveSlot, MovedTokensDequantizeTheSame) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const KvTierFormat& f : Formats()) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok());
    if (layout->token_group != 1) continue;  // K grouped along tokens moves by whole groups
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    const int64_t n = layout->tokens, d = f.head_dim;
    const std::vector<float> k = KvRows(rng, n, d, true), v = KvRows(rng, n, d, false);
    const std::vector<uint8_t> src = RefPage(f, *layout, k, v);
    std::vector<float> want_k(n * d), want_v(n * d);
    ref::KvDequantize({.page = HostView(src),
                       .format = f,
                       .layout = *layout,
                       .tokens = n,
                       .k = HostView(want_k),
                       .v = HostView(want_v)});
    // Every other slot, in order, to the front of the same page; the rest to another page in
    // reverse.
    std::vector<uint8_t> same = src, other(f.page_bytes, 0);
    std::vector<int64_t> front, back;
    for (int64_t t = 0; t < n; ++t) (t % 2 == 0 ? front : back).push_back(t);
    for (size_t i = 0; i < front.size(); ++i) {
      KvMoveSlot(f, *layout, same.data(), front[i], same.data(), static_cast<int64_t>(i));
    }
    for (size_t i = 0; i < back.size(); ++i) {
      KvMoveSlot(f, *layout, src.data(), back[back.size() - 1 - i], other.data(),
                 static_cast<int64_t>(i));
    }
    std::vector<float> got_k(n * d), got_v(n * d), other_k(n * d), other_v(n * d);
    ref::KvDequantize({.page = HostView(same),
                       .format = f,
                       .layout = *layout,
                       .tokens = n,
                       .k = HostView(got_k),
                       .v = HostView(got_v)});
    ref::KvDequantize({.page = HostView(other),
                       .format = f,
                       .layout = *layout,
                       .tokens = static_cast<int64_t>(back.size()),
                       .k = HostView(other_k),
                       .v = HostView(other_v)});
    for (size_t i = 0; i < front.size(); ++i) {
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(got_k[i * d + c], want_k[front[i] * d + c]) << "front " << i;
        ASSERT_EQ(got_v[i * d + c], want_v[front[i] * d + c]) << "front " << i;
      }
    }
    for (size_t i = 0; i < back.size(); ++i) {
      const int64_t from = back[back.size() - 1 - i];
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(other_k[i * d + c], want_k[from * d + c]) << "back " << i;
        ASSERT_EQ(other_v[i * d + c], want_v[from * d + c]) << "back " << i;
      }
    }
    const uint64_t* valid = reinterpret_cast<const uint64_t*>(other.data() + layout->valid);
    EXPECT_EQ(valid[0] & 1, 1u);
  }
}

TEST(KvPageLayout, RejectsUnsupportedFormats) {
  auto msg = [](const KvTierFormat& f) {
    return std::string(ComputePageLayout(f).status().message());
  };
  EXPECT_THAT(msg({.head_dim = 48}), HasSubstr("head_dim 48"));
  EXPECT_THAT(msg({.k = Int(3, KvGrouping::kPerToken, 0)}), HasSubstr("2, 4 or 8"));
  EXPECT_THAT(msg({.v = Int(2, KvGrouping::kPerChannel, 32)}), HasSubstr("v:"));
  EXPECT_THAT(msg({.k = Int(2, KvGrouping::kPerToken, 24)}), HasSubstr("does not divide"));
  EXPECT_THAT(msg({.k = Int(2, KvGrouping::kBlock, 32, 5)}), HasSubstr("block_channels"));
  EXPECT_THAT(msg({.k = {.codec = KvCodec::kFp8, .bits = 8, .grouping = KvGrouping::kPerChannel}}),
              HasSubstr("fp8"));
  EXPECT_THAT(msg({.k = Int(8, KvGrouping::kPerChannel, 1024), .page_bytes = 4096}),
              HasSubstr("cannot hold"));
}

// A NaN or infinity among the values (a peer's full-precision window may hold any bits) gives
// codes in range: NaN and -inf the lowest, +inf the highest, as the CUDA kernel's fmaxf/fminf.
TEST(IntCode, NonFiniteValuesGetCodesInRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const ref::IntGroupParams g = ref::MakeIntGroupParams(-1.f, 2.f, 15);
  EXPECT_EQ(ref::IntCode(nan, g, 15), 0);
  EXPECT_EQ(ref::IntCode(-inf, g, 15), 0);
  EXPECT_EQ(ref::IntCode(inf, g, 15), 15);
  EXPECT_EQ(ref::IntCode(2.f, g, 15), 15);
  // A group whose bounds are not finite has no scale: every value, finite or not, gets code 0.
  for (const auto& [mn, mx] : {std::pair{nan, 1.f}, std::pair{-inf, inf}, std::pair{0.f, inf}}) {
    const ref::IntGroupParams bad = ref::MakeIntGroupParams(mn, mx, 3);
    for (float x : {nan, -inf, inf, 0.5f}) EXPECT_EQ(ref::IntCode(x, bad, 3), 0) << mn << " " << mx;
  }
}

TEST(Fp8E4M3, EveryCodeRoundTripsAndRoundingIsToNearestEven) {
  for (int b = 0; b < 256; ++b) {
    const float f = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE((b & 0x7f) == 0x7f);
      continue;
    }
    if (b == 0x80) continue;  // -0 comes back as -0; checked by sign below
    EXPECT_EQ(FloatToFp8E4M3(f), b) << "code " << b << " value " << f;
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.f);
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-1e6f), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), FloatToFp8E4M3(1.f));    // halfway to 1.125: even (1.0)
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), FloatToFp8E4M3(1.25f));  // halfway to 1.25: even
  EXPECT_EQ(Fp8E4M3ToFloat(1), std::ldexp(1.f, -9));          // smallest subnormal
}

}  // namespace
}  // namespace sluice::kernels
