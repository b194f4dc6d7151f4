// PagedKvCache::ExportSequence and ImportSequence: a sequence's KV moving between caches.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/device_buffer.h"
#include "kernels/huffman.h"
#include "kernels/kv_huffman.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/kv_sequence_state.pb.h"

namespace sluice::kvstore {
namespace {

constexpr uint32_t kStateVersion = 1;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError("KV sequence state: " + what);
}

// Whether every element lies in [lo, hi).
template <typename T>
bool AllIn(const google::protobuf::RepeatedField<T>& v, int64_t lo, int64_t hi) {
  return std::all_of(v.begin(), v.end(), [&](T x) { return x >= lo && x < hi; });
}

}  // namespace

int64_t PagedKvCache::StateBytesBound(int64_t tokens) const {
  // A length-delimited field: its payload, a tag and a length of at most 10 bytes each.
  auto field = [](int64_t payload) { return payload + 20; };
  const int64_t lists = options_.layers * options_.kv_heads;
  const int64_t group = options_.heads / options_.kv_heads;
  const int64_t token_group = layout_.token_group;
  // Tokens outside pages: at most the window and a group that did not fill.
  const int64_t window = std::min<int64_t>(tokens, options_.preset.residual + token_group);
  const int64_t pages =
      PagesForSequence(options_.preset, options_.layers, options_.kv_heads, tokens)
          .value_or(lists * (tokens + 2));
  const int64_t list_pages = pages / lists + 2;
  // Slot counts and positions are non-negative int32 varints: 5 bytes at most.
  int64_t tier = field(list_pages * 5) + field((tokens + token_group) * 5) + 4;
  int64_t list =
      tiers_ * field(tier) + field(window * 10) + field(tokens * group * 4) + field(tokens);
  int64_t bytes = 256 + static_cast<int64_t>(options_.preset.name.size());  // the scalars
  bytes += 2 * options_.layers * field(window * row_ * static_cast<int64_t>(sizeof(float)));
  bytes += lists * field(list);
  // Codebooks: an 8-byte header and a nibble per symbol of at most 256, per K and V.
  if (options_.preset.high.huffman_bits > 0) bytes += options_.layers * field(2 * field(8 + 128));
  bytes += field(pages * 4);  // a CRC32C per page
  return bytes;
}

absl::StatusOr<PagedKvCache::SequenceExport> PagedKvCache::ExportSequence(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  const Seq& s = it->second;
  const int64_t resid = s.length - s.compressed;
  KvSequenceState st;
  st.set_version(kStateVersion);
  st.set_preset(options_.preset.name);
  st.set_layers(options_.layers);
  st.set_kv_heads(options_.kv_heads);
  st.set_head_dim(options_.head_dim);
  st.set_page_bytes(pool_->page_bytes());
  st.set_length(s.length);
  st.set_compressed(s.compressed);
  st.set_sinks_evicted_to(s.policy.evicted_to);
  const size_t resid_bytes = resid * row_ * sizeof(float);
  for (int l = 0; l < options_.layers; ++l) {
    if (s.k[l].rows() != resid) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d has written tokens it has not committed; export after Commit", seq));
    }
    for (const RowWindow* w : {&s.k[l], &s.v[l]}) {
      std::string* bytes = w == &s.k[l] ? st.add_residual_k() : st.add_residual_v();
      bytes->resize(resid_bytes);
      if (resid_bytes > 0) {
        SLUICE_RETURN_IF_ERROR(backend_.CopyToHost(bytes->data(), w->data(), resid_bytes));
      }
    }
  }
  SLUICE_RETURN_IF_ERROR(SyncValid());  // the checksums cover the pages' valid bits
  SequenceExport out;
  for (const HeadPages& hp : s.heads) {
    KvListState* list = st.add_lists();
    for (int t = 0; t < tiers_; ++t) {
      KvTierState* tier = list->add_tiers();
      tier->mutable_slots()->Add(hp.tier[t].slots.begin(), hp.tier[t].slots.end());
      tier->mutable_positions()->Add(hp.tier[t].positions.begin(), hp.tier[t].positions.end());
      tier->set_last_closed(hp.tier[t].last_closed);
      for (int32_t i = 0; i < hp.count(t); ++i) out.pages.push_back(hp.page(t, i));
      out.run_pages.push_back(hp.count(t));
    }
    list->mutable_pending()->Add(hp.pending.begin(), hp.pending.end());
    list->mutable_score()->Add(hp.policy.score.begin(), hp.policy.score.end());
    list->set_gone(std::string(hp.policy.gone.begin(), hp.policy.gone.end()));
  }
  SLUICE_ASSIGN_OR_RETURN(out.crcs, PageCrcs(out.pages));
  st.mutable_page_crc32c()->Add(out.crcs.begin(), out.crcs.end());
  if (options_.preset.high.huffman_bits > 0) {
    for (int l = 0; l < options_.layers; ++l) {
      KvLayerCodebooks* books = st.add_codebooks();
      if (!codebooks_[l]) continue;
      books->set_k(kernels::SerializeCodebook(codebooks_[l]->k));
      books->set_v(kernels::SerializeCodebook(codebooks_[l]->v));
    }
  }
  out.state = st.SerializeAsString();
  return out;
}

