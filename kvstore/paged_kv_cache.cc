#include "kvstore/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/kv_huffman.h"
#include "kvstore/kv_codebooks.h"

namespace sluice::kvstore {

int64_t KvCacheStats::held_bytes() const { return pages.bytes() + residual_bytes + codebook_bytes; }

int64_t KvCacheStats::fp16_bytes() const {
  // fp16 bytes of the residual tokens: 2 bytes x 2 (K, V) per channel; residual_bytes holds
  // fp32, i.e. twice that.
  return pages.fp16_bytes + residual_bytes / 2;
}

double KvCacheStats::ratio_vs_fp16() const {
  const int64_t held = held_bytes();
  return held == 0 ? 0 : static_cast<double>(fp16_bytes()) / static_cast<double>(held);
}

absl::StatusOr<int64_t> PagesForSequence(const KvPreset& preset, int32_t layers, int64_t kv_heads,
                                         int64_t tokens) {
  kernels::KvTierFormat format = preset.high;
  // Huffman-coded pages: every code at the longest length a codebook may give it.
  if (format.huffman_bits > 0) format.huffman_bits = kernels::kMaxHuffmanCodeLength;
  SLUICE_ASSIGN_OR_RETURN(kernels::KvPageLayout layout, kernels::ComputePageLayout(format));
  return (tokens + layout.tokens - 1) / layout.tokens * layers * kv_heads;
}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const PagedKvCacheOptions& o,
                                                                   kernels::Backend& backend) {
  if (o.layers <= 0 || o.heads <= 0 || o.kv_heads <= 0 || o.heads % o.kv_heads != 0 ||
      o.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad KV cache shape: layers=%d heads=%d kv_heads=%d head_dim=%d", o.layers,
                        o.heads, o.kv_heads, o.head_dim));
  }
  if (o.preset.high.head_dim != o.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("preset %s is for head_dim %d, the model has %d", o.preset.name,
                        o.preset.high.head_dim, o.head_dim));
  }
  if (backend.kind() == kernels::BackendKind::kCuda) {
    return absl::UnimplementedError(
        "the paged KV cache keeps its pool in host memory; use the "
        "cpu backend");
  }
  if (o.preset.residual < 0) return absl::InvalidArgumentError("preset residual must be >= 0");
  SLUICE_ASSIGN_OR_RETURN(kernels::KvPageLayout layout, kernels::ComputePageLayout(o.preset.high));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool,
                          PagePool::Create(o.pages, o.preset.high.page_bytes));
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(o, layout, std::move(pool), backend));
}

PagedKvCache::PagedKvCache(const PagedKvCacheOptions& options, kernels::KvPageLayout layout,
                           std::unique_ptr<PagePool> pool, kernels::Backend& backend)
    : options_(options),
      layout_(layout),
      row_(options.kv_heads * options.head_dim),
      pool_(std::move(pool)),
      backend_(backend),
      codebooks_(options.layers) {}

PagedKvCache::~PagedKvCache() {
  for (auto& [id, s] : seqs_) {
    for (const HeadPages& h : s.heads) pool_->Free(h.table.AllPages()).IgnoreError();
  }
}

absl::Status PagedKvCache::AddSequence(int64_t seq, int64_t max_tokens) {
  if (max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("max_tokens=%d must be > 0", max_tokens));
  }
  if (seqs_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrFormat("sequence %d already has a KV cache", seq));
  }
  Seq& s = seqs_[seq];
  s.max_tokens = max_tokens;
  s.k.resize(options_.layers);
  s.v.resize(options_.layers);
  s.heads.resize(options_.layers * options_.kv_heads);
  return absl::OkStatus();
}

absl::Status PagedKvCache::RemoveSequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  std::vector<PageId> ids;
  for (const HeadPages& h : it->second.heads) {
    const std::vector<PageId> pages = h.table.AllPages();
    ids.insert(ids.end(), pages.begin(), pages.end());
  }
  seqs_.erase(it);
  return pool_->Free(ids);
}

