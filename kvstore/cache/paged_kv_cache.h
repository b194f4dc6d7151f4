// The model's KV cache in compressed pages: the KvCache the model runs on.
//
// New tokens stay in full precision (fp32, the residual window) until more than the preset's
// `residual` are committed; then whole token groups are quantized into pages of the preset's
// format, one page list per (sequence, layer, kv-head), drawn from one PagePool. Attention runs
// over the pages and the residual window together (Backend::PagedAttention), so a prompt's own
// attention always sees its full-precision keys, as in KIVI and in a prefill worker.
//
// Huffman-coded presets (kvcomp) keep one K and one V codebook per layer, built from the codes
// of the first tokens that layer compresses (the prompt's, in prefill) and used for every later
// page of that layer in every sequence (KVComp §3.2). Their pages hold as many whole units as
// their codes fit, so a page may close with fewer than layout().tokens slots.
//
// Memory: pages, windows and scores live where the backend computes. On a device backend (cuda)
// the pool, the windows and the step's score arrays are device memory that only backend ops
// touch; the cache keeps the page tables, token positions, policy scores and a mirror of every
// page's valid bits on the host, and brings the device's bits up to the mirror before anything
// on the device reads them (a step's attention, an export, a slot move, a streamed layer).
//
// Not thread-safe: one owner thread (the scheduler loop) drives it.
#ifndef SLUICE_KVSTORE_CACHE_PAGED_KV_CACHE_H_
#define SLUICE_KVSTORE_CACHE_PAGED_KV_CACHE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/huffman.h"
#include "kernels/kv_format.h"
#include "kernels/op_params.h"
#include "kvstore/cache/kv_codebooks.h"
#include "kvstore/cache/row_window.h"
#include "kvstore/kv_preset.h"
#include "kvstore/memory/compactor.h"
#include "kvstore/memory/kv_accounting.h"
#include "kvstore/memory/page_pool.h"
#include "kvstore/memory/page_table.h"
#include "kvstore/policy/token_policy.h"
#include "model/kv_cache.h"

namespace sluice::kvstore {

struct PagedKvCacheOptions {
  int32_t layers = 0;
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // divides heads
  int64_t head_dim = 0;
  KvPreset preset;
  int64_t pages = 0;            // pool size
  float attention_scale = 0.f;  // 0: 1 / sqrt(head_dim)
  // The pool's memory when the caller provides it (a transport's exposed region, so that peers
  // write pages straight into it): pages * the preset's page_bytes bytes, 64-byte aligned, in
  // the backend's memory, outliving the cache. Null: the cache allocates it on the backend.
  uint8_t* arena = nullptr;
  size_t arena_bytes = 0;
};

// What a cache holds right now.
struct KvCacheStats {
  KvAccounting pages;           // compressed tokens in pages
  int64_t residual_tokens = 0;  // tokens x kv-heads x layers held in fp32 outside pages
  int64_t residual_bytes = 0;
  int64_t codebook_bytes = 0;  // serialized Huffman codebooks (kvcomp), shared by all sequences
  int64_t sequences = 0;
  int64_t demoted = 0;            // leankv: tokens moved from the high to the low tier, ever
  int64_t compactions = 0;        // page lists compacted, ever
  double compaction_seconds = 0;  // time spent compacting, ever
  // Everything held: whole pages (slack included), residual windows, codebooks.
  int64_t held_bytes() const;
  // The same tokens as fp16 K and V.
  int64_t fp16_bytes() const;
  // fp16_bytes() / held_bytes().
  double ratio_vs_fp16() const;
};

// Pages one sequence of `tokens` tokens can occupy at most with `preset`.
absl::StatusOr<int64_t> PagesForSequence(const KvPreset& preset, int32_t layers, int64_t kv_heads,
                                         int64_t tokens);

class PagedKvCache final : public model::KvCache {
 public:
  // The backend runs quantization and attention and holds the cache's memory; it must outlive
  // the cache. On a device backend (cuda): Unimplemented for presets whose pages are built on
  // the host so far (Huffman-coded pages, prompt selection: kvcomp, snapkv, pyramid, minikv).
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(const PagedKvCacheOptions& options,
                                                              kernels::Backend& backend);
  ~PagedKvCache() override;

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override;
  absl::Status RemoveSequence(int64_t seq) override;
  absl::StatusOr<int64_t> Length(int64_t seq) const override;
  // The step plan (see StepPlan): BeginStep builds it once, with the backend's plan of the
  // step's attention (PlanBatchPagedAttention); each layer's Write and Attend read it, and
  // Attend hands the backend one BatchPagedAttention for the whole batch, that layer of the plan.
  absl::Status BeginStep(absl::Span<const model::StepEntry> batch) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float* out) override;
  absl::Status LayerDone(int layer) override;
  absl::Status Commit() override;
  void AbortStep() override;

