#include "kvstore/cache/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "kernels/kv_huffman.h"
#include "kvstore/cache/kv_codebooks.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/slot_bitmap.h"
#include "kvstore/wire/crc32c.h"

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

namespace {

// The attention scale the options ask for: theirs, or 1 / sqrt(head_dim) when it is 0.
float ScaleOf(const PagedKvCacheOptions& o) {
  return o.attention_scale > 0.f ? o.attention_scale
                                 : 1.f / std::sqrt(static_cast<float>(o.head_dim));
}

}  // namespace

template <typename Fn>
void PagedKvCache::ForEachLive(const HeadPages& hp, int t, Fn fn) const {
  const TierPages& tp = hp.tier[t];
  int64_t index = 0;
  for (int32_t p = 0; p < hp.count(t); ++p) {
    const uint64_t* valid = ValidBits(hp.page(t, p), t);
    for (int32_t j = 0; j < tp.slots[p]; ++j, ++index) {
      if (TestSlot(valid, j)) fn(tp.positions[index], p, j);
    }
  }
}

class PagedKvCache::PolicyView final : public policy::SequenceView {
 public:
  PolicyView(PagedKvCache& cache, int64_t id, Seq& s) : cache_(cache), id_(id), s_(s) {}
  int64_t length() const override { return s_.length; }
  int64_t compressed() const override { return s_.compressed; }
  policy::SequenceState& state() override { return s_.policy; }
  policy::ListState& list(int64_t i) override { return s_.heads[i].policy; }
  int64_t lists() const override { return static_cast<int64_t>(s_.heads.size()); }
  void ForEachLive(int64_t i, int tier,
                   absl::FunctionRef<void(const policy::LiveToken&)> fn) const override {
    cache_.ForEachLive(s_.heads[i], tier, [&](int64_t position, int32_t page, int32_t slot) {
      fn({.position = position, .page = page, .slot = slot});
    });
  }
  absl::Status Evict(int64_t i, absl::Span<const int64_t> positions) override {
    return cache_.EvictList(id_, s_, s_.heads[i], positions);
  }
  absl::Status Demote(int64_t i, const policy::LiveToken& token) override {
    return cache_.Demote(s_.heads[i], token.position, token.page, token.slot);
  }

 private:
  PagedKvCache& cache_;
  const int64_t id_;
  Seq& s_;
};

absl::StatusOr<int64_t> PagesForSequence(const KvPreset& preset, int32_t layers, int64_t kv_heads,
                                         int64_t tokens) {
  kernels::KvTierFormat format = preset.high;
  // Huffman-coded pages: every code at the longest length a codebook may give it.
  if (format.huffman_bits > 0) format.huffman_bits = kernels::kMaxHuffmanCodeLength;
  SLUICE_ASSIGN_OR_RETURN(kernels::KvPageLayout layout, kernels::ComputePageLayout(format));
  // Two tiers: low-tier pages hold more tokens than high-tier ones, so splitting the tokens
  // between them costs at most the low tier's partly filled last page more.
  const int64_t extra = preset.low ? 1 : 0;
  return ((tokens + layout.tokens - 1) / layout.tokens + extra) * layers * kv_heads;
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
  if (o.preset.residual < 0) return absl::InvalidArgumentError("preset residual must be >= 0");
  SLUICE_ASSIGN_OR_RETURN(kernels::KvPageLayout layout, kernels::ComputePageLayout(o.preset.high));
  kernels::KvPageLayout low_layout = layout;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<policy::TokenPolicy> token_policy,
                          policy::MakeTokenPolicy(o.preset.policy, {.layers = o.layers,
                                                                    .heads = o.heads,
                                                                    .kv_heads = o.kv_heads,
                                                                    .head_dim = o.head_dim,
                                                                    .scale = ScaleOf(o)}));
  if (token_policy->two_tiers() != o.preset.low.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "preset %s: a low tier goes with a two-tier policy (leankv) and only with one; policy %s",
        o.preset.name, token_policy->name()));
  }
  if (o.preset.low) {
    const kernels::KvTierFormat& low = *o.preset.low;
    SLUICE_ASSIGN_OR_RETURN(low_layout, kernels::ComputePageLayout(low));
    if (low.head_dim != o.head_dim || low.page_bytes != o.preset.high.page_bytes ||
        layout.token_group != 1 || low_layout.token_group != 1 || low.huffman_bits > 0 ||
        o.preset.high.huffman_bits > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "preset %s: both tiers need the model's head_dim, one page size, keys grouped per "
          "token and fixed-width codes (high %s, low %s)",
          o.preset.name, kernels::KvTierFormatName(o.preset.high), kernels::KvTierFormatName(low)));
    }
  }
  if (backend.memory_space() == kernels::MemorySpace::kDevice) {
    // What still runs on host memory: Huffman coding (codebooks from the window's codes, unit
    // sizes read back) and prompt selection (attention over the prompt into host arrays).
    const char* host_only = o.preset.high.huffman_bits > 0   ? "Huffman-coded pages"
                            : token_policy->selects_prompt() ? "prompt selection"
                                                             : nullptr;
    if (host_only != nullptr) {
      return absl::UnimplementedError(absl::StrFormat(
          "preset %s on the %s backend: its %s run on host memory only so far; use the cpu "
          "backend, or a preset without them (fp16, int8, kivi4, kivi2, sluice, sinks, h2o, "
          "leankv-k8v4, leankv-k4v2)",
          o.preset.name, backend.name(), host_only));
    }
  }
  SLUICE_RETURN_IF_ERROR(PagePool::CheckShape(o.pages, o.preset.high.page_bytes));
  kernels::DeviceBuffer arena;
  uint8_t* arena_data = o.arena;
  size_t arena_bytes = o.arena_bytes;
  if (arena_data == nullptr) {
    arena_bytes = static_cast<size_t>(o.pages) * o.preset.high.page_bytes;
    absl::StatusOr<kernels::DeviceBuffer> made =
        kernels::DeviceBuffer::Create(backend, arena_bytes);
    if (!made.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("KV page pool of %d pages of %d bytes: %s; lower the page count", o.pages,
                          o.preset.high.page_bytes, made.status().message()));
    }
    arena = *std::move(made);
    arena_data = arena.as<uint8_t>();
  }
  SLUICE_ASSIGN_OR_RETURN(
      std::unique_ptr<PagePool> pool,
      PagePool::CreateOver(arena_data, arena_bytes, o.pages, o.preset.high.page_bytes));
  // Tiers whose tokens move slot by slot are compacted; the others keep their dead slots.
  std::array<std::unique_ptr<Compactor>, 2> compactors;
  for (int t = 0; t < (o.preset.low ? 2 : 1); ++t) {
    const kernels::KvTierFormat& format = t == 0 ? o.preset.high : *o.preset.low;
    const kernels::KvPageLayout& tier_layout = t == 0 ? layout : low_layout;
    if (tier_layout.token_group != 1 || format.huffman_bits > 0) continue;
    SLUICE_ASSIGN_OR_RETURN(compactors[t], CreateCompactor(backend, format, tier_layout,
                                                           {.base = pool->data(0),
                                                            .pages = pool->num_pages(),
                                                            .page_bytes = pool->page_bytes()}));
  }
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(o, layout, low_layout, std::move(arena),
                                                        std::move(pool), std::move(token_policy),
                                                        std::move(compactors), backend));
}

PagedKvCache::PagedKvCache(const PagedKvCacheOptions& options, kernels::KvPageLayout high,
                           kernels::KvPageLayout low, kernels::DeviceBuffer arena,
                           std::unique_ptr<PagePool> pool,
                           std::unique_ptr<policy::TokenPolicy> policy,
                           std::array<std::unique_ptr<Compactor>, 2> compactors,
                           kernels::Backend& backend)
    : options_(options),
      tiers_(options.preset.low ? 2 : 1),
      formats_{options.preset.high, options.preset.low.value_or(options.preset.high)},
      layouts_{high, low},
      layout_(layouts_[0]),
      row_(options.kv_heads * options.head_dim),
      on_device_(backend.memory_space() == kernels::MemorySpace::kDevice),
      arena_(std::move(arena)),
      pool_(std::move(pool)),
      policy_(std::move(policy)),
      backend_(backend),
      codebooks_(options.layers),
      compactors_(std::move(compactors)) {
  if (on_device_) {
    valid_words_ = SlotBitmapWords(std::max(high.tokens, low.tokens));
    valid_mirror_ = std::make_unique<uint64_t[]>(pool_->num_pages() * valid_words_);
  }
}

