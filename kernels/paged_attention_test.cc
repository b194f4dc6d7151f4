// Attention over compressed pages on every backend against ref: mixed tiers, ragged page fill,
// dead (evicted) slots, heads with no pages, decode and multi-query runs, GQA groups.
#include "kernels/ref/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
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

// A page of format f with random keys and values: ragged fill (a random number of token
// groups, or as many coded units as fit), about one slot in five evicted. *slots: slots written.
absl::StatusOr<std::vector<uint8_t>> RandomPage(std::mt19937_64& rng, const KvTierFormat& f,
                                                const KvPageLayout& l, const KvCodebooks& books,
                                                int32_t* slots) {
  const int64_t d = f.head_dim;
  const int64_t groups = l.tokens / l.token_group;
  int64_t n = l.token_group * (1 + static_cast<int64_t>(rng() % groups));
  std::vector<float> k = testing::RandomFloats(rng, n * d, -2, 2);
  std::vector<float> v = testing::RandomFloats(rng, n * d, -2, 2);
  std::vector<uint8_t> bytes(f.page_bytes, 0);
  if (f.huffman_bits > 0) {
    auto written = testing::RefCodedWrite(f, books, k.data(), v.data(), n, 0, bytes.data());
    if (!written.ok()) return written.status();
    n = *written;
  } else {
    ref::KvQuantize({.k = HostView(k),
                     .v = HostView(v),
                     .stride = d,
                     .tokens = n,
                     .format = f,
                     .layout = l,
                     .page = HostView(bytes)});
  }
  uint64_t* valid = reinterpret_cast<uint64_t*>(bytes.data() + l.valid);
  for (int64_t s = 0; s < n; ++s) {
    if (rng() % 5 == 0) valid[s / 64] &= ~(uint64_t{1} << (s % 64));  // evicted
  }
  *slots = static_cast<int32_t>(n);
  return bytes;
}

// The tiers of a case: f16 only, int8/int4 high, int2 low and Huffman-coded (codebooks from
// rows like the pages'), or KIVI int4.
struct Tiers {
  std::vector<KvTierFormat> formats;
  std::vector<KvPageLayout> layouts;
  std::vector<KvCodebooks> codebooks;
  std::unique_ptr<testing::OwnedCodebooks> books;
};
// `power` > 1 draws the codebooks' sample rows as sign(x) |x|^power (codes crowd the middle
// levels): another histogram, other code lengths.
absl::StatusOr<Tiers> MakeTiers(std::mt19937_64& rng, const Case& c, float power = 1.f) {
  Tiers t;
  if (c.kivi) {
    t.formats = {Kivi(c.head_dim)};
  } else if (c.two_tiers) {
    t.formats = {High(c.head_dim), Low(c.head_dim), Coded(c.head_dim)};
  } else {
    t.formats = {{.head_dim = static_cast<int32_t>(c.head_dim), .page_bytes = 4096}};
  }
  for (const KvTierFormat& f : t.formats) {
    auto l = ComputePageLayout(f);
    if (!l.ok()) return l.status();
    t.layouts.push_back(*l);
  }
  t.codebooks.resize(t.formats.size());
  if (c.two_tiers) {
    std::vector<float> k = testing::RandomFloats(rng, 256 * c.head_dim, -2, 2);
    std::vector<float> v = testing::RandomFloats(rng, 256 * c.head_dim, -2, 2);
    for (std::vector<float>* x : {&k, &v}) {
      for (float& e : *x) e = std::copysign(std::pow(std::fabs(e), power), e);
    }
    auto b = testing::CodebooksFromRows(t.formats[2], k.data(), v.data(), 256);
    if (!b.ok()) return b.status();
    t.books = std::move(*b);
    t.codebooks[2] = t.books->view();
  }
  return t;
}

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
    auto tiers = MakeTiers(rng, c);
    ASSERT_TRUE(tiers.ok()) << tiers.status();
    const std::vector<KvTierFormat>& formats = tiers->formats;
    const std::vector<KvPageLayout>& layouts = tiers->layouts;
    const std::vector<KvCodebooks>& codebooks = tiers->codebooks;
    // Pages per kv-head: random count (possibly none), random tier, ragged fill, dead slots.
    std::vector<std::vector<uint8_t>> page_bytes;
    std::vector<KvPageRef> pages;
    std::vector<int32_t> offsets = {0};
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      const int64_t n = c.max_pages == 0 ? 0 : static_cast<int64_t>(rng() % (c.max_pages + 1));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t tier = static_cast<int32_t>(rng() % formats.size());
        int32_t slots;
        auto bytes = RandomPage(rng, formats[tier], layouts[tier], codebooks[tier], &slots);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        page_bytes.push_back(std::move(*bytes));
        pages.push_back({.data = nullptr, .slots = slots, .tier = tier});
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