  // A forward pass as BeginStep plans it. Pages do not change during a pass (they change at the
  // commit, and a streamed layer's new pages come after its attention), so one page table
  // serves every layer.
  struct StepPlan {
    std::vector<model::StepEntry> entries;  // [batch]
    std::vector<int32_t> q_indptr;          // [batch + 1]: entry b's rows of the step
    // Write slots: entry b's new tokens take window rows [write_row[b], recent_tokens[b]) of
    // every layer (the window of full-precision tokens that attention reads after the pages).
    std::vector<int64_t> write_row;      // [batch]
    std::vector<int64_t> recent_tokens;  // [batch]
    // The page tables, one per tier, in compressed sparse rows over every layer's lists: list
    // (layer * batch + b) * kv_heads + h owns pages ids[t][indptr[t][list]] ... (ids of the
    // pool) holding slots[t][...] slots each (kernels::KvPageTable).
    std::vector<int32_t> indptr[2], ids[2], slots[2];
    // Per (layer, entry), at layer * batch + b: the window, the slots of the entry's pages (all
    // its lists) and where its scores go in that layer's score arrays.
    std::vector<kernels::BufferView<const float>> recent_k, recent_v;
    std::vector<int64_t> seq_slots;
    std::vector<int64_t> page_score_offsets, recent_score_offsets;
    std::vector<int64_t> page_score_size, recent_score_size;  // [layers]
    std::vector<bool> written;                                // [layers]
    // The step's attention over every layer as the backend plans it (pointers into the arrays
    // above; codebooks [layers * tiers]), and the backend's plan (null when it has nothing to
    // plan: the host backends). Each Attend runs its layer of it.
    std::vector<kernels::KvCodebooks> codebooks;
    kernels::BatchPagedAttentionStep attention;
    std::unique_ptr<kernels::BatchAttentionPlan> attention_plan;
  };
  // The open step's plan; null between steps.
  const StepPlan* step() const { return step_ ? &*step_ : nullptr; }

  // Starts sequence `dst` (room for `max_tokens`) as a copy of `src`'s committed tokens:
  // full pages are shared by reference count (a common prompt prefix costs its pages once);
  // each partly filled last page and the residual window are copied, since both sequences go
  // on writing there. AlreadyExists / NotFound for the ids; FailedPrecondition if `src` has
  // written tokens it has not committed; ResourceExhausted if the copies find no pages.
  absl::Status ForkSequence(int64_t src, int64_t dst, int64_t max_tokens);

  // Adds the ids of every page `seq` holds (all lists, both tiers) to `pages`: the pages a set
  // of sequences holds, shared ones once. NotFound for an unknown sequence.
  absl::Status CollectPages(int64_t seq, absl::flat_hash_set<PageId>& pages) const;