absl::StatusOr<PagedKvCache::Seq*> PagedKvCache::Find(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  return &it->second;
}

absl::StatusOr<int64_t> PagedKvCache::Length(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  return it->second.length;
}

absl::Status PagedKvCache::Write(int64_t seq, int layer, const float* k, const float* v,
                                 int64_t n) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (layer < 0 || layer >= options_.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d outside [0, %d)", layer, options_.layers));
  }
  if (n < 0 || s->length + n > s->max_tokens) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "sequence %d: %d + %d tokens exceed its room of %d", seq, s->length, n, s->max_tokens));
  }
  const int64_t resid = s->length - s->compressed;
  s->k[layer].resize((resid + n) * row_);
  s->v[layer].resize((resid + n) * row_);
  std::memcpy(s->k[layer].data() + resid * row_, k, n * row_ * sizeof(float));
  std::memcpy(s->v[layer].data() + resid * row_, v, n * row_ * sizeof(float));
  return absl::OkStatus();
}

absl::Status PagedKvCache::Attend(int64_t seq, int layer, const float* q, int64_t n, float* out) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (layer < 0 || layer >= options_.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d outside [0, %d)", layer, options_.layers));
  }
  const int64_t recent = static_cast<int64_t>(s->k[layer].size()) / row_;
  if (recent < s->length - s->compressed + n) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence %d layer %d: attention over %d new tokens that were not written", seq, layer, n));
  }
  std::vector<kernels::KvPageRef> refs;
  std::vector<int32_t> offsets = {0};
  for (int64_t h = 0; h < options_.kv_heads; ++h) {
    const HeadPages& hp = s->heads[layer * options_.kv_heads + h];
    const int32_t n = hp.table.high_count();
    for (int32_t i = 0; i < n; ++i) {
      refs.push_back({.data = pool_->data(hp.table.high(i)), .slots = hp.slots[i], .tier = 0});
    }
    offsets.push_back(static_cast<int32_t>(refs.size()));
  }
  const float scale = options_.attention_scale > 0.f
                          ? options_.attention_scale
                          : 1.f / std::sqrt(static_cast<float>(options_.head_dim));
  const kernels::KvCodebooks codebooks = Codebooks(layer);
  return backend_.PagedAttention({.q = q,
                                  .out = out,
                                  .q_tokens = n,
                                  .heads = options_.heads,
                                  .kv_heads = options_.kv_heads,
                                  .head_dim = options_.head_dim,
                                  .scale = scale,
                                  .formats = &options_.preset.high,
                                  .layouts = &layout_,
                                  .codebooks = &codebooks,
                                  .tier_count = 1,
                                  .pages = refs.data(),
                                  .page_offsets = offsets.data(),
                                  .recent_k = s->k[layer].data(),
                                  .recent_v = s->v[layer].data(),
                                  .recent_tokens = recent});
}

absl::Status PagedKvCache::Commit(int64_t seq, int64_t n) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  const int64_t resid = s->length - s->compressed;
  for (int l = 0; l < options_.layers; ++l) {
    if (static_cast<int64_t>(s->k[l].size()) / row_ < resid + n) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d: committing %d tokens that layer %d did not write", seq, n, l));
    }
  }
  s->length += n;
  return Flush(*s);
}

absl::Status PagedKvCache::Flush(Seq& s) {
  const int64_t group = layout_.token_group;
  const int64_t movable = s.length - s.compressed - options_.preset.residual;
  const int64_t flush = movable / group * group;
  if (flush <= 0) return absl::OkStatus();
  if (options_.preset.high.huffman_bits > 0) {
    SLUICE_RETURN_IF_ERROR(FlushCoded(s, flush));
  } else {
    SLUICE_RETURN_IF_ERROR(FlushFixed(s, flush));
  }
  for (int l = 0; l < options_.layers; ++l) {
    s.k[l].erase(s.k[l].begin(), s.k[l].begin() + flush * row_);
    s.v[l].erase(s.v[l].begin(), s.v[l].begin() + flush * row_);
  }
  s.compressed += flush;
  return absl::OkStatus();
}