void PagedKvCache::MirrorWritten(PageId id, int t, int64_t slot, int64_t n) const {
  if (valid_mirror_ == nullptr) return;
  uint64_t* bits = ValidBits(id, t);
  for (int64_t i = slot; i < slot + n; ++i) bits[i / 64] |= uint64_t{1} << (i % 64);
  MarkValid(id, t);
}

absl::Status PagedKvCache::GrowValidStaging(size_t bytes) const {
  if (valid_staging_.size() >= bytes) return absl::OkStatus();
  valid_staging_.Reset();
  SLUICE_ASSIGN_OR_RETURN(valid_staging_, kernels::DeviceBuffer::Create(backend_, 2 * bytes));
  return absl::OkStatus();
}

absl::Status PagedKvCache::SyncValid() const {
  if (dirty_valid_.empty()) return absl::OkStatus();
  std::sort(dirty_valid_.begin(), dirty_valid_.end());
  dirty_valid_.erase(std::unique(dirty_valid_.begin(), dirty_valid_.end()), dirty_valid_.end());
  const size_t bytes = dirty_valid_.size() * valid_words_ * sizeof(uint64_t);
  SLUICE_RETURN_IF_ERROR(GrowValidStaging(bytes));
  std::vector<uint64_t> staged(dirty_valid_.size() * valid_words_);
  std::vector<kernels::Backend::Copy> copies;
  copies.reserve(dirty_valid_.size());
  for (size_t i = 0; i < dirty_valid_.size(); ++i) {
    const auto [id, t] = dirty_valid_[i];
    const int64_t words = SlotBitmapWords(layouts_[t].tokens);
    std::memcpy(&staged[i * valid_words_], ValidBits(id, t), words * sizeof(uint64_t));
    copies.push_back({.dst = pool_->data(id) + layouts_[t].valid,
                      .src = valid_staging_.as<uint64_t>() + i * valid_words_,
                      .bytes = words * sizeof(uint64_t)});
  }
  dirty_valid_.clear();
  SLUICE_RETURN_IF_ERROR(valid_staging_.Upload(staged.data(), bytes));
  return backend_.CopyOnDevice(copies);
}