  // Page runs, per page list and tier: entry list * tiers() + tier, layers * kv_heads * tiers()
  // entries, lists in ExportSequence's order.
  int tiers() const { return tiers_; }
  // How many leading pages of each run sequences `a` and `b` hold in common (the same pool
  // pages, as a fork shares them and keeps them while neither writes there): the pages of a
  // prompt's prefix that are final once that prefix is computed. NotFound for either id.
  absl::StatusOr<std::vector<int32_t>> SharedLeadingPages(int64_t a, int64_t b) const;
  // The ids of the first counts[x] pages of each run x of `seq`. NotFound for an unknown
  // sequence, InvalidArgument for counts of another length or beyond a run's pages.
  absl::StatusOr<std::vector<std::vector<PageId>>> LeadingPages(
      int64_t seq, absl::Span<const int32_t> counts) const;
  // CRC32C of each page's bytes (valid bits included), as ExportSequence checksums them.
  absl::StatusOr<std::vector<uint32_t>> PageCrcs(absl::Span<const PageId> ids) const;

  // Evicts the tokens at `positions` of one (sequence, layer, kv-head): tokens already in pages
  // at once (their slots turn invalid; a page left with no live token returns to the pool, and
  // a page shared with a fork is copied first), tokens still in the full-precision window when
  // they move to pages. InvalidArgument for a position outside the committed tokens or an
  // unknown layer or kv-head; ResourceExhausted if a shared page cannot be copied.
  absl::Status Evict(int64_t seq, int layer, int64_t kv_head, absl::Span<const int64_t> positions);

  // Disaggregation: a sequence's committed KV leaves one cache (a prefill worker's) and goes
  // on in another (a decode worker's). `state` is a serialized KvSequenceState (lengths, the
  // full-precision window, each list's page metadata and policy scores, Huffman codebooks, each
  // page's CRC32C); `pages` are the sequence's pages in the order ImportSequence takes them.
  // The pages stay the sequence's: copy their bytes (pool().data(id)) before removing it.
  struct SequenceExport {
    std::string state;
    std::vector<PageId> pages;
    std::vector<int32_t> run_pages;  // pages per run (list and tier), as tiers() lays them out
    std::vector<uint32_t> crcs;      // each page's CRC32C, as the state holds them
  };
  // NotFound for an unknown sequence; FailedPrecondition if it has written tokens it has not
  // committed.
  absl::StatusOr<SequenceExport> ExportSequence(int64_t seq) const;
  // At most how many bytes ExportSequence's state takes for a sequence of `tokens` committed
  // tokens: what a decode worker reserves for the state next to the pages.
  int64_t StateBytesBound(int64_t tokens) const;
  // Starts `seq` (room for `max_tokens`) from an exported `state` whose pages' bytes already sit
  // in this cache's pool at pages[0, n), n being the pages the state lists (allocated by the
  // caller with refcount 1, in export order). On success the sequence owns those n pages and n
  // is returned; the caller frees the pages after them. With `held` (one entry per run, as
  // tiers() lays them out), each run begins with the pages held[x] names, pages this pool
  // holds already (a prefix the caller keeps): `pages` then lists only the others, the
  // sequence takes a reference on the held ones, and n counts `pages` only; the caller keeps
  // its own references. On error nothing changes and every page
  // stays the caller's. InvalidArgument naming the field for a state that does not parse or
  // does not fit this cache (another preset or shape, counts that do not add up, positions out
  // of range, fewer pages than it lists, Huffman-coded pages without codebooks); DataLoss for a
  // page whose bytes fail their checksum or, Huffman-coded, whose codes do not decode where its
  // stream offsets say (kernels::KvCheckUnits: the decoders trust both); FailedPrecondition for
  // a Huffman codebook other than the one this cache already uses for that layer;
  // AlreadyExists for a live `seq`.
  absl::StatusOr<int64_t> ImportSequence(int64_t seq, int64_t max_tokens, std::string_view state,
                                         absl::Span<const PageId> pages,
                                         absl::Span<const std::vector<PageId>> held = {});

