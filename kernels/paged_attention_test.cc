// Attention over compressed pages on every backend against ref: mixed tiers, ragged page fill,
// dead (evicted) slots, heads with no pages, decode and multi-query runs, GQA groups.
#include "kernels/ref/paged_attention.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/kv_format.h"
#include "kernels/ref/kv_quant.h"
#include "kernels/test_util/kv_coded_pages.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;

struct Case {
  int64_t q_tokens, heads, kv_heads, head_dim, recent, max_pages;
  bool two_tiers;
  bool kivi = false;  // one KIVI tier (the sluice preset's: the CUDA backend's KIVI kernel)
};

KvTierFormat High(int64_t d) {
  return {.k = {.codec = KvCodec::kInt, .bits = 8, .grouping = KvGrouping::kPerToken},
          .v = {.codec = KvCodec::kInt, .bits = 4, .grouping = KvGrouping::kPerToken, .group = 32},
          .head_dim = static_cast<int32_t>(d),
          .page_bytes = 4096};
}
KvTierFormat Low(int64_t d) {
  return {
      .k = {.codec = KvCodec::kInt, .bits = 2, .grouping = KvGrouping::kPerChannel, .group = 16},
      .v = {.codec = KvCodec::kInt, .bits = 2, .grouping = KvGrouping::kPerToken},
      .head_dim = static_cast<int32_t>(d),
      .page_bytes = 4096,
      .token_meta = true};
}

// The sluice preset's format: int4 keys per channel over 32 tokens, int4 values per 32 channels.
KvTierFormat Kivi(int64_t d) {
  return {
      .k = {.codec = KvCodec::kInt, .bits = 4, .grouping = KvGrouping::kPerChannel, .group = 32},
      .v = {.codec = KvCodec::kInt, .bits = 4, .grouping = KvGrouping::kPerToken, .group = 32},
      .head_dim = static_cast<int32_t>(d),
      .page_bytes = 8192};
}

// kvcomp's format: Huffman-coded units of 32 tokens.
KvTierFormat Coded(int64_t d) {
  return {.k = {.codec = KvCodec::kInt,
                .bits = 8,
                .grouping = KvGrouping::kPerChannel,
                .group = 32,
                .levels = 5},
          .v = {.codec = KvCodec::kInt, .bits = 8, .grouping = KvGrouping::kPerToken, .levels = 7},
          .head_dim = static_cast<int32_t>(d),
          .page_bytes = 8192,
          .huffman_bits = 2.4f};
}

class PagedAttentionTest : public testing::OpTest<Op::kPagedAttention> {};

