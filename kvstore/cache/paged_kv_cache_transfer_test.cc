// A sequence exported from one cache and imported into another (its pages copied into pages of
// the other pool, as a transport would) goes on exactly as it would have in the first cache,
// for every preset; bad states and damaged pages are refused with nothing changed or leaked.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/kv_sequence_state.pb.h"

namespace sluice::kvstore {
namespace {

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 32;
constexpr int64_t kRow = kKvHeads * kDim;

std::vector<float> Random(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

std::unique_ptr<PagedKvCache> MakeCache(kernels::Backend& backend, std::string_view preset) {
  auto p = FindKvPreset(preset, kDim, 4096);
  EXPECT_TRUE(p.ok()) << p.status();
  auto c = PagedKvCache::Create({.layers = kLayers,
                                 .heads = kHeads,
                                 .kv_heads = kKvHeads,
                                 .head_dim = kDim,
                                 .preset = *p,
                                 .pages = 512},
                                backend);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// n tokens of random K/V into every layer, attention in every layer, commit, as the model's
// forward pass does; returns the attention outputs of all layers.
std::vector<float> Step(PagedKvCache& cache, int64_t seq, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> outs;
  EXPECT_TRUE(cache.BeginStep({{.seq = seq, .tokens = n}}).ok());
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<float> k = Random(rng, n * kRow), v = Random(rng, n * kRow);
    const std::vector<float> q = Random(rng, n * kHeads * kDim);
    std::vector<float> out(n * kHeads * kDim);
    EXPECT_TRUE(cache.Write(l, k.data(), v.data()).ok());
    const absl::Status st = cache.Attend(l, q.data(), out.data());
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_TRUE(cache.LayerDone(l).ok());  // as LlamaModel::Forward says
    outs.insert(outs.end(), out.begin(), out.end());
  }
  const absl::Status st = cache.Commit();
  EXPECT_TRUE(st.ok()) << st;
  return outs;
}

// What a transport does: takes pages in `to`'s pool (after `skew` pages held elsewhere, so
// ids differ) and copies the exported pages' bytes into them.
struct Landed {
  std::vector<PageId> skew, pages;
};
Landed Land(const PagedKvCache& from, const PagedKvCache::SequenceExport& ex, PagedKvCache& to,
            int32_t skew, int32_t extra) {
  Landed l;
  std::vector<int64_t> offsets;
  EXPECT_TRUE(to.mutable_pool().Allocate({skew}, &offsets, &l.skew).ok());
  EXPECT_TRUE(to.mutable_pool()
                  .Allocate({static_cast<int32_t>(ex.pages.size()) + extra}, &offsets, &l.pages)
                  .ok());
  for (size_t i = 0; i < ex.pages.size(); ++i) {
    std::memcpy(to.mutable_pool().data(l.pages[i]), from.pool().data(ex.pages[i]),
                from.pool().page_bytes());
  }
  return l;
}

class TransferTest : public testing::TestWithParam<std::string> {};

TEST_P(TransferTest, ImportedSequenceGoesOnExactlyAsTheOriginal) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  auto a = MakeCache(backend, GetParam());
  auto b = MakeCache(backend, GetParam());
  const int64_t prompt = 400, steps = 40;
  ASSERT_TRUE(a->AddSequence(1, prompt + steps).ok());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Step(*a, 1, prompt, seed);

  auto ex = a->ExportSequence(1);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_FALSE(ex->pages.empty());
  Landed landed = Land(*a, *ex, *b, 3, 2);
  auto used = b->ImportSequence(7, prompt + steps, ex->state, landed.pages);
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(*used, static_cast<int64_t>(ex->pages.size()));
  ASSERT_TRUE(b->mutable_pool()
                  .Free(std::vector<PageId>(landed.pages.begin() + *used, landed.pages.end()))
                  .ok());
  ASSERT_TRUE(b->mutable_pool().Free(landed.skew).ok());
  EXPECT_EQ(*b->Length(7), prompt);
  EXPECT_EQ(b->pool().used_pages(), a->pool().used_pages());

  for (int64_t t = 0; t < steps; ++t) {
    const std::vector<float> want = Step(*a, 1, 1, seed + 1 + t);
    const std::vector<float> got = Step(*b, 7, 1, seed + 1 + t);
    ASSERT_EQ(got, want) << "generation step " << t;
  }
  const KvCacheStats sa = a->Stats(), sb = b->Stats();
  EXPECT_EQ(sa.pages.bytes(), sb.pages.bytes());
  EXPECT_EQ(sa.residual_tokens, sb.residual_tokens);
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kKvHeads; ++h) {
      auto ta = a->LiveTokens(1, l, h);
      auto tb = b->LiveTokens(7, l, h);
      ASSERT_TRUE(ta.ok() && tb.ok());
      ASSERT_EQ(ta->size(), tb->size());
      for (size_t i = 0; i < ta->size(); ++i) {
        EXPECT_EQ((*ta)[i].position, (*tb)[i].position);
        EXPECT_EQ((*ta)[i].tier, (*tb)[i].tier);
      }
    }
  }
  ASSERT_TRUE(a->RemoveSequence(1).ok());
  ASSERT_TRUE(b->RemoveSequence(7).ok());
  EXPECT_EQ(a->pool().used_pages(), 0);
  EXPECT_EQ(b->pool().used_pages(), 0);
}