absl::StatusOr<int64_t> PagedKvCache::ImportSequence(int64_t seq, int64_t max_tokens,
                                                     std::string_view state,
                                                     absl::Span<const PageId> given,
                                                     absl::Span<const std::vector<PageId>> held) {
  if (seqs_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrFormat("sequence %d already has a KV cache", seq));
  }
  KvSequenceState st;
  if (!st.ParseFromArray(state.data(), static_cast<int>(state.size()))) {
    return Bad(absl::StrFormat("%d bytes do not parse", state.size()));
  }
  if (st.version() != kStateVersion) {
    return Bad(absl::StrFormat("version %d, this cache reads %d", st.version(), kStateVersion));
  }
  if (st.preset() != options_.preset.name) {
    return Bad(
        absl::StrFormat("preset '%s', this cache runs '%s'", st.preset(), options_.preset.name));
  }
  if (st.layers() != options_.layers || st.kv_heads() != options_.kv_heads ||
      st.head_dim() != options_.head_dim || st.page_bytes() != pool_->page_bytes()) {
    return Bad(absl::StrFormat(
        "shape layers=%d kv_heads=%d head_dim=%d page_bytes=%d, this cache has %d/%d/%d/%d",
        st.layers(), st.kv_heads(), st.head_dim(), st.page_bytes(), options_.layers,
        options_.kv_heads, options_.head_dim, pool_->page_bytes()));
  }
  const int64_t length = st.length(), compressed = st.compressed();
  if (compressed < 0 || compressed > length || length > max_tokens) {
    return Bad(absl::StrFormat("length=%d compressed=%d with room for %d tokens", length,
                               compressed, max_tokens));
  }
  if (st.sinks_evicted_to() < -1 || st.sinks_evicted_to() > length) {
    return Bad(
        absl::StrFormat("sinks_evicted_to=%d outside [-1, %d]", st.sinks_evicted_to(), length));
  }
  const size_t resid_bytes = (length - compressed) * row_ * sizeof(float);
  if (st.residual_k_size() != options_.layers || st.residual_v_size() != options_.layers) {
    return Bad(absl::StrFormat("%d/%d residual layers, expected %d", st.residual_k_size(),
                               st.residual_v_size(), options_.layers));
  }
  for (int l = 0; l < options_.layers; ++l) {
    if (st.residual_k(l).size() != resid_bytes || st.residual_v(l).size() != resid_bytes) {
      return Bad(absl::StrFormat("layer %d's residual window has %d/%d bytes, expected %d", l,
                                 st.residual_k(l).size(), st.residual_v(l).size(), resid_bytes));
    }
  }
  const int64_t lists = options_.layers * options_.kv_heads;
  if (st.lists_size() != lists) {
    return Bad(absl::StrFormat("%d page lists, expected %d", st.lists_size(), lists));
  }
  const int64_t group = options_.heads / options_.kv_heads;
  if (!held.empty() && static_cast<int64_t>(held.size()) != lists * tiers_) {
    return Bad(
        absl::StrFormat("%d runs of held pages, the cache has %d", held.size(), lists * tiers_));
  }
  int64_t listed = 0;
  for (int64_t i = 0; i < lists; ++i) {
    const KvListState& list = st.lists(i);
    const std::string where = absl::StrFormat("list %d (layer %d, kv-head %d)", i,
                                              i / options_.kv_heads, i % options_.kv_heads);
    if (list.tiers_size() != tiers_) {
      return Bad(
          absl::StrFormat("%s has %d tiers, the preset %d", where, list.tiers_size(), tiers_));
    }
    for (int t = 0; t < tiers_; ++t) {
      const KvTierState& tier = list.tiers(t);
      if (!AllIn(tier.slots(), 1, layouts_[t].tokens + 1)) {
        return Bad(absl::StrFormat("%s tier %d: a page's slot count is outside [1, %d]", where, t,
                                   layouts_[t].tokens));
      }
      int64_t slots = 0;
      for (int32_t n : tier.slots()) slots += n;
      if (tier.positions_size() != slots || !AllIn(tier.positions(), 0, compressed)) {
        return Bad(absl::StrFormat(
            "%s tier %d: %d positions for %d slots, or a position outside the %d paged tokens",
            where, t, tier.positions_size(), slots, compressed));
      }
      listed += tier.slots_size();
    }
    if (!AllIn(list.pending(), compressed, length) ||
        !std::is_sorted(list.pending().begin(), list.pending().end())) {
      return Bad(where + ": pending evictions unsorted or outside the full-precision window");
    }
    const int64_t scores = list.score_size();
    if (scores != 0 && scores != length && scores != length * group) {
      return Bad(absl::StrFormat("%s: %d scores for %d tokens", where, scores, length));
    }
    if (!list.gone().empty() && static_cast<int64_t>(list.gone().size()) != length) {
      return Bad(absl::StrFormat("%s: %d eviction flags for %d tokens", where, list.gone().size(),
                                 length));
    }
  }
  if (st.page_crc32c_size() != listed) {
    return Bad(absl::StrFormat("%d page checksums for %d pages", st.page_crc32c_size(), listed));
  }
  // Every page in export order: each run's held pages, then the given ones after them.
  std::vector<PageId> pages;
  std::vector<PageId> shared;
  std::vector<bool> is_held;
  pages.reserve(static_cast<size_t>(listed));
  is_held.reserve(static_cast<size_t>(listed));
  size_t taken = 0;
  for (int64_t i = 0; i < lists; ++i) {
    for (int t = 0; t < tiers_; ++t) {
      const int64_t run = st.lists(i).tiers(t).slots_size();
      const std::vector<PageId> none;
      const std::vector<PageId>& mine = held.empty() ? none : held[i * tiers_ + t];
      if (static_cast<int64_t>(mine.size()) > run) {
        return Bad(absl::StrFormat("list %d tier %d: %d held pages, the state lists %d", i, t,
                                   mine.size(), run));
      }
      // The sequence writes on into its run's last page while it is open: that page must be
      // its own, never one it shares.
      const KvTierState& ts = st.lists(i).tiers(t);
      if (!mine.empty() && static_cast<int64_t>(mine.size()) == run && !ts.last_closed() &&
          ts.slots(static_cast<int>(run - 1)) < layouts_[t].tokens) {
        return Bad(absl::StrFormat(
            "list %d tier %d: the last page is open (%d of %d slots) and held; a held page must "
            "be full",
            i, t, ts.slots(static_cast<int>(run - 1)), layouts_[t].tokens));
      }
      for (PageId id : mine) {
        pages.push_back(id);
        shared.push_back(id);
        is_held.push_back(true);
      }
      for (int64_t j = static_cast<int64_t>(mine.size()); j < run; ++j) {
        if (taken == given.size()) {
          return Bad(absl::StrFormat("it lists %d pages, %d were given and %d held", listed,
                                     given.size(), shared.size()));
        }
        pages.push_back(given[taken++]);
        is_held.push_back(false);
      }
    }
  }
  absl::flat_hash_set<PageId> distinct;
  for (int64_t i = 0; i < listed; ++i) {
    if (!distinct.insert(pages[i]).second) {
      return Bad(absl::StrFormat("page id %d is given twice", pages[i]));
    }
    // A given page is the caller's alone; a held one is already referenced.
    const int32_t refs =
        pages[i] < 0 || pages[i] >= pool_->num_pages() ? 0 : pool_->refcount(pages[i]);
    if (is_held[i] ? refs < 1 : refs != 1) {
      return Bad(absl::StrFormat("page %d (id %d) is not one of this pool's allocated pages", i,
                                 pages[i]));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(const std::vector<uint32_t> crcs, PageCrcs(pages));
  for (int64_t i = 0; i < listed; ++i) {
    if (crcs[i] != st.page_crc32c(i)) {
      return absl::DataLossError(absl::StrFormat(
          "KV sequence state: page %d (id %d) has CRC32C %08x, the sender's was %08x", i, pages[i],
          crcs[i], st.page_crc32c(i)));
    }
  }
  // Huffman codebooks: adopted by a layer that has none, or equal to the layer's.
  const bool coded = options_.preset.high.huffman_bits > 0;
  if (coded && st.codebooks_size() != options_.layers) {
    return Bad(
        absl::StrFormat("%d codebook layers, expected %d", st.codebooks_size(), options_.layers));
  }
  std::vector<std::unique_ptr<KvCodebookPair>> adopted(options_.layers);
  for (int l = 0; coded && l < options_.layers; ++l) {
    const KvLayerCodebooks& books = st.codebooks(l);
    if (books.k().empty() && books.v().empty()) continue;
    if (codebooks_[l]) {
      if (books.k() != kernels::SerializeCodebook(codebooks_[l]->k) ||
          books.v() != kernels::SerializeCodebook(codebooks_[l]->v)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "layer %d's Huffman codebooks differ from the ones this cache already uses", l));
      }
      continue;
    }
    auto pair = std::make_unique<KvCodebookPair>();
    auto k = kernels::ParseCodebook(books.k());
    auto v = kernels::ParseCodebook(books.v());
    if (!k.ok() || !v.ok()) {
      return Bad(absl::StrFormat("layer %d's codebooks: %s", l,
                                 (k.ok() ? v.status() : k.status()).message()));
    }
    pair->k = *std::move(k);
    pair->v = *std::move(v);
    adopted[l] = std::move(pair);
  }
  // Huffman-coded pages: the decoders trust each unit's stream offsets and codes, so a peer's
  // are checked once, here, against the codebooks their layer decodes with.
  if (coded) {
    SLUICE_ASSIGN_OR_RETURN(const kernels::KvHuffmanTier tier,
                            kernels::MakeKvHuffmanTier(options_.preset.high));
    int64_t next = 0;
    for (int64_t i = 0; i < lists; ++i) {
      const int l = static_cast<int>(i / options_.kv_heads);
      const KvCodebookPair* books = adopted[l] ? adopted[l].get() : codebooks_[l].get();
      for (int t = 0; t < tiers_; ++t) {
        const KvTierState& tier_state = st.lists(i).tiers(t);
        for (int j = 0; j < tier_state.slots_size(); ++j, ++next) {
          if (t != 0) continue;
          if (books == nullptr) {
            return Bad(absl::StrFormat("layer %d has Huffman-coded pages but no codebooks", l));
          }
          const int64_t units =
              (tier_state.slots(j) + tier.layout.unit_tokens - 1) / tier.layout.unit_tokens;
          if (absl::Status checked =
                  kernels::KvCheckUnits(tier, books->view(), pool_->data(pages[next]), units);
              !checked.ok()) {
            return absl::DataLossError(absl::StrFormat("KV sequence state: page %d (id %d): %s",
                                                       next, pages[next], checked.message()));
          }
        }
      }
    }
  }

  Seq s;
  s.max_tokens = max_tokens;
  s.length = length;
  s.compressed = compressed;
  s.policy.evicted_to = st.sinks_evicted_to();
  for (int l = 0; l < options_.layers; ++l) {
    s.k.emplace_back(row_);
    s.v.emplace_back(row_);
  }
  for (int l = 0; l < options_.layers; ++l) {
    SLUICE_RETURN_IF_ERROR(s.k[l].Resize(backend_, length - compressed));
    SLUICE_RETURN_IF_ERROR(s.v[l].Resize(backend_, length - compressed));
    if (resid_bytes > 0) {
      SLUICE_RETURN_IF_ERROR(
          backend_.CopyToDevice(s.k[l].data(), st.residual_k(l).data(), resid_bytes));
      SLUICE_RETURN_IF_ERROR(
          backend_.CopyToDevice(s.v[l].data(), st.residual_v(l).data(), resid_bytes));
    }
  }
  s.heads.resize(lists);
  int64_t next = 0;
  for (int64_t i = 0; i < lists; ++i) {
    const KvListState& list = st.lists(i);
    HeadPages& hp = s.heads[i];
    for (int t = 0; t < tiers_; ++t) {
      const KvTierState& tier = list.tiers(t);
      for (int j = 0; j < tier.slots_size(); ++j) {
        if (absl::Status pushed = hp.Push(t, pages[next++]); !pushed.ok()) {
          return Bad(absl::StrFormat("list %d: %s", i, pushed.message()));
        }
      }
      hp.tier[t].slots.assign(tier.slots().begin(), tier.slots().end());
      hp.tier[t].positions.assign(tier.positions().begin(), tier.positions().end());
      hp.tier[t].last_closed = tier.last_closed();
    }
    hp.pending.assign(list.pending().begin(), list.pending().end());
    hp.policy.score.assign(list.score().begin(), list.score().end());
    hp.policy.gone.assign(list.gone().begin(), list.gone().end());
  }
  if (valid_mirror_ != nullptr) {
    // The pages' valid bits, as the peer wrote them, become the mirror's.
    std::vector<std::pair<PageId, int>> placed;
    for (const HeadPages& hp : s.heads) {
      for (int t = 0; t < tiers_; ++t) {
        for (int32_t i = 0; i < hp.count(t); ++i) placed.push_back({hp.page(t, i), t});
      }
    }
    SLUICE_RETURN_IF_ERROR(LoadValid(placed));
  }
  SLUICE_RETURN_IF_ERROR(pool_->Retain(shared));  // the held pages: the caller keeps its own
  for (int l = 0; l < options_.layers; ++l) {
    if (adopted[l]) codebooks_[l] = std::move(adopted[l]);
  }
  seqs_.emplace(seq, std::move(s));
  return static_cast<int64_t>(taken);
}