  // The transform-coded wire (kvstore/wire/kv_wire_codec.h): a prompt's KV crosses as rows
  // rather than pages. Tokens that a sequence whose first commit holds `tokens` tokens keeps in
  // its full-precision window: the prompt's last rows, which the wire sends exact.
  int64_t WindowAfterPrompt(int64_t tokens) const;
  // Starts `seq` (room for `max_tokens`) with `tokens` tokens committed as one prompt step is,
  // from the rows `rows` fills layer by layer, in order (k and v: [tokens, kv_heads, head_dim]
  // in host memory, keys with RoPE). FailedPrecondition for presets whose policy acts on the
  // prompt's attention (no attention runs here); whatever fails, nothing of `seq` is left.
  using RowSource = absl::FunctionRef<absl::Status(int layer, float* k, float* v)>;
  absl::Status AddSequenceFromRows(int64_t seq, int64_t max_tokens, int64_t tokens, RowSource rows);

  // The pages' bytes to and from host memory. kByPoolId lays the host memory out as the pool is
  // (page id i at i * page_bytes from `host`): a device pool's pages go to such a host copy
  // before a put (a prefill worker's). kPacked holds ids[k] at k * page_bytes: the pages a peer
  // put into a reservation's receive window, moved into the pool before ImportSequence (a
  // decode worker's). On a device, batches of pages move with one gather or scatter on the
  // device and one host copy each. Nothing moves for a page whose host place is its pool place
  // (a host backend's pool registered as it is). InvalidArgument for an id outside the pool.
  enum class HostLayout { kByPoolId, kPacked };
  absl::Status CopyPagesToHost(absl::Span<const PageId> ids, uint8_t* host) const;
  absl::Status CopyPagesFromHost(absl::Span<const PageId> ids, const uint8_t* host,
                                 HostLayout layout = HostLayout::kByPoolId);

  // Streaming a prompt's KV layer by layer (a prefill worker's last chunk): during the next
  // forward pass of `seq`, each layer's tokens go into pages as soon as the layer is done
  // (LayerDone) instead of at the commit, and `listener` gets that layer's pages, in the order
  // ExportSequence lists them, while the next layer computes. The pass's Commit ends it. Only
  // for presets whose pages never change after a commit (no eviction policy, one tier,
  // fixed-width codes): FailedPrecondition for the others, which export after the commit.
  using LayerListener = std::function<void(int layer, std::vector<PageId> pages)>;
  absl::Status StreamLayers(int64_t seq, LayerListener listener);

  KvCacheStats Stats() const;
  // The live paged tokens of one (sequence, layer, kv-head): position and tier (0 high, 1 low),
  // tier by tier in slot order. NotFound / InvalidArgument for an unknown sequence or list.
  struct TokenPlace {
    int64_t position;
    int tier;
  };
  absl::StatusOr<std::vector<TokenPlace>> LiveTokens(int64_t seq, int layer, int64_t kv_head) const;
  // The codebooks of `layer` (Huffman-coded presets, once that layer has compressed tokens);
  // null codebooks otherwise.
  kernels::KvCodebooks Codebooks(int layer) const;
  // The page pool as the backend sees it.
  kernels::BufferView<const uint8_t> PoolView() const;
  // Page `id` of the pool, in the backend's memory.
  kernels::BufferView<uint8_t> PageView(PageId id) const {
    return {.data = pool_->data(id), .size = pool_->page_bytes(), .space = backend_.memory_space()};
  }
  const KvPreset& preset() const { return options_.preset; }
  // The preset's token policy (kvstore/policy/): which tokens stay, and in which tier.
  const policy::TokenPolicy& policy() const { return *policy_; }
  const kernels::KvPageLayout& layout() const { return layout_; }  // the high tier's
  const PagePool& pool() const { return *pool_; }
  // For page reservations of a decode worker (pages a peer writes before ImportSequence).
  PagePool& mutable_pool() { return *pool_; }