absl::Status PagedKvCache::LoadValid(absl::Span<const std::pair<PageId, int>> pages) {
  if (valid_mirror_ == nullptr || pages.empty()) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(SyncValid());  // the staging buffer is free after it
  const size_t bytes = pages.size() * valid_words_ * sizeof(uint64_t);
  SLUICE_RETURN_IF_ERROR(GrowValidStaging(bytes));
  std::vector<kernels::Backend::Copy> gather;
  gather.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const auto [id, t] = pages[i];
    gather.push_back({.dst = valid_staging_.as<uint64_t>() + i * valid_words_,
                      .src = pool_->data(id) + layouts_[t].valid,
                      .bytes = SlotBitmapWords(layouts_[t].tokens) * sizeof(uint64_t)});
  }
  SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(gather));
  std::vector<uint64_t> staged(pages.size() * valid_words_);
  SLUICE_RETURN_IF_ERROR(valid_staging_.Download(staged.data(), bytes));
  for (size_t i = 0; i < pages.size(); ++i) {
    const auto [id, t] = pages[i];
    uint64_t* bits = ValidBits(id, t);
    std::fill(bits, bits + valid_words_, 0);
    std::memcpy(bits, &staged[i * valid_words_], gather[i].bytes);
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::CopyPage(PageId dst, PageId src, int t) {
  SLUICE_RETURN_IF_ERROR(
      backend_.CopyOnDevice({{.dst = pool_->data(dst),
                              .src = pool_->data(src),
                              .bytes = static_cast<size_t>(pool_->page_bytes())}}));
  if (valid_mirror_ != nullptr) {
    std::memcpy(ValidBits(dst, t), ValidBits(src, t), valid_words_ * sizeof(uint64_t));
    MarkValid(dst, t);  // the source's device bits may lag its mirror
  }
  return absl::OkStatus();
}

namespace {

// Pages a device gathers or scatters per host copy (1 MiB of 16 KiB pages).
constexpr int64_t kStagedPages = 64;

}  // namespace

absl::Status PagedKvCache::CheckPageIds(absl::Span<const PageId> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= pool_->num_pages()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page id %d (#%d) is outside the pool of %d pages", ids[i], i, pool_->num_pages()));
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::GrowPageStaging(size_t pages) const {
  const size_t page_bytes = static_cast<size_t>(pool_->page_bytes());
  if (page_staging_.size() < pages * page_bytes) {
    page_staging_.Reset();
    SLUICE_ASSIGN_OR_RETURN(page_staging_,
                            kernels::DeviceBuffer::Create(backend_, kStagedPages * page_bytes));
  }
  host_staging_.resize(pages * page_bytes);
  return absl::OkStatus();
}

absl::Status PagedKvCache::ReadPages(absl::Span<const PageId> ids,
                                     absl::FunctionRef<void(size_t, const uint8_t*)> fn) const {
  SLUICE_RETURN_IF_ERROR(CheckPageIds(ids));
  if (!on_device_) {
    for (size_t i = 0; i < ids.size(); ++i) fn(i, pool_->data(ids[i]));
    return absl::OkStatus();
  }
  SLUICE_RETURN_IF_ERROR(SyncValid());  // the pages' bytes include their valid bits
  const size_t page_bytes = static_cast<size_t>(pool_->page_bytes());
  const size_t batch = std::min<size_t>(ids.size(), kStagedPages);
  SLUICE_RETURN_IF_ERROR(GrowPageStaging(batch));
  std::vector<kernels::Backend::Copy> gather;
  for (size_t first = 0; first < ids.size(); first += batch) {
    const size_t n = std::min(batch, ids.size() - first);
    gather.clear();
    for (size_t i = 0; i < n; ++i) {
      gather.push_back({.dst = page_staging_.as<uint8_t>() + i * page_bytes,
                        .src = pool_->data(ids[first + i]),
                        .bytes = page_bytes});
    }
    SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(gather));
    SLUICE_RETURN_IF_ERROR(page_staging_.Download(host_staging_.data(), n * page_bytes));
    for (size_t i = 0; i < n; ++i) fn(first + i, host_staging_.data() + i * page_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> PagedKvCache::PageCrcs(absl::Span<const PageId> ids) const {
  std::vector<uint32_t> crcs(ids.size());
  const size_t page_bytes = static_cast<size_t>(pool_->page_bytes());
  SLUICE_RETURN_IF_ERROR(
      ReadPages(ids, [&](size_t i, const uint8_t* bytes) { crcs[i] = Crc32c(bytes, page_bytes); }));
  return crcs;
}

absl::Status PagedKvCache::CopyPagesToHost(absl::Span<const PageId> ids, uint8_t* host) const {
  const size_t page_bytes = static_cast<size_t>(pool_->page_bytes());
  return ReadPages(ids, [&](size_t i, const uint8_t* bytes) {
    uint8_t* dst = host + static_cast<size_t>(ids[i]) * page_bytes;
    if (dst != bytes) std::memcpy(dst, bytes, page_bytes);
  });
}

absl::Status PagedKvCache::CopyPagesFromHost(absl::Span<const PageId> ids, const uint8_t* host,
                                             HostLayout layout) {
  SLUICE_RETURN_IF_ERROR(CheckPageIds(ids));
  const size_t page_bytes = static_cast<size_t>(pool_->page_bytes());
  auto source = [&](size_t k) {
    const size_t slot = layout == HostLayout::kPacked ? k : static_cast<size_t>(ids[k]);
    return host + slot * page_bytes;
  };
  if (!on_device_) {
    for (size_t k = 0; k < ids.size(); ++k) {
      if (source(k) != pool_->data(ids[k])) std::memcpy(pool_->data(ids[k]), source(k), page_bytes);
    }
    return absl::OkStatus();
  }
  // Valid bits the mirror still owes the device would land on the new bytes later: send them
  // first (the pages' own bits come with their bytes; ImportSequence loads them).
  SLUICE_RETURN_IF_ERROR(SyncValid());
  const size_t batch = std::min<size_t>(ids.size(), kStagedPages);
  SLUICE_RETURN_IF_ERROR(GrowPageStaging(batch));
  std::vector<kernels::Backend::Copy> scatter;
  for (size_t first = 0; first < ids.size(); first += batch) {
    const size_t n = std::min(batch, ids.size() - first);
    scatter.clear();
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(host_staging_.data() + i * page_bytes, source(first + i), page_bytes);
      scatter.push_back({.dst = pool_->data(ids[first + i]),
                         .src = page_staging_.as<uint8_t>() + i * page_bytes,
                         .bytes = page_bytes});
    }
    // The upload waits for the device, so the staging buffer is free of the last scatter.
    SLUICE_RETURN_IF_ERROR(page_staging_.Upload(host_staging_.data(), n * page_bytes));
    SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(scatter));
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::PrepareScores(int64_t page_size, int64_t recent_size, float** page,
                                         float** recent) {
  page_scores_.assign(std::max<int64_t>(1, page_size), 0.f);
  recent_scores_.assign(std::max<int64_t>(1, recent_size), 0.f);
  if (!on_device_) {
    *page = page_scores_.data();
    *recent = recent_scores_.data();
    return absl::OkStatus();
  }
  const size_t n = page_scores_.size() + recent_scores_.size();
  if (device_scores_.size() < n * sizeof(float)) {
    device_scores_.Reset();
    SLUICE_ASSIGN_OR_RETURN(device_scores_,
                            kernels::DeviceBuffer::Create(backend_, 2 * n * sizeof(float)));
  }
  const std::vector<float> zeros(n, 0.f);
  SLUICE_RETURN_IF_ERROR(device_scores_.Upload(zeros.data(), n * sizeof(float)));
  *page = device_scores_.as<float>();
  *recent = *page + page_scores_.size();
  return absl::OkStatus();
}

absl::Status PagedKvCache::DownloadScores(const float* page, const float* recent) {
  if (!on_device_) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(
      backend_.CopyToHost(page_scores_.data(), page, page_scores_.size() * sizeof(float)));
  return backend_.CopyToHost(recent_scores_.data(), recent, recent_scores_.size() * sizeof(float));
}

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
  for (int l = 0; l < options_.layers; ++l) {
    s.k.emplace_back(row_);
    s.v.emplace_back(row_);
  }
  s.heads.resize(options_.layers * options_.kv_heads);
  return absl::OkStatus();
}

absl::Status PagedKvCache::RemoveSequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  if (InStep(seq)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("sequence %d is in the open step; commit or abort it first", seq));
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

bool PagedKvCache::InStep(int64_t seq) const {
  if (!step_) return false;
  for (const model::StepEntry& e : step_->entries) {
    if (e.seq == seq) return true;
  }
  return false;
}

absl::Status PagedKvCache::BeginStep(absl::Span<const model::StepEntry> batch) {
  if (step_) {
    return absl::FailedPreconditionError("a step is open; commit or abort it before the next");
  }
  if (batch.empty()) return absl::InvalidArgumentError("a step needs at least one sequence");
  std::vector<Seq*> seqs;
  for (size_t b = 0; b < batch.size(); ++b) {
    const model::StepEntry& e = batch[b];
    if (e.tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: %d new tokens; a step entry needs at least one", e.seq, e.tokens));
    }
    for (size_t o = 0; o < b; ++o) {
      if (batch[o].seq == e.seq) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sequence %d is in the step twice", e.seq));
      }
    }
    SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(e.seq));
    if (s->lost_step) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d lost a step after streaming part of it to pages; remove it", e.seq));
    }
    if (s->length + e.tokens > s->max_tokens) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("sequence %d: %d + %d tokens exceed its room of %d", e.seq, s->length,
                          e.tokens, s->max_tokens));
    }
    seqs.push_back(s);
  }
  const int64_t n_batch = static_cast<int64_t>(batch.size()), kvh = options_.kv_heads;
  const int layers = options_.layers;
  SLUICE_RETURN_IF_ERROR(SyncValid());  // the attention reads the pages' valid bits
  StepPlan plan;
  plan.entries.assign(batch.begin(), batch.end());
  plan.q_indptr = {0};
  for (int64_t b = 0; b < n_batch; ++b) {
    Seq& s = *seqs[b];
    const int64_t resid = s.length - s.compressed;
    plan.q_indptr.push_back(plan.q_indptr.back() + static_cast<int32_t>(batch[b].tokens));
    plan.write_row.push_back(resid);
    plan.recent_tokens.push_back(resid + batch[b].tokens);
    // The window takes the new rows now, so its address holds for the whole step.
    for (int l = 0; l < layers; ++l) {
      absl::Status st = s.k[l].Resize(backend_, resid + batch[b].tokens);
      if (st.ok()) st = s.v[l].Resize(backend_, resid + batch[b].tokens);
      if (!st.ok()) {
        for (int64_t o = 0; o <= b; ++o) {  // shrinking cannot fail
          Seq& undo = *seqs[o];
          for (int u = 0; u < layers; ++u) {
            undo.k[u].Resize(backend_, undo.length - undo.compressed).IgnoreError();
            undo.v[u].Resize(backend_, undo.length - undo.compressed).IgnoreError();
          }
        }
        return st;
      }
    }
  }
  const bool per_head = policy_->scores() == policy::ScoreMode::kPerQueryHead;
  const int64_t group = per_head ? options_.heads / kvh : 1;
  for (int t = 0; t < tiers_; ++t) plan.indptr[t] = {0};
  const kernels::MemorySpace space = backend_.memory_space();
  plan.recent_k.reserve(layers * n_batch);
  plan.recent_v.reserve(layers * n_batch);
  plan.page_score_offsets.reserve(layers * n_batch);
  plan.recent_score_offsets.reserve(layers * n_batch);
  for (int l = 0; l < layers; ++l) {
    int64_t page_scores = 0, recent_scores = 0;
    for (int64_t b = 0; b < n_batch; ++b) {
      Seq& s = *seqs[b];
      int64_t seq_slots = 0;
      for (int64_t h = 0; h < kvh; ++h) {
        const HeadPages& hp = s.heads[l * kvh + h];
        for (int t = 0; t < tiers_; ++t) {
          for (int32_t i = 0; i < hp.count(t); ++i) {
            plan.ids[t].push_back(hp.page(t, i));
            plan.slots[t].push_back(hp.tier[t].slots[i]);
            seq_slots += hp.tier[t].slots[i];
          }
          plan.indptr[t].push_back(static_cast<int32_t>(plan.ids[t].size()));
        }
      }
      const int64_t window = plan.recent_tokens[b] * row_;
      plan.recent_k.push_back({.data = s.k[l].data(), .size = window, .space = space});
      plan.recent_v.push_back({.data = s.v[l].data(), .size = window, .space = space});
      plan.seq_slots.push_back(seq_slots);
      plan.page_score_offsets.push_back(page_scores);
      plan.recent_score_offsets.push_back(recent_scores);
      page_scores += group * seq_slots;
      recent_scores += group * kvh * plan.recent_tokens[b];
    }
    plan.page_score_size.push_back(page_scores);
    plan.recent_score_size.push_back(recent_scores);
  }
  plan.written.assign(layers, false);
  for (int l = 0; l < layers; ++l) {
    plan.codebooks.push_back(Codebooks(l));
    for (int t = 1; t < tiers_; ++t) plan.codebooks.push_back({});
  }
  // Queries, outputs and scores come with each layer's call.
  plan.attention = {.layers = layers,
                    .batch = {.batch = n_batch,
                              .q_indptr = plan.q_indptr.data(),
                              .heads = options_.heads,
                              .kv_heads = kvh,
                              .head_dim = options_.head_dim,
                              .scale = AttentionScale(),
                              .formats = formats_,
                              .layouts = layouts_,
                              .codebooks = plan.codebooks.data(),
                              .tier_count = tiers_,
                              .pool = PoolView(),
                              .page_bytes = pool_->page_bytes(),
                              .recent_k = plan.recent_k.data(),
                              .recent_v = plan.recent_v.data(),
                              .recent_tokens = plan.recent_tokens.data(),
                              .scores_per_head = per_head},
                    .scores = policy_->scores() != policy::ScoreMode::kNone,
                    .page_score_offsets = plan.page_score_offsets.data(),
                    .recent_score_offsets = plan.recent_score_offsets.data()};
  for (int t = 0; t < tiers_; ++t) {
    plan.attention.batch.tables[t] = {
        .indptr = plan.indptr[t].data(), .ids = plan.ids[t].data(), .slots = plan.slots[t].data()};
  }
  SLUICE_ASSIGN_OR_RETURN(plan.attention_plan, backend_.PlanBatchPagedAttention(plan.attention));
  // The arrays move with their vectors: the pointers above stay valid.
  step_ = std::move(plan);
  step_seqs_ = std::move(seqs);
  return absl::OkStatus();
}

kernels::BufferView<const uint8_t> PagedKvCache::PoolView() const {
  return {.data = pool_->data(0),
          .size = pool_->num_pages() * pool_->page_bytes(),
          .space = backend_.memory_space()};
}