absl::Status PagedKvCache::FlushFixed(Seq& s, int64_t flush) {
  const int64_t cap = layout_.tokens;
  // Pages each (layer, head) needs beyond the room left in its last page; one batch
  // allocation for all of them.
  const int64_t lists = static_cast<int64_t>(s.heads.size());
  std::vector<int32_t> counts(lists);
  for (int64_t i = 0; i < lists; ++i) {
    const HeadPages& hp = s.heads[i];
    const int64_t room = hp.LastOpen(layout_.tokens) ? cap - hp.slots.back() : 0;
    counts[i] = static_cast<int32_t>(std::max<int64_t>(0, (flush - room + cap - 1) / cap));
  }
  std::vector<int64_t> offsets;
  std::vector<PageId> fresh;
  if (absl::Status st = pool_->Allocate(counts, &offsets, &fresh); !st.ok()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV page pool exhausted while compressing %d tokens of sequence: %s", flush, st.message()));
  }
  const int64_t valid_bytes = (cap + 63) / 64 * 8;
  for (PageId id : fresh) std::memset(pool_->data(id) + layout_.valid, 0, valid_bytes);
  for (int64_t i = 0; i < lists; ++i) {
    const int layer = static_cast<int>(i / options_.kv_heads);
    const int64_t h = i % options_.kv_heads;
    HeadPages& hp = s.heads[i];
    int64_t next = offsets[i];
    for (int64_t t0 = 0; t0 < flush;) {
      if (!hp.LastOpen(layout_.tokens)) {
        SLUICE_RETURN_IF_ERROR(hp.table.PushHigh(fresh[next++]));
        hp.slots.push_back(0);
        hp.last_closed = false;
      }
      const int64_t chunk = std::min<int64_t>(flush - t0, cap - hp.slots.back());
      SLUICE_RETURN_IF_ERROR(
          backend_.KvQuantize({.k = s.k[layer].data() + t0 * row_ + h * options_.head_dim,
                               .v = s.v[layer].data() + t0 * row_ + h * options_.head_dim,
                               .stride = row_,
                               .tokens = chunk,
                               .format = options_.preset.high,
                               .layout = layout_,
                               .page = pool_->data(hp.table.high(hp.table.high_count() - 1)),
                               .slot = hp.slots.back()}));
      hp.slots.back() += static_cast<int32_t>(chunk);
      t0 += chunk;
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::BuildCodebooks(const Seq& s, int layer, int64_t tokens) {
  // All kv-heads of the layer share its codebooks: their rows go in together, one head after
  // another.
  const int64_t d = options_.head_dim;
  std::vector<float> k(options_.kv_heads * tokens * d), v(k.size());
  for (int64_t h = 0; h < options_.kv_heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(&k[(h * tokens + t) * d], s.k[layer].data() + t * row_ + h * d, d * 4);
      std::memcpy(&v[(h * tokens + t) * d], s.v[layer].data() + t * row_ + h * d, d * 4);
    }
  }
  SLUICE_ASSIGN_OR_RETURN(
      KvCodebookPair books,
      BuildKvCodebooks(backend_, options_.preset.high, k.data(), v.data(), d,
                       options_.kv_heads * tokens, static_cast<uint32_t>(layer) * 2 + 1));
  codebooks_[layer] = std::make_unique<KvCodebookPair>(std::move(books));
  return absl::OkStatus();
}

kernels::KvCodebooks PagedKvCache::Codebooks(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(codebooks_.size()) || !codebooks_[layer]) return {};
  return {.k = &codebooks_[layer]->k, .v = &codebooks_[layer]->v};
}

absl::Status PagedKvCache::FlushCoded(Seq& s, int64_t flush) {
  for (int l = 0; l < options_.layers; ++l) {
    if (!codebooks_[l]) SLUICE_RETURN_IF_ERROR(BuildCodebooks(s, l, flush));
  }
  // How many pages each list will need is known only once its units are coded, so pages come
  // one at a time; on failure every list goes back to where it was.
  struct Mark {
    int32_t pages;
    int32_t last_slots;
    bool last_closed;
  };
  std::vector<Mark> marks;
  marks.reserve(s.heads.size());
  for (const HeadPages& hp : s.heads) {
    marks.push_back(
        {hp.table.high_count(), hp.slots.empty() ? 0 : hp.slots.back(), hp.last_closed});
  }
  auto roll_back = [&](absl::Status st) {
    for (size_t i = 0; i < s.heads.size(); ++i) {
      HeadPages& hp = s.heads[i];
      std::vector<PageId> added;
      while (hp.table.high_count() > marks[i].pages) added.push_back(*hp.table.PopHigh());
      pool_->Free(added).IgnoreError();  // pages this flush took; none is shared
      hp.slots.resize(marks[i].pages);
      if (!hp.slots.empty()) hp.slots.back() = marks[i].last_slots;
      hp.last_closed = marks[i].last_closed;
    }
    return st;
  };
  const int64_t lists = static_cast<int64_t>(s.heads.size());
  for (int64_t i = 0; i < lists; ++i) {
    const int layer = static_cast<int>(i / options_.kv_heads);
    const int64_t h = i % options_.kv_heads;
    HeadPages& hp = s.heads[i];
    for (int64_t t0 = 0; t0 < flush;) {
      if (!hp.LastOpen(layout_.tokens)) {
        absl::StatusOr<PageId> id = AllocatePage(flush);
        if (!id.ok()) return roll_back(id.status());
        if (absl::Status st = hp.table.PushHigh(*id); !st.ok()) {
          pool_->Free({*id}).IgnoreError();
          return roll_back(st);
        }
        hp.slots.push_back(0);
        hp.last_closed = false;
      }
      int64_t written = 0;
      const int64_t want = std::min<int64_t>(flush - t0, layout_.tokens - hp.slots.back());
      absl::Status st =
          backend_.KvQuantize({.k = s.k[layer].data() + t0 * row_ + h * options_.head_dim,
                               .v = s.v[layer].data() + t0 * row_ + h * options_.head_dim,
                               .stride = row_,
                               .tokens = want,
                               .format = options_.preset.high,
                               .layout = layout_,
                               .page = pool_->data(hp.table.high(hp.table.high_count() - 1)),
                               .slot = hp.slots.back(),
                               .codebooks = Codebooks(layer),
                               .tokens_written = &written});
      if (!st.ok()) return roll_back(st);
      if (written == 0 && hp.slots.back() == 0) {
        return roll_back(absl::InternalError(
            absl::StrFormat("layer %d: one unit of %s does not fit an empty %d-byte page", layer,
                            kernels::KvTierFormatName(options_.preset.high), layout_.bytes_used)));
      }
      if (written < want) hp.last_closed = true;  // its bitstream is full
      hp.slots.back() += static_cast<int32_t>(written);
      t0 += written;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PageId> PagedKvCache::AllocatePage(int64_t tokens) {
  absl::StatusOr<PageId> id = pool_->AllocateOne();
  if (!id.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV page pool exhausted while compressing %d tokens of sequence: %s",
                        tokens, id.status().message()));
  }
  std::memset(pool_->data(*id) + layout_.valid, 0, (layout_.tokens + 63) / 64 * 8);
  return *id;
}

absl::Status PagedKvCache::ForkSequence(int64_t src, int64_t dst, int64_t max_tokens) {
  SLUICE_ASSIGN_OR_RETURN(Seq * from, Find(src));
  if (seqs_.contains(dst)) {
    return absl::AlreadyExistsError(absl::StrFormat("sequence %d already has a KV cache", dst));
  }
  if (max_tokens < from->length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens=%d is less than the %d tokens forked from sequence %d",
                        max_tokens, from->length, src));
  }
  const int64_t resid = from->length - from->compressed;
  for (int l = 0; l < options_.layers; ++l) {
    if (static_cast<int64_t>(from->k[l].size()) != resid * row_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d has written tokens it has not committed; fork after Commit", src));
    }
  }
  // Full pages are shared; a partly filled last page gets a private copy.
  std::vector<PageId> shared;
  std::vector<int32_t> copies(from->heads.size());
  for (size_t i = 0; i < from->heads.size(); ++i) {
    const HeadPages& hp = from->heads[i];
    const int32_t n = hp.table.high_count();
    const bool partial = hp.LastOpen(layout_.tokens);
    for (int32_t j = 0; j < n - (partial ? 1 : 0); ++j) shared.push_back(hp.table.high(j));
    copies[i] = partial ? 1 : 0;
  }
  std::vector<int64_t> offsets;
  std::vector<PageId> fresh;
  SLUICE_RETURN_IF_ERROR(pool_->Allocate(copies, &offsets, &fresh));
  if (absl::Status st = pool_->Retain(shared); !st.ok()) {
    pool_->Free(fresh).IgnoreError();
    return st;
  }
  Seq to;
  to.max_tokens = max_tokens;
  to.length = from->length;
  to.compressed = from->compressed;
  to.k = from->k;
  to.v = from->v;
  to.heads.resize(from->heads.size());
  for (size_t i = 0; i < from->heads.size(); ++i) {
    const HeadPages& hp = from->heads[i];
    HeadPages& out = to.heads[i];
    const int32_t n = hp.table.high_count();
    for (int32_t j = 0; j < n; ++j) {
      PageId id = hp.table.high(j);
      if (j == n - 1 && copies[i] == 1) {
        id = fresh[offsets[i]];
        std::memcpy(pool_->data(id), pool_->data(hp.table.high(j)), pool_->page_bytes());
      }
      SLUICE_RETURN_IF_ERROR(out.table.PushHigh(id));
    }
    out.slots = hp.slots;
    out.last_closed = hp.last_closed;
  }
  seqs_.emplace(dst, std::move(to));
  return absl::OkStatus();
}