 private:
  // The pages of one tier of one (sequence, layer, kv-head).
  struct TierPages {
    std::vector<int32_t> slots;  // slots written in each page
    // Position of every written slot, page after page: ascending in the high tier (pages fill
    // in order); in the low tier, in the order tokens were demoted to it.
    std::vector<int32_t> positions;
    bool last_closed = false;  // the last page takes no more tokens
    // Whether the last page can take more tokens.
    bool LastOpen(int32_t capacity) const {
      return !slots.empty() && !last_closed && slots.back() < capacity;
    }
  };
  // The pages of one (sequence, layer, kv-head): high-tier pages from the left of the
  // bidirectional table, low-tier pages (two-tier presets) from the right.
  struct HeadPages {
    BidirectionalPageTable table;
    TierPages tier[2];             // [0] high, [1] low
    std::vector<int64_t> pending;  // evicted positions still in the full-precision window
    policy::ListState policy;      // the token policy's scores and marks
    int32_t count(int t) const { return t == 0 ? table.high_count() : table.low_count(); }
    PageId page(int t, int32_t i) const { return t == 0 ? table.high(i) : table.low(i); }
    absl::Status Push(int t, PageId id) { return t == 0 ? table.PushHigh(id) : table.PushLow(id); }
    absl::StatusOr<PageId> Pop(int t) { return t == 0 ? table.PopHigh() : table.PopLow(); }
    absl::Status Erase(int t, int32_t i) { return t == 0 ? table.EraseHigh(i) : table.EraseLow(i); }
    absl::Status Replace(int t, int32_t i, PageId id) {
      return t == 0 ? table.ReplaceHigh(i, id) : table.ReplaceLow(i, id);
    }
  };
  struct Seq {
    int64_t max_tokens = 0;
    int64_t length = 0;      // committed tokens
    int64_t compressed = 0;  // the first `compressed` tokens live in pages
    // Per layer: the residual window plus the written, not yet committed tokens,
    // [tokens, kv_heads, head_dim], in the backend's memory.
    std::vector<RowWindow> k, v;
    std::vector<HeadPages> heads;  // [layers * kv_heads]
    policy::SequenceState policy;  // the token policy's
    // StreamLayers: the listener, and per layer the tokens it compressed ahead of the commit
    // (-1: not yet).
    LayerListener listener;
    std::vector<int64_t> early;
    // A step that streamed some layers to pages was aborted: the layers disagree.
    bool lost_step = false;
  };

  // The token policy's view of one sequence (policy::SequenceView).
  class PolicyView;