// A decode step's batch in one call: each sequence must come out as its own PagedAttention call
// on the reference backend gives it (fresh random sequences, page ids scattered over a pool,
// some sequences without queries or pages, a prompt-length query run among decode ones).
class BatchPagedAttentionTest : public testing::OpTest<Op::kBatchPagedAttention> {};

TEST_P(BatchPagedAttentionTest, EachSequenceAsItsOwnCall) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  // q_tokens is each sequence's most; recent its most beyond its queries.
  // From the fifth on: decode steps (one query each), which the CUDA backend runs as one plan,
  // with the KIVI kernel and with the generic one; without key scores, then with them (summed
  // per kv-head, then per query head).
  const std::vector<Case> cases = {
      Case{3, 9, 3, 64, 20, 4, true},         Case{1, 8, 2, 128, 70, 3, false, true},
      Case{6, 4, 4, 32, 5, 3, false},         Case{2, 9, 3, 64, 3, 5, true},
      Case{1, 8, 2, 128, 70, 3, false, true}, Case{1, 9, 3, 64, 20, 4, true},
      Case{1, 8, 2, 128, 70, 3, false, true}, Case{1, 9, 3, 64, 20, 4, true}};
  for (const Case& c : cases) {
    const int64_t index = &c - &*cases.begin();
    const bool decode_step = index >= 4;
    const bool scores = (index != 2 && !decode_step) || index >= 6;
    const bool per_head = index == 3 || index == 7;
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 6);
    SCOPED_TRACE(::testing::Message()
                 << "case " << index << " batch " << batch << " seed " << seed);
    auto tiers = MakeTiers(rng, c);
    ASSERT_TRUE(tiers.ok()) << tiers.status();
    const int32_t tier_count = static_cast<int32_t>(tiers->formats.size());
    int64_t page_bytes = 0;
    for (const KvTierFormat& f : tiers->formats)
      page_bytes = std::max<int64_t>(page_bytes, f.page_bytes);
    const int64_t d = c.head_dim, g = c.heads / c.kv_heads, lists = batch * c.kv_heads;
    // Pages, list by list and tier by tier, at scattered ids of a pool twice their number.
    std::vector<std::vector<uint8_t>> page_data;
    std::vector<int32_t> page_slots;
    std::vector<std::vector<int32_t>> list_pages(lists * tier_count);  // indexes into page_data
    for (int64_t i = 0; i < lists; ++i) {
      const int64_t n = static_cast<int64_t>(rng() % (c.max_pages + 1));
      for (int64_t j = 0; j < n; ++j) {
        const int32_t tier = static_cast<int32_t>(rng() % tier_count);
        int32_t slots;
        auto bytes = RandomPage(rng, tiers->formats[tier], tiers->layouts[tier],
                                tiers->codebooks[tier], &slots);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        list_pages[i * tier_count + tier].push_back(static_cast<int32_t>(page_data.size()));
        page_data.push_back(std::move(*bytes));
        page_slots.push_back(slots);
      }
    }
    const int32_t pool_pages = static_cast<int32_t>(2 * page_data.size() + 1);
    std::vector<int32_t> id_of(pool_pages);
    std::iota(id_of.begin(), id_of.end(), 0);
    std::shuffle(id_of.begin(), id_of.end(), rng);
    std::vector<uint8_t> pool(pool_pages * page_bytes, 0xA5);
    for (size_t i = 0; i < page_data.size(); ++i) {
      std::memcpy(pool.data() + id_of[i] * page_bytes, page_data[i].data(), page_data[i].size());
    }
    std::vector<int32_t> indptr[kMaxKvTiers], ids[kMaxKvTiers], slots[kMaxKvTiers];
    for (int32_t t = 0; t < tier_count; ++t) {
      indptr[t] = {0};
      for (int64_t i = 0; i < lists; ++i) {
        for (int32_t page : list_pages[i * tier_count + t]) {
          ids[t].push_back(id_of[page]);
          slots[t].push_back(page_slots[page]);
        }
        indptr[t].push_back(static_cast<int32_t>(ids[t].size()));
      }
    }
    // Queries, recent tokens and score regions per sequence; sequence 0 may have no query.
    std::vector<int32_t> q_indptr = {0};
    std::vector<int64_t> recent(batch), ps_at(batch), rs_at(batch);
    int64_t ps_size = 0, rs_size = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t q_tokens =
          decode_step ? 1 : static_cast<int64_t>(rng() % (c.q_tokens + 1)) + (b > 0 ? 1 : 0);
      q_indptr.push_back(q_indptr.back() + static_cast<int32_t>(std::min(q_tokens, c.q_tokens)));
      recent[b] = (q_indptr[b + 1] - q_indptr[b]) + static_cast<int64_t>(rng() % (c.recent + 1));
      int64_t seq_slots = 0;
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        for (int32_t t = 0; t < tier_count; ++t) {
          for (int32_t page : list_pages[(b * c.kv_heads + h) * tier_count + t]) {
            seq_slots += page_slots[page];
          }
        }
      }
      ps_at[b] = ps_size;
      rs_at[b] = rs_size;
      ps_size += (per_head ? g : 1) * seq_slots;
      rs_size += (per_head ? c.heads : c.kv_heads) * recent[b];
    }
    const int64_t rows = q_indptr.back();
    const std::vector<float> q = testing::RandomFloats(rng, rows * c.heads * d, -2, 2);
    std::vector<std::vector<float>> rk(batch), rv(batch);
    for (int64_t b = 0; b < batch; ++b) {
      rk[b] = testing::RandomFloats(rng, std::max<int64_t>(1, recent[b] * c.kv_heads * d), -2, 2);
      rv[b] = testing::RandomFloats(rng, std::max<int64_t>(1, recent[b] * c.kv_heads * d), -2, 2);
    }
    const std::vector<float> ps0 = testing::RandomFloats(rng, std::max<int64_t>(1, ps_size), 0, 1);
    const std::vector<float> rs0 = testing::RandomFloats(rng, std::max<int64_t>(1, rs_size), 0, 1);

    // The oracle: each sequence alone on the reference backend.
    std::vector<float> want(std::max<int64_t>(1, rows * c.heads * d), 0.f);
    std::vector<float> want_ps = ps0, want_rs = rs0;
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<KvPageRef> refs;
      std::vector<int32_t> offsets = {0};
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        for (int32_t t = 0; t < tier_count; ++t) {
          for (int32_t page : list_pages[(b * c.kv_heads + h) * tier_count + t]) {
            refs.push_back({.data = page_data[page].data(), .slots = page_slots[page], .tier = t});
          }
        }
        offsets.push_back(static_cast<int32_t>(refs.size()));
      }
      const int64_t q0 = q_indptr[b];
      PagedAttentionParams one{.q = q.data() + q0 * c.heads * d,
                               .out = want.data() + q0 * c.heads * d,
                               .q_tokens = q_indptr[b + 1] - q0,
                               .heads = c.heads,
                               .kv_heads = c.kv_heads,
                               .head_dim = d,
                               .scale = 1.f / std::sqrt(static_cast<float>(d)),
                               .formats = tiers->formats.data(),
                               .layouts = tiers->layouts.data(),
                               .codebooks = tiers->codebooks.data(),
                               .tier_count = tier_count,
                               .pages = refs.data(),
                               .page_offsets = offsets.data(),
                               .recent_k = rk[b].data(),
                               .recent_v = rv[b].data(),
                               .recent_tokens = recent[b],
                               .scores_per_head = per_head};
      if (scores) {
        one.page_scores = want_ps.data() + ps_at[b];
        one.recent_scores = want_rs.data() + rs_at[b];
      }
      ASSERT_TRUE(ref::PagedAttention(one).ok());
    }

    // The batch on the backend under test, everything it reads on its device.
    auto pool_b = GuardedBuffer::Create(*backend_, pool.size() / 4);
    auto qb = GuardedBuffer::Create(*backend_, std::max<size_t>(1, q.size()));
    auto ob = GuardedBuffer::Create(*backend_, want.size());
    auto psb = GuardedBuffer::Create(*backend_, ps0.size());
    auto rsb = GuardedBuffer::Create(*backend_, rs0.size());
    ASSERT_TRUE(pool_b.ok() && qb.ok() && ob.ok() && psb.ok() && rsb.ok());
    std::vector<float> pool_words(pool.size() / 4);
    std::memcpy(pool_words.data(), pool.data(), pool.size());
    ASSERT_TRUE(pool_b->Upload(pool_words).ok() && psb->Upload(ps0).ok() && rsb->Upload(rs0).ok());
    if (!q.empty()) {
      ASSERT_TRUE(qb->Upload(q).ok());
    }
    std::vector<GuardedBuffer> recent_buffers;
    const MemorySpace space = backend_->memory_space();
    std::vector<BufferView<const float>> rk_view(batch), rv_view(batch);
    for (int64_t b = 0; b < batch; ++b) {
      for (auto [src, dst] : {std::pair{&rk[b], &rk_view[b]}, std::pair{&rv[b], &rv_view[b]}}) {
        auto buf = GuardedBuffer::Create(*backend_, src->size());
        ASSERT_TRUE(buf.ok() && buf->Upload(*src).ok());
        *dst = {.data = buf->data(), .size = static_cast<int64_t>(src->size()), .space = space};
        recent_buffers.push_back(std::move(*buf));
      }
    }
    const int64_t q_size = rows * c.heads * d;
    BatchPagedAttentionParams p{.batch = batch,
                                .q_indptr = q_indptr.data(),
                                .q = {.data = qb->data(), .size = q_size, .space = space},
                                .out = {.data = ob->data(), .size = q_size, .space = space},
                                .heads = c.heads,
                                .kv_heads = c.kv_heads,
                                .head_dim = d,
                                .scale = 1.f / std::sqrt(static_cast<float>(d)),
                                .formats = tiers->formats.data(),
                                .layouts = tiers->layouts.data(),
                                .codebooks = tiers->codebooks.data(),
                                .tier_count = tier_count,
                                .pool = {.data = reinterpret_cast<const uint8_t*>(pool_b->data()),
                                         .size = pool_pages * page_bytes,
                                         .space = space},
                                .page_bytes = page_bytes,
                                .recent_k = rk_view.data(),
                                .recent_v = rv_view.data(),
                                .recent_tokens = recent.data(),
                                .scores_per_head = per_head};
    for (int32_t t = 0; t < tier_count; ++t) {
      p.tables[t] = {.indptr = indptr[t].data(), .ids = ids[t].data(), .slots = slots[t].data()};
    }
    if (scores) {
      p.page_scores = {.data = psb->data(), .size = ps_size, .space = space};
      p.recent_scores = {.data = rsb->data(), .size = rs_size, .space = space};
      p.page_score_offsets = ps_at.data();
      p.recent_score_offsets = rs_at.data();
    }
    const absl::Status st = backend_->BatchPagedAttention(p);
    ASSERT_TRUE(st.ok()) << st;
    auto got = ob->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    if (rows > 0) testing::ExpectNear(*got, want, {2e-5f}, 2e-4f, "batch paged attention");
    if (scores) {
      auto got_ps = psb->DownloadChecked();
      auto got_rs = rsb->DownloadChecked();
      ASSERT_TRUE(got_ps.ok() && got_rs.ok());
      testing::ExpectNear(*got_ps, want_ps, {2e-5f}, 2e-5f, "page scores");
      testing::ExpectNear(*got_rs, want_rs, {2e-5f}, 2e-5f, "recent scores");
    }
  }
}

