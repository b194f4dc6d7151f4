// libFuzzer target for what a decode worker accepts from its peers (tools/fuzz.sh builds it with
// ASan and UBSan): the KV sequence state and page bytes a prefill worker puts into its
// reservation, and the router's request messages.
//
// The first byte picks what the rest is:
//   0, 1  a KV state and its pages: a 2-byte little-endian length, the serialized
//         kvstore::KvSequenceState, then the pages' bytes (zero-padded to whole pages). With 1,
//         the pages' CRC32Cs in the state are made right first, as a peer that means harm would
//         make them, so that the page bytes themselves reach the decoders; and with an odd
//         last byte, each run's first pages are held already (a decode worker's held prefix).
//   2..7  one rpc message (Reserve, Prefill, Generate, Renew, Release, Drain request).
//
// Properties, for a state: PagedKvCache::ImportSequence takes it or refuses it with
// InvalidArgument, DataLoss or FailedPrecondition, leaving every page the caller's; a state it
// takes holds the tokens it claims, exports back to itself, and goes on through decode steps
// (quantization, attention over the peer's pages, the preset's evictions) until the sequence
// is removed with no page leaked. The cache is made for the state's own preset and a shape near
// the one it claims (a decode worker's is made for its model), so that the checks past the
// shape are reached. For a request: it parses or not; the checks a worker makes before its
// scheduler sees it (sampling parameters, the compression preset, page counts) return a value
// or an error, and sampling with parameters that pass them yields a token of the vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/sampling.h"
#include "google/protobuf/stubs/logging.h"
#include "kernels/ref/ref_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/kv_sequence_state.pb.h"
#include "model/sampler.h"
#include "proto/sluice.pb.h"

namespace sluice {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "peer_state_fuzz: %s\n", what);
    std::abort();
  }
}

// The model a decode worker serves, for the request checks (SmolLM2-135M's shape).
constexpr int32_t kModelLayers = 30, kModelKvHeads = 3, kModelHeadDim = 64;
constexpr int64_t kModelContext = 8192;
constexpr int32_t kVocab = 48;
// Decode steps run on an imported sequence.
constexpr int kSteps = 3;

kernels::Backend& Backend() {
  static kernels::RefBackend* backend = new kernels::RefBackend;
  return *backend;
}

// Deterministic values in [-2, 2) for K, V and queries.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> out(n);
  for (float& x : out) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1 << 22) - 2.f;
  }
  return out;
}

// A cache for the state's preset, shaped as the state claims when that shape is a small one
// (layers 1-3, kv-heads 1-2, head_dim 32 or 64, pages of 256 B to 16 KiB); two query heads per
// kv-head.
std::unique_ptr<kvstore::PagedKvCache> CacheFor(const kvstore::KvSequenceState& st, int64_t pages) {
  const int32_t layers = static_cast<int32_t>(std::clamp<int64_t>(st.layers(), 1, 3));
  const int64_t kv_heads = std::clamp<int64_t>(st.kv_heads(), 1, 2);
  const int32_t head_dim = st.head_dim() == 64 ? 64 : 32;
  const int32_t page_bytes =
      static_cast<int32_t>(std::clamp<int64_t>(st.page_bytes() / 64 * 64, 256, 16384));
  absl::StatusOr<kvstore::KvPreset> preset =
      kvstore::FindKvPreset(st.preset(), head_dim, page_bytes);
  if (!preset.ok()) return nullptr;
  auto cache = kvstore::PagedKvCache::Create({.layers = layers,
                                              .heads = 2 * kv_heads,
                                              .kv_heads = kv_heads,
                                              .head_dim = head_dim,
                                              .preset = *preset,
                                              .pages = pages},
                                             Backend());
  return cache.ok() ? std::move(*cache) : nullptr;
}

// One decode step of one token for `seq`, every layer, as the model runs it.
absl::Status Step(kvstore::PagedKvCache& cache, int64_t seq, int32_t layers, int64_t heads,
                  int64_t kv_heads, int64_t head_dim, uint32_t seed) {
  if (absl::Status st = cache.BeginStep({{.seq = seq, .tokens = 1}}); !st.ok()) return st;
  for (int l = 0; l < layers; ++l) {
    const std::vector<float> k = Values(kv_heads * head_dim, seed + 3 * l);
    const std::vector<float> v = Values(kv_heads * head_dim, seed + 3 * l + 1);
    const std::vector<float> q = Values(heads * head_dim, seed + 3 * l + 2);
    std::vector<float> out(heads * head_dim);
    absl::Status st = cache.Write(l, k.data(), v.data());
    if (st.ok()) st = cache.Attend(l, q.data(), out.data());
    if (st.ok()) st = cache.LayerDone(l);
    if (!st.ok()) {
      cache.AbortStep();
      return st;
    }
  }
  return cache.Commit();
}