  PagedKvCache(const PagedKvCacheOptions& options, kernels::KvPageLayout high,
               kernels::KvPageLayout low, kernels::DeviceBuffer arena,
               std::unique_ptr<PagePool> pool, std::unique_ptr<policy::TokenPolicy> policy,
               std::array<std::unique_ptr<Compactor>, 2> compactors, kernels::Backend& backend);
  absl::StatusOr<Seq*> Find(int64_t seq);
  // Whether the open step holds `seq`.
  bool InStep(int64_t seq) const;
  // FailedPrecondition without an open step, InvalidArgument for a layer outside the model.
  absl::Status CheckStepLayer(int layer) const;
  // options.attention_scale, or 1 / sqrt(head_dim) when it is 0.
  float AttentionScale() const;
  using TierChoice = policy::TierChoice;
  // Quantization that a commit (or a layer streamed, or a demotion) places first and runs as
  // one backend call (Backend::KvQuantizeBatch) once every list of the step has its slots.
  struct QuantizeBatch {
    std::vector<kernels::KvQuantizeParams> items;
    std::deque<kernels::DeviceBuffer> rows;  // gathered rows the items read
    struct DeadSlot {
      PageId page;
      int tier;
      int32_t slot;
    };
    std::vector<DeadSlot> dead;  // padding slots, cleared once the items ran
  };
  // A commit's flush, first half: places the whole token groups beyond the residual window in
  // pages, where the policy's ChooseTiers (shown `view`) puts them (*choice), adding their
  // quantization to `batch`; returns the tokens placed, for FinishFlush. Huffman-coded presets
  // quantize here, unit by unit.
  absl::StatusOr<int64_t> PlanFlush(Seq& s, policy::SequenceView& view, TierChoice* choice,
                                    QuantizeBatch* batch);
  // Runs the batch's quantization and marks its padding slots dead; empties it.
  absl::Status RunQuantizeBatch(QuantizeBatch& batch);
  // Second half, once the batch ran: the window lets go of the `flush` tokens now in pages, and
  // evictions that waited for them happen.
  absl::Status FinishFlush(Seq& s, int64_t flush);
  // Fixed-width formats: places the first `flush` window tokens of every list into the tier
  // `choice` gives them (high without one), dropping those evicted while in the window, their
  // quantization added to `batch`. `only_layer` >= 0: that layer's lists only (StreamLayers).
  absl::Status FlushFixed(Seq& s, int64_t flush, const TierChoice* choice, int only_layer,
                          QuantizeBatch* batch);
  // The window tokens a commit moves to pages when the sequence has `length` tokens.
  int64_t FlushCount(const Seq& s, int64_t length) const;
  // Places n rows (row r at k + r * stride) in tier t of `hp` after its written slots, taking
  // fresh pages from `fresh` (advancing *next) when the last one is full; their quantization
  // goes to `batch`.
  absl::Status WriteRows(HeadPages& hp, int t, kernels::BufferView<const float> k,
                         kernels::BufferView<const float> v, int64_t stride, int64_t n,
                         const std::vector<PageId>& fresh, int64_t* next, QuantizeBatch* batch);
  // Evicts committed `positions` of one list (checked against s.length): paged ones at once,
  // window ones into hp.pending.
  absl::Status EvictList(int64_t seq, Seq& s, HeadPages& hp, absl::Span<const int64_t> positions);
  // Adds window `positions` to the evictions that wait for their tokens to reach pages.
  static void AddPending(HeadPages& hp, absl::Span<const int64_t> positions);
  // Clears the valid bits of paged `positions` and frees pages left with none.
  absl::Status EvictPaged(HeadPages& hp, const std::vector<int64_t>& positions);
  // Moves the live high-tier token at (page, slot) of `hp` to its low tier.
  absl::Status Demote(HeadPages& hp, int64_t position, int32_t page, int32_t slot);
  // Calls fn(position, page index, slot) for each live token of tier t, in slot order.
  template <typename Fn>
  void ForEachLive(const HeadPages& hp, int t, Fn fn) const;
  // The valid bits of page `id` in tier t's layout, as the host sees them: the page's own on a
  // host backend, the mirror's on a device backend (after a change, MarkValid).
  uint64_t* ValidBits(PageId id, int t) const {
    if (valid_mirror_ != nullptr) return valid_mirror_.get() + int64_t{id} * valid_words_;
    return reinterpret_cast<uint64_t*>(pool_->data(id) + layouts_[t].valid);
  }
  // Device backend: page `id`'s mirrored bits (tier t) changed; SyncValid takes them over.
  // Nothing on a host backend.
  void MarkValid(PageId id, int t) const {
    if (valid_mirror_ != nullptr) dirty_valid_.push_back({id, t});
  }
  // Device backend: marks slots [slot, slot + n) of page `id` valid in the mirror, as the
  // quantize kernels do on the page.
  void MirrorWritten(PageId id, int t, int64_t slot, int64_t n) const;
  // Device backend: the pages' valid bits changed since the last call go to the device (one
  // upload and a copy per page). Nothing on a host backend.
  absl::Status SyncValid() const;
  // Device backend: valid_staging_ holds at least `bytes` (twice that when it grows).
  absl::Status GrowValidStaging(size_t bytes) const;
  // Device backend: the mirror takes the pages' valid bits from the device (pages written by
  // a peer). Nothing on a host backend.
  absl::Status LoadValid(absl::Span<const std::pair<PageId, int>> pages);
  // Page `src`'s bytes (valid bits included) to page `dst`, on the backend.
  absl::Status CopyPage(PageId dst, PageId src, int t);
  // Calls fn(i, bytes) with the page_bytes bytes of page ids[i] in host memory, in order: the
  // pool's own on a host backend; on a device, kStagedPages at a time gathered on the device
  // and downloaded in one copy. InvalidArgument for an id outside the pool.
  absl::Status ReadPages(absl::Span<const PageId> ids,
                         absl::FunctionRef<void(size_t, const uint8_t*)> fn) const;
  // Device backend: page_staging_ and host_staging_ hold `pages` (<= kStagedPages) pages.
  absl::Status GrowPageStaging(size_t pages) const;
  absl::Status CheckPageIds(absl::Span<const PageId> ids) const;
  // A layer's score arrays as the backend writes them: page_scores_ and recent_scores_ on a
  // host backend, zeroed device memory on a device backend (DownloadScores brings them back).
  absl::Status PrepareScores(int64_t page_size, int64_t recent_size, float** page, float** recent);
  absl::Status DownloadScores(const float* page, const float* recent);
  // Compacts, tier by tier in one Compactor call, every list evicted from since the last call
  // (evicted_lists_) that has a page's worth of dead slots, and frees the pages it empties
  // (fixed-width formats with K grouped per token; lists without shared pages). Runs at the end
  // of Commit and of Evict, so a policy's evictions within a commit see stable page indices.
  absl::Status CompactEvicted();
  // List `hp`'s tier t after its compaction by `plan`: positions follow the moves, the kept
  // pages stay in table order but the roomiest goes last (new tokens go there), freed go back.
  absl::Status RebuildCompacted(HeadPages& hp, int t, const CompactionPlan& plan);
  // Flush for Huffman-coded presets: pages one at a time, as many units as each fits.
  absl::Status FlushCoded(Seq& s, int64_t flush);
  // Builds the codebooks of `layer` from the codes of its first `tokens` tokens in `s`.
  absl::Status BuildCodebooks(const Seq& s, int layer, int64_t tokens);
  // One fresh page with its valid bits cleared; ResourceExhausted, naming the `tokens` being
  // compressed, when the pool has none.
  absl::StatusOr<PageId> AllocatePage(int64_t tokens);