TEST_P(BatchPagedAttentionTest, RejectsTablesThatDoNotFit) {
  // Checked before any kernel runs, so host arrays serve every backend here.
  const KvTierFormat f{.head_dim = 64, .page_bytes = 4096};
  auto l = ComputePageLayout(f);
  ASSERT_TRUE(l.ok());
  const MemorySpace space = backend_->memory_space();
  std::vector<uint8_t> pool(2 * 4096);
  float x[64 * 2] = {};
  const BufferView<const float> recent[] = {{.data = x, .size = 64, .space = space}};
  const int64_t recent_tokens[] = {1};
  const int32_t q_indptr[] = {0, 1}, indptr[] = {0, 1}, slots[] = {1};
  int32_t id = 2;  // one past the pool
  BatchPagedAttentionParams p{.batch = 1,
                              .q_indptr = q_indptr,
                              .q = {.data = x, .size = 64, .space = space},
                              .out = {.data = x, .size = 64, .space = space},
                              .heads = 1,
                              .kv_heads = 1,
                              .head_dim = 64,
                              .formats = &f,
                              .layouts = &*l,
                              .tier_count = 1,
                              .pool = {.data = pool.data(), .size = 2 * 4096, .space = space},
                              .page_bytes = 4096,
                              .tables = {{.indptr = indptr, .ids = &id, .slots = slots}},
                              .recent_k = recent,
                              .recent_v = recent,
                              .recent_tokens = recent_tokens};
  auto expect_invalid = [&](std::string_view what) {
    const absl::Status st = backend_->BatchPagedAttention(p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), ::testing::HasSubstr(what)) << st;
  };
  expect_invalid("outside the pool");
  id = 1;
  const int32_t too_many[] = {l->tokens + 1};
  p.tables[0].slots = too_many;
  expect_invalid("sequence 0");
  p.tables[0].slots = slots;
  p.q.size = 63;  // one query row is 64 floats
  expect_invalid("q holds 63 elements");
  p.q.size = 64;
  p.out.space = space == MemorySpace::kHost ? MemorySpace::kDevice : MemorySpace::kHost;
  expect_invalid("this backend computes in");
}