int64_t PagedKvCache::WindowAfterPrompt(int64_t tokens) const {
  return tokens - FlushCount(Seq{}, tokens);
}

absl::Status PagedKvCache::AddSequenceFromRows(int64_t seq, int64_t max_tokens, int64_t tokens,
                                               RowSource rows) {
  if (options_.preset.policy.kind != KvPolicyKind::kNone) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "preset %s chooses tokens by the prompt's attention, which a prompt that crossed as rows "
        "did not run here; rows go only into presets that keep every token",
        options_.preset.name));
  }
  if (tokens < 1) return absl::InvalidArgumentError("a prompt of rows needs at least one token");
  SLUICE_RETURN_IF_ERROR(AddSequence(seq, max_tokens));
  const size_t bytes = static_cast<size_t>(tokens * row_) * sizeof(float);
  std::vector<float> k(tokens * row_), v(tokens * row_);
  const bool device = backend_.memory_space() != kernels::MemorySpace::kHost;
  kernels::DeviceBuffer dk, dv;
  auto run = [&]() -> absl::Status {
    if (device) {
      SLUICE_ASSIGN_OR_RETURN(dk, kernels::DeviceBuffer::Create(backend_, bytes));
      SLUICE_ASSIGN_OR_RETURN(dv, kernels::DeviceBuffer::Create(backend_, bytes));
    }
    const model::StepEntry entry{.seq = seq, .tokens = tokens};
    SLUICE_RETURN_IF_ERROR(BeginStep({&entry, 1}));
    for (int l = 0; l < options_.layers; ++l) {
      SLUICE_RETURN_IF_ERROR(rows(l, k.data(), v.data()));
      if (device) {
        SLUICE_RETURN_IF_ERROR(dk.Upload(k.data(), bytes));
        SLUICE_RETURN_IF_ERROR(dv.Upload(v.data(), bytes));
        SLUICE_RETURN_IF_ERROR(Write(l, dk.as<float>(), dv.as<float>()));
        // The next layer's rows overwrite the host buffers: this one's must have left them.
        SLUICE_RETURN_IF_ERROR(backend_.Synchronize());
      } else {
        SLUICE_RETURN_IF_ERROR(Write(l, k.data(), v.data()));
      }
    }
    return Commit();
  };
  if (absl::Status st = run(); !st.ok()) {
    AbortStep();
    RemoveSequence(seq).IgnoreError();
    return st;
  }
  return absl::OkStatus();
}

}  // namespace sluice::kvstore