absl::Status PagedKvCache::CheckStepLayer(int layer) const {
  if (!step_) return absl::FailedPreconditionError("no step is open; BeginStep first");
  if (layer < 0 || layer >= options_.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d outside [0, %d)", layer, options_.layers));
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::Write(int layer, const float* k, const float* v) {
  SLUICE_RETURN_IF_ERROR(CheckStepLayer(layer));
  const StepPlan& plan = *step_;
  std::vector<kernels::Backend::Copy> copies;
  copies.reserve(plan.entries.size() * 2);
  for (size_t b = 0; b < plan.entries.size(); ++b) {
    Seq& s = *step_seqs_[b];
    const int64_t n = plan.entries[b].tokens, row = plan.q_indptr[b];
    const size_t bytes = n * row_ * sizeof(float);
    copies.push_back({.dst = s.k[layer].data() + plan.write_row[b] * row_,
                      .src = k + row * row_,
                      .bytes = bytes});
    copies.push_back({.dst = s.v[layer].data() + plan.write_row[b] * row_,
                      .src = v + row * row_,
                      .bytes = bytes});
  }
  SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(copies));
  step_->written[layer] = true;
  return absl::OkStatus();
}

absl::Status PagedKvCache::Attend(int layer, const float* q, float* out) {
  SLUICE_RETURN_IF_ERROR(CheckStepLayer(layer));
  const StepPlan& plan = *step_;
  if (!plan.written[layer]) {
    return absl::FailedPreconditionError(
        absl::StrFormat("layer %d: attention over new tokens that were not written", layer));
  }
  const int64_t n_batch = static_cast<int64_t>(plan.entries.size()), kvh = options_.kv_heads;
  const int64_t q_row = options_.heads * options_.head_dim;
  // A policy that selects from the whole prompt: its drops wait in the window for the commit.
  if (policy_->selects_prompt()) {
    for (int64_t b = 0; b < n_batch; ++b) {
      Seq& s = *step_seqs_[b];
      const int64_t n = plan.entries[b].tokens;
      if (s.length != 0 || n <= 1) continue;
      SLUICE_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> dropped,
                              policy_->SelectPrompt(backend_, {.layer = layer,
                                                               .q = q + plan.q_indptr[b] * q_row,
                                                               .k = s.k[layer].data(),
                                                               .v = s.v[layer].data(),
                                                               .n = n}));
      for (int64_t h = 0; h < kvh; ++h) AddPending(s.heads[layer * kvh + h], dropped[h]);
    }
  }
  // Policies that score: every key's attention adds to its score (pages in tier and table
  // order, slot by slot, are the order of the tiers' positions), per query head if asked.
  const policy::ScoreMode mode = policy_->scores();
  const bool scores = mode != policy::ScoreMode::kNone;
  const bool per_head = mode == policy::ScoreMode::kPerQueryHead;
  const int64_t group = per_head ? options_.heads / kvh : 1;
  const int64_t at = layer * n_batch;  // the layer's first (layer, entry) of the plan
  const int64_t rows = plan.q_indptr.back();
  const kernels::MemorySpace space = backend_.memory_space();
  float* page_out = nullptr;
  float* recent_out = nullptr;
  if (scores) {
    SLUICE_RETURN_IF_ERROR(PrepareScores(plan.page_score_size[layer], plan.recent_score_size[layer],
                                         &page_out, &recent_out));
  }
  kernels::BatchPagedAttentionParams p = kernels::LayerOfStep(plan.attention, layer);
  p.q = {.data = q, .size = rows * q_row, .space = space};
  p.out = {.data = out, .size = rows * q_row, .space = space};
  p.pool = PoolView();  // where the pool is now (the backend's plan checks its pages against it)
  if (scores) {
    p.page_scores = {
        .data = page_out, .size = static_cast<int64_t>(page_scores_.size()), .space = space};
    p.recent_scores = {
        .data = recent_out, .size = static_cast<int64_t>(recent_scores_.size()), .space = space};
    p.page_score_offsets = plan.page_score_offsets.data() + at;
    p.recent_score_offsets = plan.recent_score_offsets.data() + at;
  }
  p.plan = plan.attention_plan.get();
  SLUICE_RETURN_IF_ERROR(backend_.BatchPagedAttention(p));
  if (!scores) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(DownloadScores(page_out, recent_out));
  for (int64_t b = 0; b < n_batch; ++b) {
    Seq& s = *step_seqs_[b];
    const int64_t n = plan.entries[b].tokens, recent = plan.recent_tokens[b];
    const int64_t total_slots = plan.seq_slots[at + b];
    const float* page_scores = page_scores_.data() + plan.page_score_offsets[at + b];
    const float* recent_scores = recent_scores_.data() + plan.recent_score_offsets[at + b];
    int64_t slot = 0;
    for (int64_t h = 0; h < kvh; ++h) {
      HeadPages& hp = s.heads[layer * kvh + h];
      std::vector<float>& score = hp.policy.score;
      score.resize((s.length + n) * group, 0.f);
      for (int t = 0; t < tiers_; ++t) {
        for (int32_t pos : hp.tier[t].positions) {
          for (int64_t g = 0; g < group; ++g) {
            score[pos * group + g] += page_scores[g * total_slots + slot];
          }
          ++slot;
        }
      }
      for (int64_t r = 0; r < recent; ++r) {
        for (int64_t g = 0; g < group; ++g) {
          score[(s.compressed + r) * group + g] += recent_scores[(h * group + g) * recent + r];
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::Commit() {
  if (!step_) return absl::FailedPreconditionError("no step is open; BeginStep first");
  for (int l = 0; l < options_.layers; ++l) {
    if (!step_->written[l]) {
      const absl::Status st = absl::FailedPreconditionError(
          absl::StrFormat("committing a step that layer %d did not write", l));
      AbortStep();
      return st;
    }
  }
  const StepPlan plan = *std::move(step_);
  const std::vector<Seq*> seqs = std::move(step_seqs_);
  step_.reset();
  step_seqs_.clear();
  // Every sequence's window tokens bound for pages are placed first and quantized in one
  // backend call for the whole step; then the windows shrink and the policies act.
  const size_t n_batch = plan.entries.size();
  std::vector<int64_t> flushed(n_batch, 0);
  std::vector<TierChoice> choices(n_batch);
  QuantizeBatch batch;
  absl::Status st;
  size_t planned = 0;
  for (; planned < n_batch && st.ok(); ++planned) {
    Seq& s = *seqs[planned];
    s.length += plan.entries[planned].tokens;
    PolicyView view(*this, plan.entries[planned].seq, s);
    absl::StatusOr<int64_t> f = PlanFlush(s, view, &choices[planned], &batch);
    if (f.ok()) flushed[planned] = *f;
    st = f.status();
  }
  if (!st.ok()) --planned;  // the failed one placed nothing
  SLUICE_RETURN_IF_ERROR(RunQuantizeBatch(batch));
  absl::Status after;
  for (size_t b = 0; b < planned && after.ok(); ++b) {
    Seq& s = *seqs[b];
    after = FinishFlush(s, flushed[b]);
    PolicyView view(*this, plan.entries[b].seq, s);
    if (after.ok()) after = policy_->AfterCommit(view, plan.entries[b].tokens, choices[b]);
  }
  // The step's evictions are done: the lists they thinned are compacted together.
  const absl::Status compacted = CompactEvicted();
  if (!after.ok()) return after;
  return st.ok() ? compacted : st;
}

void PagedKvCache::AbortStep() {
  if (!step_) return;
  const int64_t group = policy_->scores() == policy::ScoreMode::kPerQueryHead
                            ? options_.heads / options_.kv_heads
                            : 1;
  for (Seq* s : step_seqs_) {
    // The step's tokens take no score and no pending eviction with them (the weight its
    // queries gave the committed tokens stays).
    for (HeadPages& hp : s->heads) {
      if (static_cast<int64_t>(hp.policy.score.size()) > s->length * group) {
        hp.policy.score.resize(s->length * group);
      }
      hp.pending.erase(std::lower_bound(hp.pending.begin(), hp.pending.end(), s->length),
                       hp.pending.end());
    }
    if (!s->early.empty()) {
      // Some layers may have moved tokens of the step to pages already: the sequence's layers
      // disagree now, and only removing it is safe.
      s->lost_step = true;
      s->early.clear();
      s->listener = nullptr;
    }
    const int64_t resid = s->length - s->compressed;
    for (int l = 0; l < options_.layers; ++l) {  // shrinking cannot fail
      s->k[l].Resize(backend_, resid).IgnoreError();
      s->v[l].Resize(backend_, resid).IgnoreError();
    }
  }
  step_.reset();
  step_seqs_.clear();
}

int64_t PagedKvCache::FlushCount(const Seq& s, int64_t length) const {
  const int64_t group = layout_.token_group;
  const int64_t movable = length - s.compressed - options_.preset.residual;
  return movable > 0 ? movable / group * group : 0;
}

absl::Status PagedKvCache::StreamLayers(int64_t seq, LayerListener listener) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (policy_->changes_pages() || tiers_ != 1 || options_.preset.high.huffman_bits > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "preset %s changes or codes its pages after a commit; its KV cannot stream by layer",
        options_.preset.name));
  }
  s->listener = std::move(listener);
  s->early.assign(options_.layers, -1);
  return absl::OkStatus();
}

absl::Status PagedKvCache::LayerDone(int layer) {
  SLUICE_RETURN_IF_ERROR(CheckStepLayer(layer));
  for (size_t b = 0; b < step_->entries.size(); ++b) {
    Seq& s = *step_seqs_[b];
    if (s.early.empty()) continue;
    if (s.early[layer] >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: layer %d is not a layer left to stream", step_->entries[b].seq, layer));
    }
    const int64_t flush = FlushCount(s, s.length + step_->entries[b].tokens);
    if (flush > 0) {
      QuantizeBatch batch;
      SLUICE_RETURN_IF_ERROR(FlushFixed(s, flush, nullptr, layer, &batch));
      SLUICE_RETURN_IF_ERROR(RunQuantizeBatch(batch));
      s.k[layer].DropFront(flush);
      s.v[layer].DropFront(flush);
    }
    s.early[layer] = flush;
    if (s.listener) {
      SLUICE_RETURN_IF_ERROR(SyncValid());  // the listener sends the pages as they are
      std::vector<PageId> pages;
      for (int64_t h = 0; h < options_.kv_heads; ++h) {
        const HeadPages& hp = s.heads[layer * options_.kv_heads + h];
        for (int32_t i = 0; i < hp.count(0); ++i) pages.push_back(hp.page(0, i));
      }
      s.listener(layer, std::move(pages));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PagedKvCache::PlanFlush(Seq& s, policy::SequenceView& view,
                                                TierChoice* choice, QuantizeBatch* batch) {
  const int64_t flush = FlushCount(s, s.length);
  if (!s.early.empty()) {
    // Streamed: every layer moved its tokens to pages when it was done.
    std::vector<int64_t> early = std::move(s.early);
    s.early.clear();
    s.listener = nullptr;
    for (int l = 0; l < options_.layers; ++l) {
      if (early[l] != flush) {
        return absl::InternalError(absl::StrFormat(
            "layer %d streamed %d tokens to pages, the commit moves %d", l, early[l], flush));
      }
    }
    s.compressed += flush;
    return 0;
  }
  if (flush <= 0) return 0;
  if (options_.preset.high.huffman_bits > 0) {
    SLUICE_RETURN_IF_ERROR(FlushCoded(s, flush));
  } else {
    *choice = policy_->ChooseTiers(view, flush);
    SLUICE_RETURN_IF_ERROR(FlushFixed(s, flush, choice->empty() ? nullptr : choice, -1, batch));
  }
  return flush;
}

absl::Status PagedKvCache::RunQuantizeBatch(QuantizeBatch& batch) {
  SLUICE_RETURN_IF_ERROR(backend_.KvQuantizeBatch(batch.items));
  // Padding rows of a last token group: dead slots.
  for (const QuantizeBatch::DeadSlot& d : batch.dead) {
    ClearSlot(ValidBits(d.page, d.tier), d.slot);
    MarkValid(d.page, d.tier);
  }
  batch = QuantizeBatch();
  return absl::OkStatus();
}

absl::Status PagedKvCache::FinishFlush(Seq& s, int64_t flush) {
  if (flush <= 0) return absl::OkStatus();
  for (int l = 0; l < options_.layers; ++l) {
    s.k[l].DropFront(flush);
    s.v[l].DropFront(flush);
  }
  s.compressed += flush;
  // Evictions that waited for their tokens to reach pages.
  for (HeadPages& hp : s.heads) {
    const auto paged = std::lower_bound(hp.pending.begin(), hp.pending.end(), s.compressed);
    if (paged == hp.pending.begin()) continue;
    std::vector<int64_t> now(hp.pending.begin(), paged);
    hp.pending.erase(hp.pending.begin(), paged);
    SLUICE_RETURN_IF_ERROR(EvictPaged(hp, now));
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::FlushFixed(Seq& s, int64_t flush, const TierChoice* choice,
                                      int only_layer, QuantizeBatch* batch) {
  const int64_t d = options_.head_dim, group = layout_.token_group;
  const int64_t lists = static_cast<int64_t>(s.heads.size());
  const int64_t first = only_layer >= 0 ? only_layer * options_.kv_heads : 0;
  const int64_t last = only_layer >= 0 ? first + options_.kv_heads : lists;
  // The rows each (layer, head) writes to each tier. Tokens evicted while still in the
  // full-precision window (a prompt-phase policy) are dropped here and never take a slot; with
  // K grouped over several tokens, the last group is padded with copies of its last row in
  // dead slots.
  std::vector<std::vector<int64_t>> rows(lists * 2);
  for (int64_t i = first; i < last; ++i) {
    const std::vector<int64_t>& pending = s.heads[i].pending;
    auto next_evicted = std::lower_bound(pending.begin(), pending.end(), s.compressed);
    for (int64_t t = 0; t < flush; ++t) {
      if (next_evicted != pending.end() && *next_evicted == s.compressed + t) {
        ++next_evicted;
        continue;
      }
      const int tier = choice != nullptr ? (*choice)[i][t] : 0;
      if (tier >= 0) rows[i * 2 + tier].push_back(t);
    }
  }
  // Pages each list needs in each tier beyond the room left in its last page; one batch
  // allocation.
  std::vector<int32_t> counts(lists * 2);
  for (int64_t i = 0; i < lists * 2; ++i) {
    const TierPages& tp = s.heads[i / 2].tier[i % 2];
    const int64_t cap = layouts_[i % 2].tokens;
    const int64_t room = tp.LastOpen(cap) ? cap - tp.slots.back() : 0;
    const int64_t n = (static_cast<int64_t>(rows[i].size()) + group - 1) / group * group;
    counts[i] = static_cast<int32_t>(std::max<int64_t>(0, (n - room + cap - 1) / cap));
  }
  std::vector<int64_t> offsets;
  std::vector<PageId> fresh;
  if (absl::Status st = pool_->Allocate(counts, &offsets, &fresh); !st.ok()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV page pool exhausted while compressing %d tokens of sequence: %s", flush, st.message()));
  }
  for (int64_t i = 0; i < lists * 2; ++i) {
    const int layer = static_cast<int>(i / 2 / options_.kv_heads);
    const int64_t h = i / 2 % options_.kv_heads;
    const int tier = static_cast<int>(i % 2);
    HeadPages& hp = s.heads[i / 2];
    const int64_t n = static_cast<int64_t>(rows[i].size());
    if (n == 0) continue;
    const int64_t padded = (n + group - 1) / group * group;
    kernels::BufferView<const float> src_k = s.k[layer].view().subview(h * d);
    kernels::BufferView<const float> src_v = s.v[layer].view().subview(h * d);
    int64_t stride = row_;
    if (n < flush) {
      // The rows this list keeps, gathered on the backend (kept until the batch is quantized).
      SLUICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer k,
                              kernels::DeviceBuffer::Create(backend_, padded * d * sizeof(float)));
      SLUICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer v,
                              kernels::DeviceBuffer::Create(backend_, padded * d * sizeof(float)));
      std::vector<kernels::Backend::Copy> gather;
      gather.reserve(padded * 2);
      for (int64_t r = 0; r < padded; ++r) {
        const int64_t from = rows[i][std::min(r, n - 1)];
        gather.push_back({.dst = k.as<float>() + r * d,
                          .src = src_k.data + from * row_,
                          .bytes = d * sizeof(float)});
        gather.push_back({.dst = v.as<float>() + r * d,
                          .src = src_v.data + from * row_,
                          .bytes = d * sizeof(float)});
      }
      SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(gather));
      src_k = k.view<const float>();
      src_v = v.view<const float>();
      stride = d;
      batch->rows.push_back(std::move(k));
      batch->rows.push_back(std::move(v));
    }
    int64_t next = offsets[i];
    SLUICE_RETURN_IF_ERROR(WriteRows(hp, tier, src_k, src_v, stride, padded, fresh, &next, batch));
    TierPages& tp = hp.tier[tier];
    for (int64_t t : rows[i]) tp.positions.push_back(static_cast<int32_t>(s.compressed + t));
    // Padding: dead slots, listed under the last row's position (positions stay sorted).
    for (int64_t r = n; r < padded; ++r) tp.positions.push_back(tp.positions.back());
    int32_t slot = tp.slots.back() - static_cast<int32_t>(padded - n);
    const PageId last = hp.page(tier, hp.count(tier) - 1);
    for (int64_t r = n; r < padded; ++r, ++slot) batch->dead.push_back({last, tier, slot});
  }
  for (HeadPages& hp : s.heads) {  // the dropped tokens' evictions are done
    auto& pending = hp.pending;
    pending.erase(std::lower_bound(pending.begin(), pending.end(), s.compressed),
                  std::lower_bound(pending.begin(), pending.end(), s.compressed + flush));
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::WriteRows(HeadPages& hp, int t, kernels::BufferView<const float> k,
                                     kernels::BufferView<const float> v, int64_t stride, int64_t n,
                                     const std::vector<PageId>& fresh, int64_t* next,
                                     QuantizeBatch* batch) {
  const kernels::KvPageLayout& layout = layouts_[t];
  TierPages& tp = hp.tier[t];
  for (int64_t t0 = 0; t0 < n;) {
    if (!tp.LastOpen(layout.tokens)) {
      const PageId id = fresh[(*next)++];
      std::memset(ValidBits(id, t), 0, SlotBitmapWords(layout.tokens) * sizeof(uint64_t));
      MarkValid(id, t);
      SLUICE_RETURN_IF_ERROR(hp.Push(t, id));
      tp.slots.push_back(0);
      tp.last_closed = false;
    }
    const int64_t chunk = std::min<int64_t>(n - t0, layout.tokens - tp.slots.back());
    batch->items.push_back({.k = k.subview(t0 * stride),
                            .v = v.subview(t0 * stride),
                            .stride = stride,
                            .tokens = chunk,
                            .format = formats_[t],
                            .layout = layout,
                            .page = PageView(hp.page(t, hp.count(t) - 1)),
                            .slot = tp.slots.back()});
    MirrorWritten(hp.page(t, hp.count(t) - 1), t, tp.slots.back(), chunk);
    tp.slots.back() += static_cast<int32_t>(chunk);
    t0 += chunk;
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

float PagedKvCache::AttentionScale() const { return ScaleOf(options_); }

kernels::KvCodebooks PagedKvCache::Codebooks(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(codebooks_.size()) || !codebooks_[layer]) return {};
  return {.k = &codebooks_[layer]->k, .v = &codebooks_[layer]->v};
}

absl::Status PagedKvCache::FlushCoded(Seq& s, int64_t flush) {
  for (int l = 0; l < options_.layers; ++l) {
    if (!codebooks_[l]) SLUICE_RETURN_IF_ERROR(BuildCodebooks(s, l, flush));
  }
  // How many pages each list will need is known only once its units are coded, so each list
  // takes its pages one at a time; on failure every list goes back to where it was.
  struct Mark {
    int32_t pages;
    int32_t last_slots;
    bool last_closed;
  };
  std::vector<Mark> marks;
  marks.reserve(s.heads.size());
  for (const HeadPages& hp : s.heads) {
    const TierPages& tp = hp.tier[0];
    marks.push_back(
        {hp.table.high_count(), tp.slots.empty() ? 0 : tp.slots.back(), tp.last_closed});
  }
  auto roll_back = [&](absl::Status st) {
    for (size_t i = 0; i < s.heads.size(); ++i) {
      HeadPages& hp = s.heads[i];
      TierPages& tp = hp.tier[0];
      std::vector<PageId> added;
      while (hp.table.high_count() > marks[i].pages) added.push_back(*hp.table.PopHigh());
      pool_->Free(added).IgnoreError();  // pages this flush took; none is shared
      tp.slots.resize(marks[i].pages);
      if (!tp.slots.empty()) tp.slots.back() = marks[i].last_slots;
      int64_t written = 0;
      for (int32_t n : tp.slots) written += n;
      tp.positions.resize(written);
      tp.last_closed = marks[i].last_closed;
    }
    return st;
  };
  // Rounds: each list still short of `flush` codes what its last page takes, every list's in
  // one KvQuantizeBatch (distinct pages); a list whose page filled gets a fresh one next round.
  const int64_t lists = static_cast<int64_t>(s.heads.size());
  std::vector<int64_t> done(lists, 0), written(lists, 0), want(lists, 0);
  std::vector<int64_t> round;  // the lists of this round
  std::vector<kernels::KvQuantizeParams> items;
  for (;;) {
    round.clear();
    items.clear();
    for (int64_t i = 0; i < lists; ++i) {
      if (done[i] >= flush) continue;
      const int layer = static_cast<int>(i / options_.kv_heads);
      const int64_t h = i % options_.kv_heads;
      HeadPages& hp = s.heads[i];
      TierPages& tp = hp.tier[0];
      if (!tp.LastOpen(layout_.tokens)) {
        absl::StatusOr<PageId> id = AllocatePage(flush);
        if (!id.ok()) return roll_back(id.status());
        if (absl::Status st = hp.table.PushHigh(*id); !st.ok()) {
          pool_->Free({*id}).IgnoreError();
          return roll_back(st);
        }
        tp.slots.push_back(0);
        tp.last_closed = false;
      }
      written[i] = 0;
      want[i] = std::min<int64_t>(flush - done[i], layout_.tokens - tp.slots.back());
      round.push_back(i);
      items.push_back({.k = s.k[layer].view().subview(done[i] * row_ + h * options_.head_dim),
                       .v = s.v[layer].view().subview(done[i] * row_ + h * options_.head_dim),
                       .stride = row_,
                       .tokens = want[i],
                       .format = options_.preset.high,
                       .layout = layout_,
                       .page = PageView(hp.table.high(hp.table.high_count() - 1)),
                       .slot = tp.slots.back(),
                       .codebooks = Codebooks(layer),
                       .tokens_written = &written[i]});
    }
    if (round.empty()) return absl::OkStatus();
    if (absl::Status st = backend_.KvQuantizeBatch(items); !st.ok()) return roll_back(st);
    for (const int64_t i : round) {
      TierPages& tp = s.heads[i].tier[0];
      if (written[i] == 0 && tp.slots.back() == 0) {
        return roll_back(absl::InternalError(
            absl::StrFormat("layer %d: one unit of %s does not fit an empty %d-byte page",
                            static_cast<int>(i / options_.kv_heads),
                            kernels::KvTierFormatName(options_.preset.high), layout_.bytes_used)));
      }
      if (written[i] < want[i]) tp.last_closed = true;  // its bitstream is full
      for (int64_t t = done[i]; t < done[i] + written[i]; ++t) {
        tp.positions.push_back(static_cast<int32_t>(s.compressed + t));
      }
      tp.slots.back() += static_cast<int32_t>(written[i]);
      done[i] += written[i];
    }
  }
}

absl::StatusOr<PageId> PagedKvCache::AllocatePage(int64_t tokens) {
  absl::StatusOr<PageId> id = pool_->AllocateOne();
  if (!id.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV page pool exhausted while compressing %d tokens of sequence: %s",
                        tokens, id.status().message()));
  }
  std::memset(ValidBits(*id, 0), 0, SlotBitmapWords(layout_.tokens) * sizeof(uint64_t));
  MarkValid(*id, 0);
  return *id;
}

absl::Status PagedKvCache::CollectPages(int64_t seq, absl::flat_hash_set<PageId>& pages) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  for (const HeadPages& hp : it->second.heads) {
    for (int t = 0; t < tiers_; ++t) {
      for (int32_t j = 0; j < hp.count(t); ++j) pages.insert(hp.page(t, j));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PagedKvCache::SharedLeadingPages(int64_t a, int64_t b) const {
  auto ia = seqs_.find(a), ib = seqs_.find(b);
  if (ia == seqs_.end() || ib == seqs_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("sequence %d has no KV cache", ia == seqs_.end() ? a : b));
  }
  std::vector<int32_t> out;
  out.reserve(ia->second.heads.size() * tiers_);
  for (size_t i = 0; i < ia->second.heads.size(); ++i) {
    const HeadPages& x = ia->second.heads[i];
    const HeadPages& y = ib->second.heads[i];
    for (int t = 0; t < tiers_; ++t) {
      int32_t n = 0;
      while (n < x.count(t) && n < y.count(t) && x.page(t, n) == y.page(t, n)) ++n;
      out.push_back(n);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<PageId>>> PagedKvCache::LeadingPages(
    int64_t seq, absl::Span<const int32_t> counts) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  const std::vector<HeadPages>& heads = it->second.heads;
  if (counts.size() != heads.size() * tiers_) {
    return absl::InvalidArgumentError(absl::StrFormat("%d page runs named, sequence %d has %d",
                                                      counts.size(), seq, heads.size() * tiers_));
  }
  std::vector<std::vector<PageId>> out(counts.size());
  for (size_t x = 0; x < counts.size(); ++x) {
    const HeadPages& hp = heads[x / tiers_];
    const int t = static_cast<int>(x % tiers_);
    if (counts[x] < 0 || counts[x] > hp.count(t)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "run %d: %d leading pages asked for, it has %d", x, counts[x], hp.count(t)));
    }
    for (int32_t j = 0; j < counts[x]; ++j) out[x].push_back(hp.page(t, j));
  }
  return out;
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
    if (from->k[l].rows() != resid) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d has written tokens it has not committed; fork after Commit", src));
    }
  }
  // Full pages are shared; each tier's partly filled last page gets a private copy.
  std::vector<PageId> shared;
  std::vector<int32_t> copies(from->heads.size() * 2);
  for (size_t i = 0; i < from->heads.size(); ++i) {
    const HeadPages& hp = from->heads[i];
    for (int t = 0; t < tiers_; ++t) {
      const bool partial = hp.tier[t].LastOpen(layouts_[t].tokens);
      for (int32_t j = 0; j < hp.count(t) - (partial ? 1 : 0); ++j) shared.push_back(hp.page(t, j));
      copies[i * 2 + t] = partial ? 1 : 0;
    }
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
  to.policy = from->policy;
  absl::Status copied;
  for (int l = 0; l < options_.layers && copied.ok(); ++l) {
    absl::StatusOr<RowWindow> k = from->k[l].Clone(backend_);
    absl::StatusOr<RowWindow> v = from->v[l].Clone(backend_);
    copied = !k.ok() ? k.status() : v.status();
    if (copied.ok()) {
      to.k.push_back(*std::move(k));
      to.v.push_back(*std::move(v));
    }
  }
  if (!copied.ok()) {
    pool_->Free(fresh).IgnoreError();
    pool_->Free(shared).IgnoreError();
    return copied;
  }
  to.heads.resize(from->heads.size());
  for (size_t i = 0; i < from->heads.size(); ++i) {
    const HeadPages& hp = from->heads[i];
    HeadPages& out = to.heads[i];
    for (int t = 0; t < tiers_; ++t) {
      const int32_t n = hp.count(t);
      for (int32_t j = 0; j < n; ++j) {
        PageId id = hp.page(t, j);
        if (j == n - 1 && copies[i * 2 + t] == 1) {
          id = fresh[offsets[i * 2 + t]];
          SLUICE_RETURN_IF_ERROR(CopyPage(id, hp.page(t, j), t));
        }
        SLUICE_RETURN_IF_ERROR(out.Push(t, id));
      }
      out.tier[t] = hp.tier[t];
    }
    out.pending = hp.pending;
    out.policy = hp.policy;
  }
  seqs_.emplace(dst, std::move(to));
  return absl::OkStatus();
}

absl::Status PagedKvCache::Evict(int64_t seq, int layer, int64_t kv_head,
                                 absl::Span<const int64_t> positions) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (layer < 0 || layer >= options_.layers || kv_head < 0 || kv_head >= options_.kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d / kv-head %d outside [0, %d) / [0, %d)", layer, kv_head,
                        options_.layers, options_.kv_heads));
  }
  if (InStep(seq)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence %d is in the open step, whose page tables hold its pages; evict after it", seq));
  }
  const absl::Status evicted =
      EvictList(seq, *s, s->heads[layer * options_.kv_heads + kv_head], positions);
  const absl::Status compacted = CompactEvicted();
  return evicted.ok() ? compacted : evicted;
}

absl::Status PagedKvCache::EvictList(int64_t seq, Seq& s, HeadPages& hp,
                                     absl::Span<const int64_t> positions) {
  for (int64_t p : positions) {
    if (p < 0 || p >= s.length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: position %d outside its %d committed tokens", seq, p, s.length));
    }
  }
  std::vector<int64_t> paged, window;
  for (int64_t p : positions) (p < s.compressed ? paged : window).push_back(p);
  AddPending(hp, window);
  return EvictPaged(hp, paged);
}

void PagedKvCache::AddPending(HeadPages& hp, absl::Span<const int64_t> positions) {
  hp.pending.insert(hp.pending.end(), positions.begin(), positions.end());
  std::sort(hp.pending.begin(), hp.pending.end());
  hp.pending.erase(std::unique(hp.pending.begin(), hp.pending.end()), hp.pending.end());
}

absl::Status PagedKvCache::Demote(HeadPages& hp, int64_t position, int32_t page, int32_t slot) {
  const int64_t d = options_.head_dim;
  if (demote_rows_.data() == nullptr) {
    SLUICE_ASSIGN_OR_RETURN(demote_rows_,
                            kernels::DeviceBuffer::Create(backend_, 2 * d * sizeof(float)));
  }
  const kernels::BufferView<float> k = demote_rows_.view<float>();
  const kernels::BufferView<float> v = k.subview(d);
  SLUICE_RETURN_IF_ERROR(backend_.KvDequantize({.page = PageView(hp.page(0, page)),
                                                .format = formats_[0],
                                                .layout = layouts_[0],
                                                .slot = slot,
                                                .tokens = 1,
                                                .k = k,
                                                .v = v}));
  std::vector<PageId> fresh;
  if (!hp.tier[1].LastOpen(layouts_[1].tokens)) {
    SLUICE_ASSIGN_OR_RETURN(const PageId id, AllocatePage(1));
    fresh.push_back(id);
  }
  int64_t next = 0;
  QuantizeBatch batch;
  SLUICE_RETURN_IF_ERROR(WriteRows(hp, 1, k, v, d, 1, fresh, &next, &batch));
  SLUICE_RETURN_IF_ERROR(RunQuantizeBatch(batch));
  hp.tier[1].positions.push_back(static_cast<int32_t>(position));
  SLUICE_RETURN_IF_ERROR(EvictPaged(hp, {position}));  // finds the high-tier copy first
  ++demoted_;
  return absl::OkStatus();
}

absl::Status PagedKvCache::EvictPaged(HeadPages& hp, const std::vector<int64_t>& positions) {
  // Each position's live slot, the high tier's before the low tier's (a demoted token is live
  // in both until its high-tier copy goes). Compaction reorders slots, so positions are found
  // by search: a scan of the positions array each for a few, one pass over the live slots for
  // many.
  std::vector<int64_t> want = positions;
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  std::vector<bool> found(want.size(), false);
  struct Hit {
    int t;
    int32_t page, slot;
  };
  std::vector<Hit> hits;
  if (want.size() <= 8) {
    // A few positions (a policy's step): a scan of the positions array for each, which costs a
    // third of a pass over the live slots (perf, h2o at batch 16).
    for (const int64_t position : want) {
      bool hit = false;
      for (int t = 0; t < tiers_ && !hit; ++t) {
        const std::vector<int32_t>& positions = hp.tier[t].positions;
        const int32_t p = static_cast<int32_t>(position);
        for (auto at = std::find(positions.begin(), positions.end(), p); at != positions.end();
             at = std::find(at + 1, positions.end(), p)) {
          int64_t slot = at - positions.begin();
          int32_t page = 0;
          while (slot >= hp.tier[t].slots[page]) slot -= hp.tier[t].slots[page++];
          if (!TestSlot(ValidBits(hp.page(t, page), t), slot)) continue;  // a dead copy
          hits.push_back({t, page, static_cast<int32_t>(slot)});
          hit = true;
          break;
        }
      }
    }
  } else {
    for (int t = 0; t < tiers_ && hits.size() < want.size(); ++t) {
      ForEachLive(hp, t, [&](int64_t position, int32_t page, int32_t slot) {
        const auto at = std::lower_bound(want.begin(), want.end(), position);
        if (at == want.end() || *at != position || found[at - want.begin()]) return;
        found[at - want.begin()] = true;
        hits.push_back({t, page, slot});
      });
    }
  }
  std::vector<int32_t> touched[2];
  for (const Hit& h : hits) {
    PageId id = hp.page(h.t, h.page);
    if (pool_->refcount(id) > 1) {  // shared with a fork: this sequence gets its own copy
      SLUICE_ASSIGN_OR_RETURN(const PageId copy, AllocatePage(1));
      SLUICE_RETURN_IF_ERROR(CopyPage(copy, id, h.t));
      SLUICE_RETURN_IF_ERROR(pool_->Free({id}));
      SLUICE_RETURN_IF_ERROR(hp.Replace(h.t, h.page, copy));
      id = copy;
    }
    ClearSlot(ValidBits(id, h.t), h.slot);
    MarkValid(id, h.t);
    touched[h.t].push_back(h.page);
  }
  for (int t = 0; t < tiers_; ++t) {
    TierPages& tp = hp.tier[t];
    std::sort(touched[t].begin(), touched[t].end());
    touched[t].erase(std::unique(touched[t].begin(), touched[t].end()), touched[t].end());
    // Pages with no live slot go back to the pool; from the back, so the indices hold.
    for (auto it = touched[t].rbegin(); it != touched[t].rend(); ++it) {
      const int32_t i = *it;
      const PageId id = hp.page(t, i);
      if (CountValid(ValidBits(id, t), tp.slots[i]) > 0) continue;
      const bool last = i + 1 == hp.count(t);
      SLUICE_RETURN_IF_ERROR(hp.Erase(t, i));
      SLUICE_RETURN_IF_ERROR(pool_->Free({id}));
      int64_t begin = 0;
      for (int32_t j = 0; j < i; ++j) begin += tp.slots[j];
      tp.positions.erase(tp.positions.begin() + begin, tp.positions.begin() + begin + tp.slots[i]);
      tp.slots.erase(tp.slots.begin() + i);
      // The page before a freed last page was full or closed; new tokens open a fresh one.
      if (last) tp.last_closed = !tp.slots.empty();
    }
    evicted_lists_.push_back({&hp, t});
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::CompactEvicted() {
  // In the order of their first eviction (the pages freed go back to the pool in that order).
  std::vector<std::pair<HeadPages*, int>> evicted;
  absl::flat_hash_set<std::pair<HeadPages*, int>> seen;
  for (const auto& list : std::exchange(evicted_lists_, {})) {
    if (seen.insert(list).second) evicted.push_back(list);
  }
  for (int t = 0; t < tiers_; ++t) {
    if (compactors_[t] == nullptr) continue;
    const int32_t cap = layouts_[t].tokens;
    std::vector<HeadPages*> due;
    std::vector<std::vector<PageId>> ids;
    std::vector<std::vector<uint64_t*>> bitmaps;
    for (const auto& [hp, tier] : evicted) {
      if (tier != t) continue;
      const TierPages& tp = hp->tier[t];
      const int32_t n = hp->count(t);
      std::vector<PageId> list(n);
      std::vector<uint64_t*> bits(n);
      int64_t written = 0, live = 0;
      bool shared = false;
      for (int32_t i = 0; i < n && !shared; ++i) {
        list[i] = hp->page(t, i);
        shared = pool_->refcount(list[i]) > 1;  // shared with a fork: leave the list as is
        bits[i] = ValidBits(list[i], t);
        written += tp.slots[i];
        live += CountValid(bits[i], tp.slots[i]);
      }
      // Compact once a page's worth of slots is dead: the planner keeps the fullest pages,
      // moves the other pages' live tokens into their holes and frees the pages it emptied.
      if (shared || written - live < cap) continue;
      due.push_back(hp);
      ids.push_back(std::move(list));
      bitmaps.push_back(std::move(bits));
    }
    if (due.empty()) continue;
    const absl::Time start = absl::Now();
    // The compactor reads (and on a device, moves) the pages' own valid bits: the live ones.
    SLUICE_RETURN_IF_ERROR(SyncValid());
    std::vector<CompactionList> lists(due.size());
    for (size_t i = 0; i < due.size(); ++i) {
      lists[i] = {.pages = ids[i], .bitmaps = bitmaps[i], .used_slots = due[i]->tier[t].slots};
    }
    std::vector<CompactionPlan> plans;
    SLUICE_RETURN_IF_ERROR(compactors_[t]->Compact(lists, &plans));
    for (size_t i = 0; i < due.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(RebuildCompacted(*due[i], t, plans[i]));
    }
    compactions_ += static_cast<int64_t>(due.size());
    compaction_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::RebuildCompacted(HeadPages& hp, int t, const CompactionPlan& plan) {
  TierPages& tp = hp.tier[t];
  const int32_t n = hp.count(t);
  // Each page's slot positions, to follow the moves: a kept page's new slots are all some
  // move's destination.
  std::vector<std::vector<int32_t>> positions(n);
  int64_t index = 0;
  for (int32_t i = 0; i < n; ++i) {
    positions[i].assign(tp.positions.begin() + index, tp.positions.begin() + index + tp.slots[i]);
    index += tp.slots[i];
    positions[i].resize(std::max(tp.slots[i], plan.used_after[i]),
                        positions[i].empty() ? 0 : positions[i].back());
  }
  for (const SlotMove& m : plan.moves) {
    for (int32_t k = 0; k < m.slots; ++k) {
      positions[m.dst_page][m.dst_slot + k] = positions[m.src_page][m.src_slot + k];
    }
  }
  // The host's bits are the plan's; where the compactor left the pages' own bits behind (only
  // destinations set), they go back to the pages (nothing on a host backend: they are the same).
  if (!compactors_[t]->moves_page_bits()) {
    for (int32_t i = 0; i < n; ++i) MarkValid(hp.page(t, i), t);
  }
  // The kept pages stay in table order, except that the one with the most room after its
  // used slots goes last, where new tokens are appended; the emptied pages go back.
  std::vector<bool> gone(n, false);
  for (int32_t i : plan.freed) gone[i] = true;
  std::vector<int32_t> order;
  for (int32_t i = 0; i < n; ++i) {
    if (!gone[i]) order.push_back(i);
  }
  if (!order.empty()) {
    const auto roomiest = std::max_element(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return plan.used_after[a] > plan.used_after[b];
    });
    std::rotate(roomiest, roomiest + 1, order.end());
  }
  std::vector<PageId> ids(n), freed;
  for (int32_t i = 0; i < n; ++i) ids[i] = hp.page(t, i);
  for (int32_t i : plan.freed) freed.push_back(ids[i]);
  while (hp.count(t) > 0) SLUICE_RETURN_IF_ERROR(hp.Pop(t).status());
  tp.slots.clear();
  tp.positions.clear();
  for (int32_t i : order) {
    SLUICE_RETURN_IF_ERROR(hp.Push(t, ids[i]));
    tp.slots.push_back(plan.used_after[i]);
    tp.positions.insert(tp.positions.end(), positions[i].begin(),
                        positions[i].begin() + plan.used_after[i]);
  }
  SLUICE_RETURN_IF_ERROR(pool_->Free(freed));
  tp.last_closed = false;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PagedKvCache::TokenPlace>> PagedKvCache::LiveTokens(
    int64_t seq, int layer, int64_t kv_head) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  if (layer < 0 || layer >= options_.layers || kv_head < 0 || kv_head >= options_.kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d / kv-head %d outside [0, %d) / [0, %d)", layer, kv_head,
                        options_.layers, options_.kv_heads));
  }
  const HeadPages& hp = it->second.heads[layer * options_.kv_heads + kv_head];
  std::vector<TokenPlace> out;
  for (int t = 0; t < tiers_; ++t) {
    ForEachLive(hp, t, [&](int64_t pos, int32_t, int32_t) { out.push_back({pos, t}); });
  }
  return out;
}

KvCacheStats PagedKvCache::Stats() const {
  KvCacheStats st;
  st.sequences = static_cast<int64_t>(seqs_.size());
  st.demoted = demoted_;
  st.compactions = compactions_;
  st.compaction_seconds = compaction_seconds_;
  st.pages.page_bytes = options_.preset.high.page_bytes;
  // Pages shared between forked sequences count once; their tokens count for every sequence
  // in the fp16 baseline (without sharing, each would hold its own copy).
  absl::flat_hash_map<PageId, std::pair<int, int32_t>> used;  // tier, slots written
  for (const auto& [id, s] : seqs_) {
    for (const HeadPages& hp : s.heads) {
      for (int t = 0; t < tiers_; ++t) {
        for (int32_t i = 0; i < hp.count(t); ++i) used[hp.page(t, i)] = {t, hp.tier[t].slots[i]};
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
  for (const auto& [id, where] : used) {
    const auto [t, n] = where;
    (t == 0 ? st.pages.pages_high : st.pages.pages_low) += 1;
    st.pages.allocated_slots += layouts_[t].tokens;
    st.pages.live_slots += CountValid(ValidBits(id, t), n);
  }
  return st;
}

}  // namespace sluice::kvstore