// A decode step planned once (PlanBatchPagedAttention) and run layer by layer must give what
// each layer's call gives without the plan: several layers with their own pages, windows and
// Huffman codebooks in one pool, without key scores and then with them. The CUDA backend plans
// (one device plan for every layer); the host backends plan nothing. A call that is not the
// planned layer, scores put elsewhere than planned, or a plan of another backend, is refused.
TEST_P(BatchPagedAttentionTest, StepPlanRunsEachLayerAsItsOwnCall) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr int64_t kLayers = 3;
  for (const Case& c : {Case{1, 8, 2, 64, 20, 4, true}, Case{1, 8, 2, 128, 40, 3, false, true}}) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 4);
    SCOPED_TRACE(::testing::Message()
                 << "kivi " << c.kivi << " batch " << batch << " seed " << seed);
    std::vector<Tiers> tiers;  // per layer: the same formats, codebooks of their own
    for (int64_t l = 0; l < kLayers; ++l) {
      auto t = MakeTiers(rng, c, 1.f + 2.f * l);
      ASSERT_TRUE(t.ok()) << t.status();
      tiers.push_back(std::move(*t));
    }
    const int32_t tier_count = static_cast<int32_t>(tiers[0].formats.size());
    int64_t page_bytes = 0;
    for (const KvTierFormat& f : tiers[0].formats) {
      page_bytes = std::max<int64_t>(page_bytes, f.page_bytes);
    }
    const int64_t d = c.head_dim, lists = kLayers * batch * c.kv_heads;
    // Pages of every (layer, sequence, kv-head) list, tier by tier, packed into one pool.
    std::vector<uint8_t> pool;
    std::vector<int32_t> indptr[kMaxKvTiers], ids[kMaxKvTiers], slots[kMaxKvTiers];
    for (int32_t t = 0; t < tier_count; ++t) indptr[t] = {0};
    for (int64_t list = 0; list < lists; ++list) {
      const int64_t layer = list / (batch * c.kv_heads);
      const int64_t n = static_cast<int64_t>(rng() % (c.max_pages + 1));
      std::vector<int32_t> tier_of(n);
      for (int32_t& t : tier_of) t = static_cast<int32_t>(rng() % tier_count);
      for (int32_t t = 0; t < tier_count; ++t) {
        for (int32_t pt : tier_of) {
          if (pt != t) continue;
          int32_t written;
          auto bytes = RandomPage(rng, tiers[layer].formats[t], tiers[layer].layouts[t],
                                  tiers[layer].codebooks[t], &written);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          ids[t].push_back(static_cast<int32_t>(pool.size() / page_bytes));
          slots[t].push_back(written);
          bytes->resize(page_bytes, 0);
          pool.insert(pool.end(), bytes->begin(), bytes->end());
        }
        indptr[t].push_back(static_cast<int32_t>(ids[t].size()));
      }
    }
    pool.resize(std::max<size_t>(pool.size(), page_bytes), 0);
    const int64_t pool_pages = static_cast<int64_t>(pool.size()) / page_bytes;
    std::vector<int32_t> q_indptr(batch + 1);
    std::iota(q_indptr.begin(), q_indptr.end(), 0);
    std::vector<int64_t> recent(batch);
    for (int64_t& r : recent) r = 1 + static_cast<int64_t>(rng() % c.recent);

    const MemorySpace space = backend_->memory_space();
    auto pool_b = GuardedBuffer::Create(*backend_, pool.size() / 4);
    ASSERT_TRUE(pool_b.ok());
    std::vector<float> pool_words(pool.size() / 4);
    std::memcpy(pool_words.data(), pool.data(), pool.size());
    ASSERT_TRUE(pool_b->Upload(pool_words).ok());
    std::vector<GuardedBuffer> buffers;
    std::vector<BufferView<const float>> rk(kLayers * batch), rv(kLayers * batch);
    for (int64_t i = 0; i < kLayers * batch; ++i) {
      for (BufferView<const float>* view : {&rk[i], &rv[i]}) {
        const std::vector<float> x =
            testing::RandomFloats(rng, recent[i % batch] * c.kv_heads * d, -2, 2);
        auto buf = GuardedBuffer::Create(*backend_, x.size());
        ASSERT_TRUE(buf.ok() && buf->Upload(x).ok());
        *view = {.data = buf->data(), .size = static_cast<int64_t>(x.size()), .space = space};
        buffers.push_back(std::move(*buf));
      }
    }
    std::vector<KvCodebooks> codebooks;
    for (const Tiers& t : tiers)
      codebooks.insert(codebooks.end(), t.codebooks.begin(), t.codebooks.end());
    BatchPagedAttentionStep step{
        .layers = kLayers,
        .batch = {.batch = batch,
                  .q_indptr = q_indptr.data(),
                  .heads = c.heads,
                  .kv_heads = c.kv_heads,
                  .head_dim = d,
                  .scale = 1.f / std::sqrt(static_cast<float>(d)),
                  .formats = tiers[0].formats.data(),
                  .layouts = tiers[0].layouts.data(),
                  .codebooks = codebooks.data(),
                  .tier_count = tier_count,
                  .pool = {.data = reinterpret_cast<const uint8_t*>(pool_b->data()),
                           .size = pool_pages * page_bytes,
                           .space = space},
                  .page_bytes = page_bytes,
                  .recent_k = rk.data(),
                  .recent_v = rv.data(),
                  .recent_tokens = recent.data()}};
    for (int32_t t = 0; t < tier_count; ++t) {
      step.batch.tables[t] = {
          .indptr = indptr[t].data(), .ids = ids[t].data(), .slots = slots[t].data()};
    }
    auto plan = backend_->PlanBatchPagedAttention(step);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(*plan != nullptr, backend_->kind() == BackendKind::kCuda)
        << "the CUDA backend plans a decode step; the host backends have nothing to plan";

    const int64_t q_size = batch * c.heads * d;
    auto qb = GuardedBuffer::Create(*backend_, q_size);
    auto planned = GuardedBuffer::Create(*backend_, q_size);
    auto alone = GuardedBuffer::Create(*backend_, q_size);
    ASSERT_TRUE(qb.ok() && planned.ok() && alone.ok());
    for (int64_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE(::testing::Message() << "layer " << l);
      ASSERT_TRUE(qb->Upload(testing::RandomFloats(rng, q_size, -2, 2)).ok());
      BatchPagedAttentionParams p = LayerOfStep(step, l);
      p.q = {.data = qb->data(), .size = q_size, .space = space};
      p.out = {.data = alone->data(), .size = q_size, .space = space};
      absl::Status st = backend_->BatchPagedAttention(p);
      ASSERT_TRUE(st.ok()) << st;
      p.out.data = planned->data();
      p.plan = plan->get();
      st = backend_->BatchPagedAttention(p);
      ASSERT_TRUE(st.ok()) << st;
      auto got = planned->DownloadChecked();
      auto want = alone->DownloadChecked();
      ASSERT_TRUE(got.ok() && want.ok());
      testing::ExpectNear(*got, *want, {1e-6f}, 1e-6f, "planned layer");
      if (*plan != nullptr && l > 0) {
        p.layer = 0;  // layer l's pages, run as layer 0
        st = backend_->BatchPagedAttention(p);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        p.layer = l;
        // Key scores of a step planned without them.
        std::vector<int64_t> ps_at(batch), rs_at(batch);
        int64_t ps_size = 0, rs_size = 0;
        for (int64_t b = 0; b < batch; ++b) {
          ps_at[b] = ps_size;
          rs_at[b] = rs_size;
          for (int64_t h = 0; h < c.kv_heads; ++h) {
            const int64_t list = (l * batch + b) * c.kv_heads + h;
            for (int32_t t = 0; t < tier_count; ++t) {
              for (int32_t j = indptr[t][list]; j < indptr[t][list + 1]; ++j)
                ps_size += slots[t][j];
            }
          }
          rs_size += c.kv_heads * recent[b];
        }
        auto psb = GuardedBuffer::Create(*backend_, std::max<int64_t>(1, ps_size));
        auto rsb = GuardedBuffer::Create(*backend_, rs_size);
        ASSERT_TRUE(psb.ok() && rsb.ok());
        p.page_scores = {.data = psb->data(), .size = ps_size, .space = space};
        p.recent_scores = {.data = rsb->data(), .size = rs_size, .space = space};
        p.page_score_offsets = ps_at.data();
        p.recent_score_offsets = rs_at.data();
        st = backend_->BatchPagedAttention(p);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_THAT(st.message(), ::testing::HasSubstr("key scores")) << st;
      }
    }
    class Foreign : public BatchAttentionPlan {
     public:
      Foreign() : BatchAttentionPlan(nullptr) {}
    } foreign;
    BatchPagedAttentionParams p = LayerOfStep(step, 0);
    p.q = {.data = qb->data(), .size = q_size, .space = space};
    p.out = {.data = planned->data(), .size = q_size, .space = space};
    p.plan = &foreign;
    const absl::Status st = backend_->BatchPagedAttention(p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), ::testing::HasSubstr("another backend")) << st;

    // The step planned with key scores (per query head on the KIVI case), each layer's
    // sequences at their own offsets: outputs and scores as each layer's call gives them alone.
    const bool per_head = c.kivi;
    const int64_t group = per_head ? c.heads / c.kv_heads : 1;
    std::vector<int64_t> ps_at, rs_at, ps_size(kLayers), rs_size(kLayers);
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t b = 0; b < batch; ++b) {
        ps_at.push_back(ps_size[l]);
        rs_at.push_back(rs_size[l]);
        for (int64_t h = 0; h < c.kv_heads; ++h) {
          const int64_t list = (l * batch + b) * c.kv_heads + h;
          for (int32_t t = 0; t < tier_count; ++t) {
            for (int32_t j = indptr[t][list]; j < indptr[t][list + 1]; ++j) {
              ps_size[l] += group * slots[t][j];
            }
          }
        }
        rs_size[l] += group * c.kv_heads * recent[b];
      }
    }
    step.scores = true;
    step.batch.scores_per_head = per_head;
    step.page_score_offsets = ps_at.data();
    step.recent_score_offsets = rs_at.data();
    auto scored_plan = backend_->PlanBatchPagedAttention(step);
    ASSERT_TRUE(scored_plan.ok()) << scored_plan.status();
    EXPECT_EQ(*scored_plan != nullptr, backend_->kind() == BackendKind::kCuda);
    for (int64_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE(::testing::Message() << "scored layer " << l);
      ASSERT_TRUE(qb->Upload(testing::RandomFloats(rng, q_size, -2, 2)).ok());
      const std::vector<float> ps0 =
          testing::RandomFloats(rng, std::max<int64_t>(1, ps_size[l]), 0, 1);
      const std::vector<float> rs0 =
          testing::RandomFloats(rng, std::max<int64_t>(1, rs_size[l]), 0, 1);
      std::vector<std::vector<float>>
          results;  // out, page scores, recent scores; alone then planned
      for (const bool use_plan : {false, true}) {
        auto ps = GuardedBuffer::Create(*backend_, ps0.size());
        auto rs = GuardedBuffer::Create(*backend_, rs0.size());
        auto out = GuardedBuffer::Create(*backend_, q_size);
        ASSERT_TRUE(ps.ok() && rs.ok() && out.ok());
        ASSERT_TRUE(ps->Upload(ps0).ok() && rs->Upload(rs0).ok());
        BatchPagedAttentionParams sp = LayerOfStep(step, l);
        sp.q = {.data = qb->data(), .size = q_size, .space = space};
        sp.out = {.data = out->data(), .size = q_size, .space = space};
        sp.page_scores = {.data = ps->data(), .size = ps_size[l], .space = space};
        sp.recent_scores = {.data = rs->data(), .size = rs_size[l], .space = space};
        sp.page_score_offsets = ps_at.data() + l * batch;
        sp.recent_score_offsets = rs_at.data() + l * batch;
        if (use_plan) sp.plan = scored_plan->get();
        const absl::Status scored = backend_->BatchPagedAttention(sp);
        ASSERT_TRUE(scored.ok()) << scored;
        for (GuardedBuffer* buf : {&*out, &*ps, &*rs}) {
          auto got = buf->DownloadChecked();
          ASSERT_TRUE(got.ok()) << got.status();
          results.push_back(std::move(*got));
        }
        if (use_plan && *scored_plan != nullptr && batch > 1) {
          // Sequence 1's scores put anywhere else than planned are refused.
          std::vector<int64_t> moved(ps_at.begin() + l * batch, ps_at.begin() + (l + 1) * batch);
          moved[1] += 1;
          sp.page_score_offsets = moved.data();
          const absl::Status elsewhere = backend_->BatchPagedAttention(sp);
          EXPECT_EQ(elsewhere.code(), absl::StatusCode::kInvalidArgument) << elsewhere;
        }
      }
      testing::ExpectNear(results[3], results[0], {1e-6f}, 1e-6f, "planned scored layer");
      testing::ExpectNear(results[4], results[1], {1e-5f}, 1e-5f, "planned page scores");
      testing::ExpectNear(results[5], results[2], {1e-5f}, 1e-5f, "planned recent scores");
    }
  }
}

SLUICE_INSTANTIATE_OP_TEST(BatchPagedAttentionTest);

}  // namespace
}  // namespace sluice::kernels