KvCacheStats PagedKvCache::Stats() const {
  KvCacheStats st;
  st.sequences = static_cast<int64_t>(seqs_.size());
  st.pages.page_bytes = options_.preset.high.page_bytes;
  // Pages shared between forked sequences count once; their tokens count for every sequence
  // in the fp16 baseline (without sharing, each would hold its own copy).
  absl::flat_hash_map<PageId, int32_t> used_slots;
  for (const auto& [id, s] : seqs_) {
    for (const HeadPages& hp : s.heads) {
      const int32_t n = hp.table.high_count();
      for (int32_t i = 0; i < n; ++i) {
        used_slots[hp.table.high(i)] = hp.slots[i];
      }
    }
    st.pages.fp16_bytes +=
        Fp16KvBytes(s.compressed * options_.layers * options_.kv_heads, options_.head_dim);
    const int64_t resid = (s.length - s.compressed) * options_.layers * options_.kv_heads;
    st.residual_tokens += resid;
    st.residual_bytes += resid * options_.head_dim * 2 * 4;
  }
  for (const auto& books : codebooks_) {
    if (books) {
      st.codebook_bytes += static_cast<int64_t>(kernels::SerializeCodebook(books->k).size() +
                                                kernels::SerializeCodebook(books->v).size());
    }
  }
  st.pages.pages_high = static_cast<int64_t>(used_slots.size());
  st.pages.allocated_slots = st.pages.pages_high * layout_.tokens;
  for (const auto& [id, n] : used_slots) st.pages.live_slots += n;
  return st;
}

}  // namespace sluice::kvstore
