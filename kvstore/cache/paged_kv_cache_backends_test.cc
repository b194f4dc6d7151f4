// The paged KV cache on every backend (the CUDA one emulated in CI, real on a GPU), held to the
// same cache on the scalar reference backend: attention over a batch of sequences through
// prompts, flushes into pages and decode steps, a fork, and an export imported by another
// cache. On a device backend the pool, windows and scores are device memory, so under the
// emulation's ASan twin any host code touching them is reported.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device_buffer.h"
#include "kernels/ref/ref_backend.h"
#include "kernels/test_util/backend_cases.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/wire/kv_sequence_state.pb.h"

namespace sluice::kvstore {
namespace {

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 64;
constexpr int64_t kRow = kKvHeads * kDim, kQRow = kHeads * kDim;

absl::StatusOr<std::unique_ptr<PagedKvCache>> MakeCache(kernels::Backend& backend,
                                                        const std::string& preset) {
  absl::StatusOr<KvPreset> p = FindKvPreset(preset, kDim, 4096);
  if (!p.ok()) return p.status();
  return PagedKvCache::Create({.layers = kLayers,
                               .heads = kHeads,
                               .kv_heads = kKvHeads,
                               .head_dim = kDim,
                               .preset = *p,
                               .pages = 512},
                              backend);
}

std::vector<float> Random(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// One forward pass of `batch` on `cache`: the same host inputs uploaded to the backend (k, v:
// [layers][rows, kv_heads, dim]; q: [layers][rows, heads, dim]); returns every layer's output,
// [layers][rows, heads, dim].
absl::StatusOr<std::vector<float>> Step(kernels::Backend& backend, PagedKvCache& cache,
                                        const std::vector<model::StepEntry>& batch,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        const std::vector<float>& q) {
  int64_t rows = 0;
  for (const model::StepEntry& e : batch) rows += e.tokens;
  auto upload = [&](const std::vector<float>& host) -> absl::StatusOr<kernels::DeviceBuffer> {
    absl::StatusOr<kernels::DeviceBuffer> b =
        kernels::DeviceBuffer::Create(backend, host.size() * sizeof(float));
    if (b.ok()) {
      if (absl::Status st = b->Upload(host.data(), host.size() * sizeof(float)); !st.ok()) {
        return st;
      }
    }
    return b;
  };
  absl::StatusOr<kernels::DeviceBuffer> dk = upload(k), dv = upload(v), dq = upload(q);
  absl::StatusOr<kernels::DeviceBuffer> out =
      kernels::DeviceBuffer::Create(backend, kLayers * rows * kQRow * sizeof(float));
  for (const auto* b : {&dk, &dv, &dq, &out}) {
    if (!b->ok()) return b->status();
  }
  if (absl::Status st = cache.BeginStep(batch); !st.ok()) return st;
  for (int l = 0; l < kLayers; ++l) {
    absl::Status st =
        cache.Write(l, dk->as<float>() + l * rows * kRow, dv->as<float>() + l * rows * kRow);
    if (st.ok()) {
      st = cache.Attend(l, dq->as<float>() + l * rows * kQRow, out->as<float>() + l * rows * kQRow);
    }
    if (st.ok()) st = cache.LayerDone(l);
    if (!st.ok()) {
      cache.AbortStep();
      return st;
    }
  }
  if (absl::Status st = cache.Commit(); !st.ok()) return st;
  std::vector<float> host(kLayers * rows * kQRow);
  if (absl::Status st = out->Download(host.data(), host.size() * sizeof(float)); !st.ok()) {
    return st;
  }
  return host;
}

// The largest |a - b| over the outputs.
double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// One step of `batch` with the same random rows on `got` (on `backend`) and `want` (on `ref`):
// the outputs agree within `tol`.
void StepBoth(std::mt19937_64& rng, kernels::Backend& backend, PagedKvCache& got,
              kernels::Backend& ref, PagedKvCache& want, const std::vector<model::StepEntry>& batch,
              double tol) {
  int64_t rows = 0;
  for (const model::StepEntry& e : batch) rows += e.tokens;
  const std::vector<float> k = Random(rng, kLayers * rows * kRow);
  const std::vector<float> v = Random(rng, kLayers * rows * kRow);
  const std::vector<float> q = Random(rng, kLayers * rows * kQRow);
  absl::StatusOr<std::vector<float>> a = Step(backend, got, batch, k, v, q);
  absl::StatusOr<std::vector<float>> b = Step(ref, want, batch, k, v, q);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
  if (a.ok() && b.ok()) {
    EXPECT_LE(MaxDiff(*a, *b), tol);
  }
}

// A transport's part in a move: allocates `pages.size()` pages in `to`'s pool and copies the
// bytes of `from`'s `pages` into them (`from` on `backend`; `to` on it too, or on a host backend
// when `to_host`). Returns the new ids, in order.
std::vector<PageId> CopyPages(kernels::Backend& backend, const PagedKvCache& from,
                              const std::vector<PageId>& pages, PagedKvCache& to, bool to_host) {
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  EXPECT_TRUE(
      to.mutable_pool().Allocate({static_cast<int32_t>(pages.size())}, &offsets, &ids).ok());
  std::vector<kernels::Backend::Copy> copies;
  for (size_t i = 0; i < ids.size(); ++i) {
    copies.push_back({.dst = to.mutable_pool().data(ids[i]),
                      .src = from.pool().data(pages[i]),
                      .bytes = static_cast<size_t>(from.pool().page_bytes())});
  }
  for (const kernels::Backend::Copy& c : copies) {
    if (to_host) EXPECT_TRUE(backend.CopyToHost(c.dst, c.src, c.bytes).ok());
  }
  if (!to_host) EXPECT_TRUE(backend.CopyOnDevice(copies).ok());
  return ids;
}

class PagedKvCacheBackendsTest : public ::testing::TestWithParam<kernels::testing::BackendCase> {
 protected:
  void SetUp() override {
    auto backend = GetParam().create();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
  }
  std::unique_ptr<kernels::Backend> backend_;
  kernels::RefBackend ref_;
};

// Presets whose pages the cache builds on any backend and whose choices do not depend on
// attention scores (which differ between backends in the last bits).
const char* const kPresets[] = {"fp16", "int8", "kivi4", "kivi2", "sluice", "sinks"};

TEST_P(PagedKvCacheBackendsTest, MatchesTheReferenceBackendsCache) {
  const uint64_t seed = kernels::testing::TestSeed();
  for (const std::string preset : kPresets) {
    SCOPED_TRACE(testing::Message() << preset << " seed=" << seed);
    std::mt19937_64 rng(seed);
    auto got = MakeCache(*backend_, preset);
    auto want = MakeCache(ref_, preset);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    // Quantization may round a value to the neighbouring level on one backend and not the
    // other; the outputs stay within a level's weight. A wrong page, slot, window or valid
    // bit moves them by O(1).
    const double tol = preset == "fp16" ? 1e-3 : 0.08;
    auto both = [&](PagedKvCache& g, PagedKvCache& w, const std::vector<model::StepEntry>& batch) {
      StepBoth(rng, *backend_, g, ref_, w, batch, tol);
    };
    for (PagedKvCache* c : {got->get(), want->get()}) {
      for (int64_t seq : {1, 2, 3}) ASSERT_TRUE(c->AddSequence(seq, 1024).ok());
    }
    // Prompts of different lengths in one step, past every preset's window; then decode steps
    // that flush token groups into pages.
    both(**got, **want,
         {{.seq = 1, .tokens = 200}, {.seq = 2, .tokens = 37}, {.seq = 3, .tokens = 161}});
    for (int i = 0; i < 40; ++i) {
      both(**got, **want,
           {{.seq = 1, .tokens = 1}, {.seq = 2, .tokens = 1}, {.seq = 3, .tokens = 1}});
    }
    const KvCacheStats gs = (*got)->Stats(), ws = (*want)->Stats();
    EXPECT_EQ(gs.pages.pages_high, ws.pages.pages_high);
    EXPECT_EQ(gs.pages.live_slots, ws.pages.live_slots);
    EXPECT_EQ(gs.residual_tokens, ws.residual_tokens);
    EXPECT_GT(gs.pages.live_slots, 0);
    // A fork shares full pages and copies the rest; both go on.
    for (PagedKvCache* c : {got->get(), want->get()}) ASSERT_TRUE(c->ForkSequence(1, 4, 1024).ok());
    for (int i = 0; i < 3; ++i) {
      both(**got, **want, {{.seq = 4, .tokens = 2}, {.seq = 1, .tokens = 1}});
    }
    // Sequence 3 leaves for another cache on the same backend and goes on there.
    auto moved = MakeCache(*backend_, preset);
    ASSERT_TRUE(moved.ok()) << moved.status();
    auto exported = (*got)->ExportSequence(3);
    ASSERT_TRUE(exported.ok()) << exported.status();
    const int64_t count = static_cast<int64_t>(exported->pages.size());
    const std::vector<PageId> ids = CopyPages(*backend_, **got, exported->pages, **moved, false);
    auto imported = (*moved)->ImportSequence(3, 1024, exported->state, ids);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(*imported, count);
    ASSERT_TRUE((*got)->RemoveSequence(3).ok());
    for (int i = 0; i < 2; ++i) both(**moved, **want, {{.seq = 3, .tokens = 1}});
    // A page whose bytes changed on the way fails its checksum.
    if (count > 0) {
      auto again = (*moved)->ExportSequence(3);
      ASSERT_TRUE(again.ok()) << again.status();
      auto other = MakeCache(*backend_, preset);
      ASSERT_TRUE(other.ok());
      const std::vector<PageId> ids2 = CopyPages(*backend_, **moved, again->pages, **other, false);
      uint8_t* byte = (*other)->mutable_pool().data(ids2[0]) + 3;
      uint8_t flip = 0;
      ASSERT_TRUE(backend_->CopyToHost(&flip, byte, 1).ok());
      flip ^= 0x5a;
      ASSERT_TRUE(backend_->CopyToDevice(byte, &flip, 1).ok());
      EXPECT_EQ((*other)->ImportSequence(3, 1024, again->state, ids2).status().code(),
                absl::StatusCode::kDataLoss);
      ASSERT_TRUE((*other)->mutable_pool().Free(ids2).ok());
    }
    // Every page goes back.
    for (int64_t seq : {1, 2, 4}) ASSERT_TRUE((*got)->RemoveSequence(seq).ok());
    ASSERT_TRUE((*moved)->RemoveSequence(3).ok());
    EXPECT_EQ((*got)->pool().used_pages(), 0);
    EXPECT_EQ((*moved)->pool().used_pages(), 0);
  }
}

// A sequence moving as it does between workers whose transport reaches host memory only: the
// sender's pages go to a host copy laid out as its pool (CopyPagesToHost), the "transport"
// copies them to the receiver's host copy at the pages it reserved, the receiver brings them
// into its pool (CopyPagesFromHost) and imports the state. The receiver's pages had another
// sequence in them just before, whose valid bits the device may still owe; the sequence goes on
// there as the reference backend's cache does, and every page returns.
TEST_P(PagedKvCacheBackendsTest, MovesThroughHostCopiesOfThePools) {
  const uint64_t seed = kernels::testing::TestSeed();
  for (const std::string preset : {"fp16", "sluice", "kivi2"}) {
    SCOPED_TRACE(testing::Message() << preset << " seed=" << seed);
    std::mt19937_64 rng(seed);
    auto sender = MakeCache(*backend_, preset);
    auto receiver = MakeCache(*backend_, preset);
    auto want = MakeCache(ref_, preset);
    ASSERT_TRUE(sender.ok() && receiver.ok() && want.ok());
    const double tol = preset == "fp16" ? 1e-3 : 0.08;
    auto both = [&](PagedKvCache& g, const std::vector<model::StepEntry>& batch) {
      StepBoth(rng, *backend_, g, ref_, **want, batch, tol);
    };
    ASSERT_TRUE((*sender)->AddSequence(5, 1024).ok());
    ASSERT_TRUE((*want)->AddSequence(5, 1024).ok());
    both(**sender, {{.seq = 5, .tokens = 200}});
    for (int i = 0; i < 3; ++i) both(**sender, {{.seq = 5, .tokens = 1}});
    // The receiver's pool: a sequence wrote pages and left before its valid bits were synced.
    ASSERT_TRUE((*receiver)->AddSequence(9, 1024).ok());
    const std::vector<float> k9 = Random(rng, kLayers * 270 * kRow);
    const std::vector<float> q9 = Random(rng, kLayers * 270 * kQRow);
    ASSERT_TRUE(Step(*backend_, **receiver, {{.seq = 9, .tokens = 270}}, k9, k9, q9).ok());
    // Every other page is taken first, so the reservation below gets the pages it left.
    std::vector<int64_t> filler_offsets;
    std::vector<PageId> filler;
    ASSERT_TRUE((*receiver)
                    ->mutable_pool()
                    .Allocate({static_cast<int32_t>((*receiver)->pool().free_pages())},
                              &filler_offsets, &filler)
                    .ok());
    ASSERT_TRUE((*receiver)->RemoveSequence(9).ok());

    auto exported = (*sender)->ExportSequence(5);
    ASSERT_TRUE(exported.ok()) << exported.status();
    ASSERT_GT(exported->pages.size(), 0u);
    const size_t page_bytes = static_cast<size_t>((*sender)->pool().page_bytes());
    std::vector<uint8_t> sent((*sender)->pool().num_pages() * page_bytes, 0xee);
    std::vector<uint8_t> received((*receiver)->pool().num_pages() * page_bytes, 0xee);
    ASSERT_TRUE((*sender)->CopyPagesToHost(exported->pages, sent.data()).ok());
    std::vector<int64_t> offsets;
    std::vector<PageId> ids;
    ASSERT_TRUE((*receiver)
                    ->mutable_pool()
                    .Allocate({static_cast<int32_t>(exported->pages.size())}, &offsets, &ids)
                    .ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(&received[ids[i] * page_bytes], &sent[exported->pages[i] * page_bytes],
                  page_bytes);
    }
    ASSERT_TRUE((*receiver)->CopyPagesFromHost(ids, received.data()).ok());
    auto imported = (*receiver)->ImportSequence(5, 1024, exported->state, ids);
    ASSERT_TRUE(imported.ok()) << imported.status();
    ASSERT_TRUE((*sender)->RemoveSequence(5).ok());
    for (int i = 0; i < 40; ++i) both(**receiver, {{.seq = 5, .tokens = 1}});
    // Ids outside the pool are refused, naming the id.
    const PageId outside = static_cast<PageId>((*receiver)->pool().num_pages());
    const absl::Status bad = (*receiver)->CopyPagesFromHost({outside}, received.data());
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(bad.message().find(std::to_string(outside)), std::string::npos) << bad;
    ASSERT_TRUE((*receiver)->RemoveSequence(5).ok());
    ASSERT_TRUE((*receiver)->mutable_pool().Free(filler).ok());
    EXPECT_EQ((*sender)->pool().used_pages(), 0);
    EXPECT_EQ((*receiver)->pool().used_pages(), 0);
  }
}

// A copy of sequences `seqs` of `from` (on `backend`) in a cache on the reference backend: the
// same pages, windows and scores, through ExportSequence and ImportSequence.
std::unique_ptr<PagedKvCache> MirrorOnRef(kernels::Backend& backend, const PagedKvCache& from,
                                          kernels::Backend& ref, const std::string& preset,
                                          const std::vector<int64_t>& seqs) {
  auto mirror = MakeCache(ref, preset);
  EXPECT_TRUE(mirror.ok()) << mirror.status();
  if (!mirror.ok()) return nullptr;
  for (int64_t seq : seqs) {
    auto exported = from.ExportSequence(seq);
    EXPECT_TRUE(exported.ok()) << exported.status();
    if (!exported.ok()) return nullptr;
    const std::vector<PageId> ids = CopyPages(backend, from, exported->pages, **mirror, true);
    auto imported = (*mirror)->ImportSequence(seq, 1024, exported->state, ids);
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return nullptr;
  }
  return std::move(*mirror);
}

// The rows each sequence wrote, per layer: [position][kv_heads, dim].
using History = std::vector<std::vector<float>>;

// The largest error quantizing a row of `row` values with `spec` can make (a whole step of its
// codes over the row's range; f16 a rounding).
double StepOf(const kernels::KvQuantSpec& spec, const float* row, int64_t n) {
  if (spec.codec == kernels::KvCodec::kF16) return 1e-2;
  const auto [lo, hi] = std::minmax_element(row, row + n);
  return (*hi - *lo) / ((1 << spec.bits) - 1) + 1e-3;
}

// Every live slot of `seq`'s pages (read back from the backend) holds the token its position
// says, within what quantization, and a demotion's second quantization, can change: slots that
// compaction or demotion moved included.
void ExpectPagesHoldTheirTokens(kernels::Backend& backend, const PagedKvCache& cache, int64_t seq,
                                const History& k, const History& v) {
  auto exported = cache.ExportSequence(seq);
  ASSERT_TRUE(exported.ok()) << exported.status();
  KvSequenceState st;
  ASSERT_TRUE(st.ParseFromString(exported->state));
  const KvPreset& preset = cache.preset();
  const kernels::KvTierFormat formats[2] = {preset.high, preset.low.value_or(preset.high)};
  kernels::RefBackend ref;
  std::vector<uint8_t> page(cache.pool().page_bytes());
  std::vector<float> dk(kDim), dv(kDim);
  size_t next = 0;
  int64_t checked = 0;
  for (int64_t i = 0; i < st.lists_size(); ++i) {
    const int layer = static_cast<int>(i / kKvHeads);
    const int64_t h = i % kKvHeads;
    for (int t = 0; t < st.lists(i).tiers_size(); ++t) {
      const KvTierState& tier = st.lists(i).tiers(t);
      auto layout = kernels::ComputePageLayout(formats[t]);
      ASSERT_TRUE(layout.ok());
      int64_t at = 0;
      for (int32_t slots : tier.slots()) {
        const PageId id = exported->pages[next++];
        ASSERT_TRUE(backend.CopyToHost(page.data(), cache.pool().data(id), page.size()).ok());
        const uint64_t* valid = reinterpret_cast<const uint64_t*>(page.data() + layout->valid);
        for (int32_t j = 0; j < slots; ++j, ++at) {
          if (!((valid[j / 64] >> (j % 64)) & 1)) continue;
          ASSERT_TRUE(ref.KvDequantize({.page = kernels::HostView(page),
                                        .format = formats[t],
                                        .layout = *layout,
                                        .slot = j,
                                        .tokens = 1,
                                        .k = kernels::HostView(dk),
                                        .v = kernels::HostView(dv)})
                          .ok());
          const int64_t pos = tier.positions(static_cast<int>(at));
          const float* wk = &k[layer][pos * kRow + h * kDim];
          const float* wv = &v[layer][pos * kRow + h * kDim];
          // Low-tier tokens went through the high tier first (demoted) or straight in.
          double tol_k = StepOf(formats[t].k, wk, kDim), tol_v = StepOf(formats[t].v, wv, kDim);
          if (t == 1) {
            tol_k += StepOf(formats[0].k, wk, kDim);
            tol_v += StepOf(formats[0].v, wv, kDim);
          }
          for (int64_t c = 0; c < kDim; ++c) {
            ASSERT_LE(std::fabs(dk[c] - wk[c]), tol_k)
                << "list " << i << " tier " << t << " position " << pos << " channel " << c;
            ASSERT_LE(std::fabs(dv[c] - wv[c]), tol_v)
                << "list " << i << " tier " << t << " position " << pos << " channel " << c;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Policies that score: which tokens they keep depends on the last bits of each backend's
// attention scores, so the backend's cache is held to its own mirror on the reference backend
// before every step (same pages, windows and scores: the attention must agree), its pages to
// the rows written (every live slot holds its token), and to the reference backend's own cache
// in how many tokens every list keeps (h2o's budget).
TEST_P(PagedKvCacheBackendsTest, ScoringPoliciesAgreeWithTheirMirrorOnTheReference) {
  const uint64_t seed = kernels::testing::TestSeed();
  // LeanKV with thresholds and a window under which random rows take both tiers and demote.
  for (const std::string preset : {"h2o", "leankv-k8v4:alpha_high=1.5:alpha_low=0.6:residual=8",
                                   "leankv-k4v2:alpha_high=1.5:alpha_low=0.6:residual=8"}) {
    SCOPED_TRACE(testing::Message() << preset << " seed=" << seed);
    std::mt19937_64 rng(seed);
    auto got = MakeCache(*backend_, preset);
    auto want = MakeCache(ref_, preset);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    for (PagedKvCache* c : {got->get(), want->get()}) {
      for (int64_t seq : {1, 2}) ASSERT_TRUE(c->AddSequence(seq, 1024).ok());
    }
    std::vector<model::StepEntry> batch = {{.seq = 1, .tokens = 150}, {.seq = 2, .tokens = 90}};
    // Per sequence (index 1 and 2), the rows it wrote.
    std::vector<History> hk(3, History(kLayers)), hv(3, History(kLayers));
    for (int step = 0; step < 30; ++step) {
      int64_t rows = 0;
      for (const model::StepEntry& e : batch) rows += e.tokens;
      const std::vector<float> k = Random(rng, kLayers * rows * kRow);
      const std::vector<float> v = Random(rng, kLayers * rows * kRow);
      const std::vector<float> q = Random(rng, kLayers * rows * kQRow);
      for (int l = 0, row = 0; l < kLayers; ++l, row = 0) {
        for (const model::StepEntry& e : batch) {
          const int64_t from = (l * rows + row) * kRow, to = from + e.tokens * kRow;
          hk[e.seq][l].insert(hk[e.seq][l].end(), k.begin() + from, k.begin() + to);
          hv[e.seq][l].insert(hv[e.seq][l].end(), v.begin() + from, v.begin() + to);
          row += static_cast<int>(e.tokens);
        }
      }
      std::unique_ptr<PagedKvCache> mirror;
      if (step > 0) {
        mirror = MirrorOnRef(*backend_, **got, ref_, preset, {1, 2});
        ASSERT_NE(mirror, nullptr);
      }
      absl::StatusOr<std::vector<float>> a = Step(*backend_, **got, batch, k, v, q);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(Step(ref_, **want, batch, k, v, q).ok());
      if (mirror != nullptr) {
        absl::StatusOr<std::vector<float>> b = Step(ref_, *mirror, batch, k, v, q);
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_LE(MaxDiff(*a, *b), 0.08) << "step " << step;
      }
      if (preset == "h2o") {
        for (int64_t seq : {1, 2}) {
          for (int l = 0; l < kLayers; ++l) {
            for (int64_t h = 0; h < kKvHeads; ++h) {
              EXPECT_EQ((*got)->LiveTokens(seq, l, h)->size(),
                        (*want)->LiveTokens(seq, l, h)->size())
                  << "step " << step;
            }
          }
        }
      }
      for (int64_t seq : {1, 2}) {
        ExpectPagesHoldTheirTokens(*backend_, **got, seq, hk[seq], hv[seq]);
      }
      batch = {{.seq = 1, .tokens = 1}, {.seq = 2, .tokens = 1}};
    }
    const KvCacheStats st = (*got)->Stats();
    EXPECT_GT(st.compactions + st.demoted, 0) << "the policy never changed a page";
    if (preset == "h2o") EXPECT_GT(st.compactions, 0) << "h2o's evictions never compacted";
    for (int64_t seq : {1, 2}) ASSERT_TRUE((*got)->RemoveSequence(seq).ok());
    EXPECT_EQ((*got)->pool().used_pages(), 0);
  }
}

TEST_P(PagedKvCacheBackendsTest, DevicePresetsItCannotBuildAreRefusedByName) {
  for (const std::string preset : {"kvcomp", "snapkv", "pyramid", "minikv"}) {
    auto cache = MakeCache(*backend_, preset);
    if (backend_->memory_space() == kernels::MemorySpace::kHost) {
      EXPECT_TRUE(cache.ok()) << preset << ": " << cache.status();
    } else {
      EXPECT_EQ(cache.status().code(), absl::StatusCode::kUnimplemented) << preset;
      EXPECT_NE(cache.status().message().find(preset), std::string::npos) << cache.status();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, PagedKvCacheBackendsTest,
                         ::testing::ValuesIn(kernels::testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kvstore