// A decode worker that holds a prompt's pages takes a later prompt with the same prefix from
// the pages it holds and only the others: two prompts forked from one snapshot share their
// leading pages, and the second, imported over the first's held pages, goes on exactly as in
// the cache that computed it; the held pages gain a reference each and every page comes back.
TEST_P(TransferTest, ImportOverHeldPagesGoesOnExactly) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  auto a = MakeCache(backend, GetParam());
  auto b = MakeCache(backend, GetParam());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const int64_t prefix = 256, room = 700;
  ASSERT_TRUE(a->AddSequence(1, room).ok());
  Step(*a, 1, prefix, seed);
  ASSERT_TRUE(a->ForkSequence(1, 2, room).ok());  // the prefix's snapshot
  ASSERT_TRUE(a->ForkSequence(2, 3, room).ok());
  Step(*a, 1, 200, seed + 1);  // prompt A goes on one way
  Step(*a, 3, 150, seed + 2);  // prompt B another

  // The decode side imports A whole.
  auto ea = a->ExportSequence(1);
  ASSERT_TRUE(ea.ok()) << ea.status();
  Landed la = Land(*a, *ea, *b, 1, 0);
  ASSERT_TRUE(b->ImportSequence(7, room, ea->state, la.pages).ok());
  // It holds A's pages that were final once the prefix was computed; B shares as many.
  auto held_a = a->SharedLeadingPages(1, 2);
  auto held_b = a->SharedLeadingPages(3, 2);
  ASSERT_TRUE(held_a.ok() && held_b.ok());
  ASSERT_EQ(held_a->size(), static_cast<size_t>(kLayers * kKvHeads * a->tiers()));
  std::vector<int32_t> use(held_a->size());
  int64_t used_total = 0;
  for (size_t x = 0; x < use.size(); ++x) {
    use[x] = std::min((*held_a)[x], (*held_b)[x]);
    used_total += use[x];
  }
  auto held = b->LeadingPages(7, use);
  ASSERT_TRUE(held.ok()) << held.status();

  auto eb = a->ExportSequence(3);
  ASSERT_TRUE(eb.ok()) << eb.status();
  ASSERT_EQ(eb->run_pages.size(), use.size());
  // B's pages past the held ones, in export order, land as a transport puts them.
  PagedKvCache::SequenceExport rest{.state = eb->state};
  size_t at = 0;
  for (size_t x = 0; x < use.size(); ++x) {
    for (int32_t j = 0; j < eb->run_pages[x]; ++j, ++at) {
      if (j < use[x]) {
        EXPECT_EQ(eb->crcs[at], Crc32c(b->pool().data((*held)[x][j]), b->pool().page_bytes()));
      } else {
        rest.pages.push_back(eb->pages[at]);
      }
    }
  }
  ASSERT_EQ(at, eb->pages.size());
  Landed lb = Land(*a, rest, *b, 0, 0);
  const int64_t before = b->pool().used_pages();
  auto taken = b->ImportSequence(8, room, eb->state, lb.pages, *held);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, static_cast<int64_t>(rest.pages.size()));
  EXPECT_EQ(b->pool().used_pages(), before);  // no page more: the held ones are shared
  for (const auto& run : *held) {
    for (PageId id : run) EXPECT_EQ(b->pool().refcount(id), 2);
  }
  if (std::string_view(GetParam()) == "fp16" || std::string_view(GetParam()) == "sluice") {
    EXPECT_GT(used_total, 0);  // the prefix's full pages
  }
  for (int64_t t = 0; t < 30; ++t) {
    ASSERT_EQ(Step(*b, 8, 1, seed + 10 + t), Step(*a, 3, 1, seed + 10 + t)) << "step " << t;
  }
  for (int64_t seq : {1, 2, 3}) ASSERT_TRUE(a->RemoveSequence(seq).ok());
  ASSERT_TRUE(b->RemoveSequence(8).ok());
  ASSERT_TRUE(b->RemoveSequence(7).ok());
  ASSERT_TRUE(b->mutable_pool().Free(la.skew).ok());
  EXPECT_EQ(a->pool().used_pages(), 0);
  EXPECT_EQ(b->pool().used_pages(), 0);
}