TEST_P(PagedAttentionTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {
      Case{1, 9, 3, 64, 1, 5, true},          Case{1, 8, 2, 128, 40, 3, true},
      Case{2, 4, 4, 32, 2, 4, false},         Case{1, 16, 1, 64, 3, 9, true},
      Case{7, 9, 3, 64, 20, 3, true},         Case{3, 6, 3, 64, 3, 0, false},
      Case{8, 6, 3, 64, 5, 0, false},         Case{1, 9, 3, 64, 1, 5, false, true},
      Case{2, 8, 2, 128, 40, 4, false, true}, Case{1, 32, 8, 128, 3, 3, false, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "q_tokens=" << c.q_tokens << " heads=" << c.heads << "/"
                                      << c.kv_heads << " d=" << c.head_dim << " recent=" << c.recent
                                      << " kivi=" << c.kivi << " seed=" << seed);
    // Tier formats: f16 only, int8/int4 high, int2 low and Huffman-coded, or KIVI int4.
    std::vector<KvTierFormat> formats;
    if (c.kivi) {
      formats = {Kivi(c.head_dim)};
    } else if (c.two_tiers) {
      formats = {High(c.head_dim), Low(c.head_dim), Coded(c.head_dim)};
    } else {
      formats = {{.head_dim = static_cast<int32_t>(c.head_dim), .page_bytes = 4096}};
    }
    std::vector<KvPageLayout> layouts;
    for (const KvTierFormat& f : formats) {
      auto l = ComputePageLayout(f);
      ASSERT_TRUE(l.ok()) << l.status();
      layouts.push_back(*l);
    }
    // Codebooks of the coded tier from rows like the pages'.
    std::vector<KvCodebooks> codebooks(formats.size());
    std::unique_ptr<testing::OwnedCodebooks> books;
    if (c.two_tiers) {
      const std::vector<float> k = testing::RandomFloats(rng, 256 * c.head_dim, -2, 2);
      const std::vector<float> v = testing::RandomFloats(rng, 256 * c.head_dim, -2, 2);
      auto b = testing::CodebooksFromRows(formats[2], k.data(), v.data(), 256);
      ASSERT_TRUE(b.ok()) << b.status();
      books = std::move(*b);
      codebooks[2] = books->view();
    }
    // Pages per kv-head: random count (possibly none), random tier, ragged fill, dead slots.
    std::vector<std::vector<uint8_t>> page_bytes;
    std::vector<KvPageRef> pages;
    std::vector<int32_t> offsets = {0};
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      const int64_t n = c.max_pages == 0 ? 0 : static_cast<int64_t>(rng() % (c.max_pages + 1));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t tier = static_cast<int32_t>(rng() % formats.size());
        const KvTierFormat& f = formats[tier];
        const KvPageLayout& l = layouts[tier];
        const int64_t groups = l.tokens / l.token_group;
        int64_t slots = l.token_group * (1 + static_cast<int64_t>(rng() % groups));
        std::vector<float> k = testing::RandomFloats(rng, slots * c.head_dim, -2, 2);
        std::vector<float> v = testing::RandomFloats(rng, slots * c.head_dim, -2, 2);
        std::vector<uint8_t> bytes(f.page_bytes, 0);
        if (f.huffman_bits > 0) {
          auto written = testing::RefCodedWrite(f, codebooks[tier], k.data(), v.data(), slots, 0,
                                                bytes.data());
          ASSERT_TRUE(written.ok()) << written.status();
          slots = *written;
        } else {
          ref::KvQuantize({.k = k.data(),
                           .v = v.data(),
                           .stride = c.head_dim,
                           .tokens = slots,
                           .format = f,
                           .layout = l,
                           .page = bytes.data()});
        }
        uint64_t* valid = reinterpret_cast<uint64_t*>(bytes.data() + l.valid);
        for (int64_t s = 0; s < slots; ++s) {
          if (rng() % 5 == 0) valid[s / 64] &= ~(uint64_t{1} << (s % 64));  // evicted
        }
        page_bytes.push_back(std::move(bytes));
        pages.push_back({.data = nullptr, .slots = static_cast<int32_t>(slots), .tier = tier});
      }
      offsets.push_back(static_cast<int32_t>(pages.size()));
    }
    const int64_t recent = c.recent + c.q_tokens - 1;
    std::vector<float> q = testing::RandomFloats(rng, c.q_tokens * c.heads * c.head_dim, -2, 2);
    std::vector<float> rk = testing::RandomFloats(rng, recent * c.kv_heads * c.head_dim, -2, 2);
    std::vector<float> rv = testing::RandomFloats(rng, recent * c.kv_heads * c.head_dim, -2, 2);
    for (size_t i = 0; i < pages.size(); ++i) pages[i].data = page_bytes[i].data();
    PagedAttentionParams p{.q = q.data(),
                           .out = nullptr,
                           .q_tokens = c.q_tokens,
                           .heads = c.heads,
                           .kv_heads = c.kv_heads,
                           .head_dim = c.head_dim,
                           .scale = 1.f / std::sqrt(static_cast<float>(c.head_dim)),
                           .formats = formats.data(),
                           .layouts = layouts.data(),
                           .codebooks = codebooks.data(),
                           .tier_count = static_cast<int32_t>(formats.size()),
                           .pages = pages.data(),
                           .page_offsets = offsets.data(),
                           .recent_k = rk.data(),
                           .recent_v = rv.data(),
                           .recent_tokens = recent};
    std::vector<float> want(q.size());
    p.out = want.data();
    // Key scores on two cases of three, summed over a kv-head's query heads or kept per query
    // head; they start from nonzero values, since they add up.
    const int64_t index = &c - &*cases.begin();
    const bool scores = index % 3 != 2;
    p.scores_per_head = index % 3 == 1;
    const int64_t g = c.heads / c.kv_heads, rows = p.scores_per_head ? g : 1;
    int64_t total_slots = 0;
    for (const KvPageRef& r : pages) total_slots += r.slots;
    std::vector<float> want_ps =
        testing::RandomFloats(rng, std::max<int64_t>(1, rows * total_slots), 0, 1);
    std::vector<float> want_rs =
        testing::RandomFloats(rng, (p.scores_per_head ? c.heads : c.kv_heads) * recent, 0, 1);
    const std::vector<float> ps0 = want_ps, rs0 = want_rs;
    if (scores) {
      p.page_scores = want_ps.data();
      p.recent_scores = want_rs.data();
    }
    ASSERT_TRUE(ref::PagedAttention(p).ok());

    // Device copies of everything the kernel reads from device memory.
    std::vector<GuardedBuffer> device_pages;
    std::vector<KvPageRef> device_refs = pages;
    for (size_t i = 0; i < pages.size(); ++i) {
      auto b = GuardedBuffer::Create(*backend_, page_bytes[i].size() / 4);
      ASSERT_TRUE(b.ok());
      std::vector<float> words(page_bytes[i].size() / 4);
      std::memcpy(words.data(), page_bytes[i].data(), page_bytes[i].size());
      ASSERT_TRUE(b->Upload(words).ok());
      device_refs[i].data = reinterpret_cast<const uint8_t*>(b->data());
      device_pages.push_back(std::move(*b));
    }
    auto qb = GuardedBuffer::Create(*backend_, q.size());
    auto kb = GuardedBuffer::Create(*backend_, std::max<size_t>(1, rk.size()));
    auto vb = GuardedBuffer::Create(*backend_, std::max<size_t>(1, rv.size()));
    auto ob = GuardedBuffer::Create(*backend_, q.size());
    ASSERT_TRUE(qb.ok() && kb.ok() && vb.ok() && ob.ok());
    ASSERT_TRUE(qb->Upload(q).ok() && kb->Upload(rk).ok() && vb->Upload(rv).ok());
    p.q = qb->data();
    p.recent_k = kb->data();
    p.recent_v = vb->data();
    p.out = ob->data();
    p.pages = device_refs.data();
    auto psb = GuardedBuffer::Create(*backend_, ps0.size());
    auto rsb = GuardedBuffer::Create(*backend_, rs0.size());
    ASSERT_TRUE(psb.ok() && rsb.ok());
    ASSERT_TRUE(psb->Upload(ps0).ok() && rsb->Upload(rs0).ok());
    if (scores) {
      p.page_scores = psb->data();
      p.recent_scores = rsb->data();
    }
    ASSERT_TRUE(backend_->PagedAttention(p).ok());
    auto got = ob->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {2e-5f}, 2e-4f, "paged attention");
    if (scores) {
      auto got_ps = psb->DownloadChecked();
      auto got_rs = rsb->DownloadChecked();
      ASSERT_TRUE(got_ps.ok() && got_rs.ok());
      testing::ExpectNear(*got_ps, want_ps, {2e-5f}, 2e-5f, "page scores");
      testing::ExpectNear(*got_rs, want_rs, {2e-5f}, 2e-5f, "recent scores");
      // Each query head spends a weight of 1 in all: the scores grew by q_tokens * heads.
      double added = 0;
      for (size_t i = 0; i < ps0.size() && total_slots > 0; ++i) added += want_ps[i] - ps0[i];
      for (size_t i = 0; i < rs0.size(); ++i) added += want_rs[i] - rs0[i];
      EXPECT_NEAR(added, static_cast<double>(c.q_tokens * c.heads), 1e-3);
      if (p.scores_per_head) {  // and each query head's own row grew by q_tokens
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t kvh = h / g, hi = h % g;
          double mine = 0;
          for (int32_t i = offsets[kvh]; i < offsets[kvh + 1]; ++i) {
            int64_t first = 0;
            for (int32_t j = 0; j < i; ++j) first += pages[j].slots;
            for (int64_t s = first; s < first + pages[i].slots; ++s) {
              mine += want_ps[hi * total_slots + s] - ps0[hi * total_slots + s];
            }
          }
          for (int64_t r = 0; r < recent; ++r) {
            mine += want_rs[h * recent + r] - rs0[h * recent + r];
          }
          EXPECT_NEAR(mine, static_cast<double>(c.q_tokens), 1e-3) << "query head " << h;
        }
      }
    }
  }
}

TEST_P(PagedAttentionTest, RejectsPagesOutsideTheirTier) {
  const KvTierFormat f{.head_dim = 64, .page_bytes = 4096};
  auto l = ComputePageLayout(f);
  ASSERT_TRUE(l.ok());
  std::vector<uint8_t> page(4096);
  float x[64 * 2] = {};
  const KvPageRef ref{.data = page.data(), .slots = l->tokens + 1, .tier = 0};
  const int32_t offsets[] = {0, 1};
  const absl::Status st = backend_->PagedAttention({.q = x,
                                                    .out = x,
                                                    .q_tokens = 1,
                                                    .heads = 1,
                                                    .kv_heads = 1,
                                                    .head_dim = 64,
                                                    .formats = &f,
                                                    .layouts = &*l,
                                                    .tier_count = 1,
                                                    .pages = &ref,
                                                    .page_offsets = offsets,
                                                    .recent_k = x,
                                                    .recent_v = x,
                                                    .recent_tokens = 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

SLUICE_INSTANTIATE_OP_TEST(PagedAttentionTest);

}  // namespace
}  // namespace sluice::kernels