  const PagedKvCacheOptions options_;
  const int tiers_;  // 2 for presets with a low tier
  const kernels::KvTierFormat formats_[2];
  const kernels::KvPageLayout layouts_[2];
  const kernels::KvPageLayout& layout_;  // layouts_[0]
  const int64_t row_;                    // kv_heads * head_dim
  const bool on_device_;                 // the backend's memory is a device's
  kernels::DeviceBuffer arena_;          // the pool's memory, when the cache allocated it
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<policy::TokenPolicy> policy_;
  kernels::Backend& backend_;
  absl::node_hash_map<int64_t, Seq> seqs_;  // node: the step keeps pointers to its sequences
  std::optional<StepPlan> step_;
  std::vector<Seq*> step_seqs_;                     // [batch], the step's sequences
  std::vector<float> page_scores_, recent_scores_;  // one layer's scores during Attend
  kernels::DeviceBuffer device_scores_;             // device backend: the same, there
  kernels::DeviceBuffer demote_rows_;               // device backend: K and V of a demotion
  // Device backend: every page's valid bits as the host keeps them, valid_words_ words a page,
  // and the pages (with their tier) changed since the last SyncValid; null on a host backend.
  std::unique_ptr<uint64_t[]> valid_mirror_;
  int64_t valid_words_ = 0;
  mutable std::vector<std::pair<PageId, int>> dirty_valid_;
  mutable kernels::DeviceBuffer valid_staging_;
  // Device backend: whole pages on their way to or from the host (ReadPages, CopyPagesFromHost).
  mutable kernels::DeviceBuffer page_staging_;
  mutable std::vector<uint8_t> host_staging_;
  std::vector<std::unique_ptr<KvCodebookPair>> codebooks_;  // [layers]; null until built
  // Tiers whose tokens move slot by slot: the compactor of the backend's device; else null.
  std::array<std::unique_ptr<Compactor>, 2> compactors_;
  // Lists (with their tier) that lost tokens since the last CompactEvicted.
  std::vector<std::pair<HeadPages*, int>> evicted_lists_;
  int64_t demoted_ = 0;
  int64_t compactions_ = 0;
  double compaction_seconds_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_CACHE_PAGED_KV_CACHE_H_