// Held pages that are not what the state says (another prompt's, or too many) are refused with
// nothing changed: no reference taken, no page of the caller's kept.
TEST_P(TransferTest, WrongHeldPagesAreRefused) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto a = MakeCache(**cpu, GetParam());
  auto b = MakeCache(**cpu, GetParam());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  ASSERT_TRUE(a->AddSequence(1, 600).ok());
  ASSERT_TRUE(a->AddSequence(2, 600).ok());
  Step(*a, 1, 300, seed);
  Step(*a, 2, 300, seed + 1);
  auto e1 = a->ExportSequence(1);
  auto e2 = a->ExportSequence(2);
  ASSERT_TRUE(e1.ok() && e2.ok());
  Landed l1 = Land(*a, *e1, *b, 0, 0);
  ASSERT_TRUE(b->ImportSequence(7, 600, e1->state, l1.pages).ok());
  // Sequence 7's first page of each run offered as sequence 2's: other bytes.
  std::vector<int32_t> one(e2->run_pages.size());
  for (size_t x = 0; x < one.size(); ++x) one[x] = std::min(e2->run_pages[x], 1);
  auto held = b->LeadingPages(7, one);
  ASSERT_TRUE(held.ok());
  PagedKvCache::SequenceExport rest{.state = e2->state};
  size_t at = 0;
  for (size_t x = 0; x < one.size(); ++x) {
    for (int32_t j = 0; j < e2->run_pages[x]; ++j, ++at) {
      if (j >= one[x]) rest.pages.push_back(e2->pages[at]);
    }
  }
  Landed l2 = Land(*a, rest, *b, 0, 0);
  const int64_t used = b->pool().used_pages();
  auto r = b->ImportSequence(8, 600, e2->state, l2.pages, *held);
  ASSERT_GT(std::count(one.begin(), one.end(), 1), 0);
  // Other bytes than the state's (or, where a run is one open page, a held open page).
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kDataLoss ||
              r.status().code() == absl::StatusCode::kInvalidArgument)
      << r.status();
  // More held pages than a run has, and a held list of the wrong length.
  std::vector<std::vector<PageId>> too_many = *held;
  too_many[0].resize(static_cast<size_t>(e2->run_pages[0]) + 1,
                     too_many[0].empty() ? 0 : too_many[0][0]);
  EXPECT_EQ(b->ImportSequence(8, 600, e2->state, l2.pages, too_many).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ImportSequence(8, 600, e2->state, l2.pages, absl::MakeConstSpan(*held).subspan(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A whole run held, its open last page included: the sequence would write on into a page
  // it shares. Sequence 7 is sequence 1 (same bytes): its own state over all its pages.
  if (std::string_view(GetParam()) == "fp16") {  // 300 tokens: every list's last page is open
    auto all = b->LeadingPages(7, e1->run_pages);
    ASSERT_TRUE(all.ok());
    auto open = b->ImportSequence(9, 600, e1->state, {}, *all);
    EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument) << open.status();
    EXPECT_NE(open.status().message().find("open"), std::string::npos) << open.status();
  }
  EXPECT_EQ(b->pool().used_pages(), used);
  for (const auto& run : *held) {
    for (PageId id : run) EXPECT_EQ(b->pool().refcount(id), 1);
  }
  ASSERT_TRUE(b->mutable_pool().Free(l2.pages).ok());
  ASSERT_TRUE(b->RemoveSequence(7).ok());
  EXPECT_EQ(b->pool().used_pages(), 0);
}

// A decode worker reserves StateBytesBound for the state: every export fits it, after a prompt
// of any length and after generation steps.
TEST_P(TransferTest, StatesFitTheirBound) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto a = MakeCache(**cpu, GetParam());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (int64_t prompt : {1, 7, 33, 129, 400}) {
    ASSERT_TRUE(a->AddSequence(prompt, prompt + 24).ok());
    Step(*a, prompt, prompt, seed + prompt);
    for (int64_t step = 0; step <= 24; step += 12) {
      auto ex = a->ExportSequence(prompt);
      ASSERT_TRUE(ex.ok()) << ex.status();
      const int64_t tokens = prompt + step;
      EXPECT_LE(static_cast<int64_t>(ex->state.size()), a->StateBytesBound(tokens))
          << "prompt " << prompt << " + " << step;
      // Not a wild overestimate either: a decode worker reserves that much (evicting presets
      // export far fewer tokens than the bound allows for).
      EXPECT_LE(a->StateBytesBound(tokens), 6 * static_cast<int64_t>(ex->state.size()) + 32768)
          << "prompt " << prompt << " + " << step;
      for (int64_t i = 0; i < 12 && step < 24; ++i) Step(*a, prompt, 1, seed + i);
    }
    ASSERT_TRUE(a->RemoveSequence(prompt).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, TransferTest,
                         testing::Values("fp16", "int8", "kivi4", "kivi2", "kvcomp", "sluice",
                                         "sinks", "snapkv", "h2o", "minikv", "leankv-k8v4"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

class StreamTest : public testing::TestWithParam<std::string> {};

TEST_P(StreamTest, LayerByLayerGivesTheSameStateAndPagesAsTheCommit) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  auto a = MakeCache(backend, GetParam());
  auto b = MakeCache(backend, GetParam());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (PagedKvCache* c : {a.get(), b.get()}) {
    ASSERT_TRUE(c->AddSequence(1, 400).ok());
    Step(*c, 1, 200, seed);  // an earlier chunk, committed as usual
  }
  std::vector<std::pair<int, std::vector<PageId>>> streamed;
  ASSERT_TRUE(b->StreamLayers(1, [&](int layer, std::vector<PageId> pages) {
                 streamed.emplace_back(layer, std::move(pages));
               }).ok());
  EXPECT_EQ(Step(*b, 1, 100, seed + 1), Step(*a, 1, 100, seed + 1));  // the last chunk
  ASSERT_EQ(streamed.size(), static_cast<size_t>(kLayers));
  std::vector<PageId> in_order;
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(streamed[l].first, l);
    in_order.insert(in_order.end(), streamed[l].second.begin(), streamed[l].second.end());
  }
  auto ea = a->ExportSequence(1);
  auto eb = b->ExportSequence(1);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(eb->pages, in_order);
  // The same state but for the page checksums: bytes past a page's written slots are whatever
  // its last use left there.
  KvSequenceState sa, sb;
  ASSERT_TRUE(sa.ParseFromString(ea->state) && sb.ParseFromString(eb->state));
  EXPECT_EQ(sa.page_crc32c_size(), sb.page_crc32c_size());
  sa.clear_page_crc32c();
  sb.clear_page_crc32c();
  EXPECT_TRUE(sa.SerializeAsString() == sb.SerializeAsString());
  for (int t = 0; t < 10; ++t)
    EXPECT_EQ(Step(*a, 1, 1, seed + 2 + t), Step(*b, 1, 1, seed + 2 + t));
  // The next pass commits as usual.
  EXPECT_EQ(a->Stats().pages.bytes(), b->Stats().pages.bytes());
}

INSTANTIATE_TEST_SUITE_P(Presets, StreamTest,
                         testing::Values("fp16", "int8", "kivi4", "kivi2", "sluice"));

TEST(Stream, PresetsThatChangePagesAfterACommitDoNotStream) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (const char* preset : {"h2o", "snapkv", "kvcomp", "leankv-k8v4", "sinks"}) {
    auto c = MakeCache(**cpu, preset);
    ASSERT_TRUE(c->AddSequence(1, 10).ok());
    EXPECT_EQ(c->StreamLayers(1, nullptr).code(), absl::StatusCode::kFailedPrecondition) << preset;
  }
}

struct Exported {
  std::unique_ptr<PagedKvCache> a, b;
  PagedKvCache::SequenceExport ex;
  Landed landed;
};

Exported ExportOne(kernels::Backend& backend, std::string_view preset) {
  Exported e{.a = MakeCache(backend, preset), .b = MakeCache(backend, preset)};
  EXPECT_TRUE(e.a->AddSequence(1, 500).ok());
  Step(*e.a, 1, 300, 42);
  auto ex = e.a->ExportSequence(1);
  EXPECT_TRUE(ex.ok()) << ex.status();
  e.ex = *std::move(ex);
  e.landed = Land(*e.a, e.ex, *e.b, 0, 0);
  return e;
}

// The import failed and left every page the caller's.
void ExpectRefused(Exported& e, absl::StatusCode code, std::string_view words, std::string state,
                   std::vector<PageId> pages) {
  auto r = e.b->ImportSequence(7, 500, state, pages);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(std::string(r.status().message()).find(words), std::string::npos) << r.status();
  EXPECT_FALSE(e.b->Length(7).ok());
  EXPECT_EQ(e.b->pool().used_pages(), static_cast<int64_t>(e.landed.pages.size()));
}

TEST(Transfer, BadStatesAndDamagedPagesAreRefused) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  Exported e = ExportOne(backend, "kivi4");
  const std::vector<PageId>& pages = e.landed.pages;
  ASSERT_GT(pages.size(), 2u);
  ExpectRefused(e, absl::StatusCode::kInvalidArgument, "do not parse", "\xff\xff\xff", pages);
  ExpectRefused(e, absl::StatusCode::kInvalidArgument, "were given", e.ex.state,
                std::vector<PageId>(pages.begin(), pages.end() - 1));
  std::vector<PageId> twice = pages;
  twice[1] = twice[0];
  ExpectRefused(e, absl::StatusCode::kInvalidArgument, "given twice", e.ex.state, twice);

  Exported other = ExportOne(backend, "int8");
  ExpectRefused(e, absl::StatusCode::kInvalidArgument, "preset 'int8'", other.ex.state, pages);

  uint8_t* byte = e.b->mutable_pool().data(pages[1]) + 100;
  *byte ^= 0x10;
  ExpectRefused(e, absl::StatusCode::kDataLoss, "CRC32C", e.ex.state, pages);
  *byte ^= 0x10;
  ASSERT_TRUE(e.b->ImportSequence(7, 500, e.ex.state, pages).ok());
  EXPECT_EQ(e.b->ImportSequence(7, 500, e.ex.state, pages).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(e.b->RemoveSequence(7).ok());
  EXPECT_EQ(e.b->pool().used_pages(), 0);
}

// A peer's Huffman-coded pages are checked before anything decodes them (the decoders trust
// their stream offsets and codes): a page damaged where its checksum cannot tell, as by a peer
// that computes checksums after the damage, is refused, and so are coded pages that come
// without codebooks to decode them.
TEST(Transfer, HuffmanPagesAreCheckedBeyondTheirChecksums) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Exported e = ExportOne(**cpu, "kvcomp");
  const std::vector<PageId>& pages = e.landed.pages;
  ASSERT_FALSE(pages.empty());
  KvSequenceState st;
  ASSERT_TRUE(st.ParseFromString(e.ex.state));
  PagePool& pool = e.b->mutable_pool();
  auto* streams = reinterpret_cast<uint32_t*>(pool.data(pages[0]) + e.b->layout().streams);
  const uint32_t saved = streams[2];
  streams[2] = 0xFFFFFF00u;  // the first unit's third K row, far past the page
  st.set_page_crc32c(0, Crc32c(pool.data(pages[0]), pool.page_bytes()));
  ExpectRefused(e, absl::StatusCode::kDataLoss, "page 0", st.SerializeAsString(), pages);
  streams[2] = saved;

  KvSequenceState bare;
  ASSERT_TRUE(bare.ParseFromString(e.ex.state));
  for (KvLayerCodebooks& books : *bare.mutable_codebooks()) books.Clear();
  ExpectRefused(e, absl::StatusCode::kInvalidArgument, "no codebooks", bare.SerializeAsString(),
                pages);

  ASSERT_TRUE(e.b->ImportSequence(7, 500, e.ex.state, pages).ok());
  Step(*e.b, 7, 1, 5);
  ASSERT_TRUE(e.b->RemoveSequence(7).ok());
  EXPECT_EQ(e.b->pool().used_pages(), 0);
}