void FuzzState(bool fix_crcs, const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t state_size = std::min<size_t>(data[0] | data[1] << 8, size - 2);
  std::string state(reinterpret_cast<const char*>(data) + 2, state_size);
  const uint8_t* page_data = data + 2 + state_size;
  const size_t page_data_size = size - 2 - state_size;

  kvstore::KvSequenceState st;
  if (!st.ParseFromString(state)) return;  // ImportSequence refuses it first thing
  const int64_t listed = st.page_crc32c_size();
  if (listed > 512) return;
  auto cache = CacheFor(st, listed + 64);
  if (cache == nullptr) return;
  kvstore::PagePool& pool = cache->mutable_pool();
  const int64_t page_bytes = pool.page_bytes();
  const int64_t given =
      std::min<int64_t>((page_data_size + page_bytes - 1) / page_bytes, listed + 2);

  // The pages as a decode worker holds them before the import: allocated, the peer's bytes in.
  std::vector<int64_t> offsets;
  std::vector<kvstore::PageId> pages;
  if (given > 0) {
    Check(pool.Allocate({static_cast<int32_t>(given)}, &offsets, &pages).ok(), "no pages");
  }
  for (int64_t i = 0; i < given; ++i) {
    const size_t at = static_cast<size_t>(i * page_bytes);
    const size_t n = std::min<size_t>(page_bytes, page_data_size - at);
    std::memset(pool.data(pages[i]), 0, page_bytes);
    std::memcpy(pool.data(pages[i]), page_data + at, n);
  }
  if (fix_crcs) {
    for (int64_t i = 0; i < std::min(listed, given); ++i) {
      st.set_page_crc32c(static_cast<int>(i), kvstore::Crc32c(pool.data(pages[i]), page_bytes));
    }
    state = st.SerializeAsString();
  }

  // With an odd last byte, the first pages of each run (as the state counts them) are held
  // already, a decode worker's held prefix: the import shares them and takes the rest from
  // `rest`. The caller keeps its own reference on them either way.
  std::vector<std::vector<kvstore::PageId>> held;
  std::vector<kvstore::PageId> rest = pages;
  int64_t held_total = 0;
  if (fix_crcs && page_data_size > 0 && (page_data[page_data_size - 1] & 1) != 0) {
    const int tiers = cache->tiers();
    const int keep = 1 + page_data[page_data_size - 1] / 2 % 3;
    held.resize(static_cast<size_t>(st.lists_size()) * tiers);
    rest.clear();
    int64_t at = 0;
    for (int i = 0; i < st.lists_size(); ++i) {
      for (int t = 0; t < std::min(tiers, st.lists(i).tiers_size()); ++t) {
        const int64_t run = st.lists(i).tiers(t).slots_size();
        for (int64_t j = 0; j < run && at < given; ++j, ++at) {
          if (j < keep) {
            held[static_cast<size_t>(i) * tiers + t].push_back(pages[at]);
            ++held_total;
          } else {
            rest.push_back(pages[at]);
          }
        }
      }
    }
    rest.insert(rest.end(), pages.begin() + at, pages.end());
  }

  const int64_t seq = 7, room = std::max<int64_t>(st.length(), 0) + kSteps;
  absl::StatusOr<int64_t> imported = cache->ImportSequence(seq, room, state, rest, held);
  if (!imported.ok()) {
    const absl::StatusCode code = imported.status().code();
    Check(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss ||
              code == absl::StatusCode::kFailedPrecondition,
          "ImportSequence refused a state with an unexpected code");
    Check(cache->Length(seq).status().code() == absl::StatusCode::kNotFound,
          "a refused state left a sequence behind");
    Check(pool.used_pages() == given, "a refused state took pages");
    Check(pool.Free(pages).ok(), "the caller's pages are no longer the caller's");
    return;
  }
  Check(*imported == listed - held_total && listed <= given,
        "the import took other pages than listed");
  for (const auto& run : held) {
    for (kvstore::PageId id : run) Check(pool.refcount(id) == 2, "a held page is not shared");
  }
  Check(pool.Free(std::vector<kvstore::PageId>(rest.begin() + *imported, rest.end())).ok(),
        "the pages past those listed are not the caller's");
  absl::StatusOr<int64_t> length = cache->Length(seq);
  Check(length.ok() && *length == st.length(), "the sequence does not hold the state's tokens");

  // Exported again, the state is the one imported (in protobuf's canonical form).
  absl::StatusOr<kvstore::PagedKvCache::SequenceExport> out = cache->ExportSequence(seq);
  Check(out.ok(), "an imported sequence does not export");
  kvstore::KvSequenceState canonical;
  Check(canonical.ParseFromString(state), "the state no longer parses");
  canonical.DiscardUnknownFields();
  // Codebooks mean nothing to a preset without Huffman codes; the import passes over them.
  if (cache->preset().high.huffman_bits == 0) canonical.clear_codebooks();
  Check(out->state == canonical.SerializeAsString(), "the state does not export back to itself");
  Check(out->pages.size() == static_cast<size_t>(listed), "another number of pages exported");

  for (int i = 0; i < kSteps; ++i) {
    const absl::Status step = Step(*cache, seq, static_cast<int32_t>(st.layers()),
                                   2 * st.kv_heads(), st.kv_heads(), st.head_dim(), 17 * i + 1);
    if (!step.ok()) break;  // e.g. no page left in this small pool
  }
  (void)cache->Stats();
  Check(cache->RemoveSequence(seq).ok(), "the sequence cannot be removed");
  for (const auto& run : held) {
    Check(pool.Free(run).ok(), "a held page is no longer the caller's");
  }
  Check(pool.used_pages() == 0, "pages leaked");
}