TEST(Transfer, MutatedStatesNeverCrashAndNeverLeak) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  for (const char* preset : {"kivi4", "leankv-k8v4", "kvcomp"}) {
    Exported e = ExportOne(backend, preset);
    const uint64_t seed = std::random_device{}();
    SCOPED_TRACE(testing::Message() << preset << " seed " << seed);
    std::mt19937_64 rng(seed);
    for (int trial = 0; trial < 300; ++trial) {
      std::string state = e.ex.state;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) state[rng() % state.size()] = static_cast<char>(rng());
      if (rng() % 8 == 0) state.resize(rng() % state.size());
      auto r = e.b->ImportSequence(7, 500, state, e.landed.pages);
      if (!r.ok()) {
        EXPECT_FALSE(e.b->Length(7).ok());
        continue;
      }
      // Whatever was accepted holds up to a step and gives its pages back.
      Step(*e.b, 7, 1, trial);
      ASSERT_TRUE(e.b->RemoveSequence(7).ok());
      e.landed = Land(*e.a, e.ex, *e.b, 0, 0);
    }
    ASSERT_TRUE(e.b->mutable_pool().Free(e.landed.pages).ok());
    EXPECT_EQ(e.b->pool().used_pages(), 0);
  }
}

TEST(Transfer, UncommittedTokensAreNotExported) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  kernels::Backend& backend = **cpu;
  auto a = MakeCache(backend, "kivi4");
  ASSERT_TRUE(a->AddSequence(1, 100).ok());
  Step(*a, 1, 10, 1);
  std::vector<float> k(kRow), v(kRow);
  ASSERT_TRUE(a->BeginStep({{.seq = 1, .tokens = 1}}).ok());
  ASSERT_TRUE(a->Write(0, k.data(), v.data()).ok());
  EXPECT_EQ(a->ExportSequence(1).status().code(), absl::StatusCode::kFailedPrecondition);
  a->AbortStep();
  EXPECT_TRUE(a->ExportSequence(1).ok());
  EXPECT_EQ(a->ExportSequence(2).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::kvstore