// The preset a request names ("" is the worker's default), as the workers look it up.
void CheckPreset(const rpc::CompressionSpec& spec, int32_t prompt_tokens) {
  if (spec.preset().empty()) return;
  absl::StatusOr<kvstore::KvPreset> preset = kvstore::FindKvPreset(spec.preset(), kModelHeadDim);
  if (!preset.ok()) {
    Check(preset.status().code() == absl::StatusCode::kNotFound ||
              preset.status().code() == absl::StatusCode::kInvalidArgument,
          "FindKvPreset failed with an unexpected code");
    return;
  }
  absl::StatusOr<int64_t> pages =
      kvstore::PagesForSequence(*preset, kModelLayers, kModelKvHeads, prompt_tokens);
  Check(!pages.ok() || *pages >= 0, "a negative page count");
}

void CheckSampling(const rpc::SamplingParams& sp,
                   const google::protobuf::RepeatedField<int32_t>& prompt) {
  // As the workers check it (common/sampling.h).
  const absl::StatusOr<model::SamplingParams> params = CheckedSampling(sp);
  if (!params.ok()) return;
  model::Sampler sampler(*params);
  const std::vector<float> logits = Values(kVocab, static_cast<uint32_t>(sp.seed()));
  const std::vector<int32_t> history(prompt.begin(), prompt.end());
  for (int i = 0; i < 2; ++i) {
    const int32_t token = sampler.Sample(logits, history);
    Check(token >= 0 && token < kVocab, "sampled a token outside the vocabulary");
  }
}

void FuzzRequest(int kind, const uint8_t* data, size_t size) {
  switch (kind) {
    case 2: {
      rpc::ReserveRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) return;
      // DecodeWorker::Reserve: positive counts, within the context, then the preset's pages.
      if (r.prompt_tokens() <= 0 || r.max_tokens() <= 0) return;
      if (int64_t{r.prompt_tokens()} + r.max_tokens() > kModelContext) return;
      CheckPreset(r.compression(), r.prompt_tokens());
      return;
    }
    case 3: {
      rpc::PrefillRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) return;
      CheckSampling(r.sampling(), r.prompt());
      CheckPreset(r.compression(), std::min(r.prompt_size(), 8192));
      return;
    }
    case 4: {
      rpc::GenerateRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) return;
      CheckSampling(r.sampling(), r.prompt());
      CheckPreset(r.compression(), std::min(r.prompt_size(), 8192));
      return;
    }
    case 5: {
      rpc::RenewRequest r;
      (void)r.ParseFromArray(data, static_cast<int>(size));
      return;
    }
    case 6: {
      rpc::ReleaseRequest r;
      (void)r.ParseFromArray(data, static_cast<int>(size));
      return;
    }
    default: {
      rpc::DrainRequest r;
      (void)r.ParseFromArray(data, static_cast<int>(size));
      return;
    }
  }
}

}  // namespace
}  // namespace sluice

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A message that does not parse is an answer here, not news: protobuf's log stays quiet.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int kind = data[0] % 8;
  if (kind < 2) {
    sluice::FuzzState(kind == 1, data + 1, size - 1);
  } else {
    sluice::FuzzRequest(kind, data + 1, size - 1);
  }
  return 0;
}
