// Parameter structs for sluice's math ops. Plain data, pointers and buffer views only, so the
// same struct reaches the scalar reference, the CPU kernels and the CUDA kernels unchanged.
// Every pointer carries its shape; pointers live on the device of the backend that runs the op.
// A BufferView (kernels/buffer_view.h) also knows its length and its memory: the backend refuses
// one outside its memory or too short for the op's shapes before any kernel runs. The KV ops
// (KvQuantize, KvDequantize, KvMoveSlots, BatchPagedAttention) take views; the model's dense
// ops still take pointers.
#ifndef SLUICE_KERNELS_OP_PARAMS_H_
#define SLUICE_KERNELS_OP_PARAMS_H_

#include <cstdint>

#include "kernels/buffer_view.h"
#include "kernels/ggml_quant.h"
#include "kernels/huffman.h"
#include "kernels/kv_format.h"

namespace sluice::kernels {

// The codebooks of a Huffman-coded tier (KvTierFormat::huffman_bits > 0): one for K codes,
// one for V codes, each with at least the spec's levels symbols. Host memory.
struct KvCodebooks {
  const HuffmanCodebook* k = nullptr;
  const HuffmanCodebook* v = nullptr;
};

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]
struct RmsNormParams {
  const float* x = nullptr;       // [rows, dim], contiguous
  const float* weight = nullptr;  // [dim]
  float* y = nullptr;             // [rows, dim], contiguous; may equal x (in place)
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
};

// How a matmul may round its operands. kBf16: backends with bf16 matrix units (CUDA: cuBLAS on
// the tensor cores) round x and the dequantized w to bf16 and accumulate in fp32, about 2^-8
// relative error per product; host backends compute in fp32 either way.
enum class MatmulPrecision : uint8_t { kFp32 = 0, kBf16 = 1 };

// Which algorithm a matmul runs, chosen by the caller for a kind of call rather than by m. On the
// host backends, within one kind, row r of y is a function of row r of x and of w alone: the
// same bits whatever m, the row's place and the other rows, so a sequence's tokens do not depend
// on the batch it runs in (the decode steps it shares, the prompts prefilled beside it). kFew:
// a row per sequence (decode steps, logits), weights read in place; kMany: a prompt's rows,
// weight panels expanded once and reused across rows. The CUDA backend picks by m for now.
enum class MatmulRows : uint8_t { kFew = 0, kMany = 1 };

// y[m, n] = sum_k x[m, k] * w[n, k]: activations times the transpose of a weight matrix stored
// row by row in a GGML element type (dequantized on the fly; arithmetic in fp32). With
// accumulate, y[m, n] += that sum instead (a residual connection added in the same pass).
struct MatmulParams {
  const float* x = nullptr;  // [m, k], contiguous
  const void* w = nullptr;   // [n, k] in w_type's storage layout (row stride = k's row bytes)
  GgmlType w_type = GgmlType::kF32;
  float* y = nullptr;  // [m, n], contiguous
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;  // a multiple of w_type's block size
  MatmulPrecision precision = MatmulPrecision::kFp32;
  bool accumulate = false;
  MatmulRows rows = MatmulRows::kFew;
};

// out[t, :] = dequantize(table[ids[t], :]): embedding lookup.
struct GetRowsParams {
  const void* table = nullptr;  // [rows, dim] in table_type's storage layout
  GgmlType table_type = GgmlType::kF32;
  const int32_t* ids = nullptr;  // [count], each in [0, rows)
  float* out = nullptr;          // [count, dim]
  int64_t count = 0;
  int64_t rows = 0;
  int64_t dim = 0;
};

// Rotary position embedding, in place. For pair i of a head (i < rope_dim / 2) the angle is
// positions[t] * theta_base^(-2i / rope_dim). `neox` pairs element i with i + rope_dim / 2
// (GPT-NeoX / HF rotate_half); otherwise pairs are adjacent (2i, 2i + 1), as in GGUF Llama.
struct RopeParams {
  float* x = nullptr;                  // [tokens, heads, head_dim], contiguous
  const int32_t* positions = nullptr;  // [tokens]
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;  // even, <= head_dim; the rest of each head is left as is
  float theta_base = 10000.f;
  bool neox = false;
};

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
struct SwiGluParams {
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* out = nullptr;         // [n]; may equal gate or up
  int64_t n = 0;
};

// Row-wise softmax in place: x[r, :] = exp(x[r, :] - max) / sum.
struct SoftmaxParams {
  float* x = nullptr;  // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
};

// Causal grouped-query attention of one sequence over its cached keys and values. Query t sits
// at position q_start + t and attends to cached positions [0, q_start + t]. Query head h uses
// KV head h / (heads / kv_heads).
struct AttentionParams {
  const float* q = nullptr;  // [q_tokens, heads, head_dim]
  const float* k = nullptr;  // [kv_tokens, kv_heads, head_dim]
  const float* v = nullptr;  // [kv_tokens, kv_heads, head_dim]
  float* out = nullptr;      // [q_tokens, heads, head_dim]
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;  // >= q_start + q_tokens
  int64_t q_start = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // divides heads
  int64_t head_dim = 0;
  float scale = 1.f;  // usually 1 / sqrt(head_dim)
  // Optional, [heads, kv_tokens]: key_scores[h, j] += the softmax weight key j gets from each
  // query of head h, summed over the queries (cumulative attention, the H2O / MiniKV score).
  // The CPU backend computes it in two passes over key tiles (row normalizers first, then the
  // weights), so the extra memory does not grow with the number of queries.
  float* key_scores = nullptr;
};

// Compresses `tokens` tokens of one kv-head into slots [slot, slot + tokens) of a page laid out
// by `layout` (kernels/kv_format.h) and marks those slots valid. For K grouped along tokens,
// slot and tokens are multiples of layout.token_group (one write per complete group).
// Huffman-coded tiers append whole units after the page's `slot` slots already written, as many
// as the page has room for, and report how many tokens that was in *tokens_written.
struct KvQuantizeParams {
  BufferView<const float> k;  // [tokens, stride]: the head's head_dim values open each row
  BufferView<const float> v;  // [tokens, stride]
  int64_t stride = 0;         // floats from one token's row to the next, >= head_dim
  int64_t tokens = 0;
  BufferView<const float> scores;       // [tokens] or empty (0 is stored); used with token_meta
  BufferView<const int32_t> positions;  // [tokens] or empty (-1 is stored); used with token_meta
  KvTierFormat format;
  KvPageLayout layout;       // ComputePageLayout(format)
  BufferView<uint8_t> page;  // [format.page_bytes]
  int64_t slot = 0;
  KvCodebooks codebooks;              // Huffman-coded tiers only
  int64_t* tokens_written = nullptr;  // Huffman-coded tiers only; host memory
};

// One move of KvMoveSlots: `slots` consecutive slots of pool page src_page, from src_slot on,
// to dst_page from dst_slot on.
struct KvSlotMove {
  int32_t src_page = 0;
  int32_t src_slot = 0;
  int32_t dst_page = 0;
  int32_t dst_slot = 0;
  int32_t slots = 1;
};

// Compaction's copies between the pages of one pool (kernels/kv_format.h's KvMoveSlot, many at
// once): each move copies its slots' codes, metadata, score and position and gives each
// destination slot its source's valid bit; sources stay as they are. Tiers with K grouped per
// token and fixed-width codes (token_group == 1). The moves run in parallel: no slot may be
// written by one move and read or written by another.
struct KvMoveSlotsParams {
  KvTierFormat format;
  KvPageLayout layout;       // ComputePageLayout(format)
  BufferView<uint8_t> pool;  // [pages * page_bytes]
  int64_t pages = 0;
  int64_t page_bytes = 0;             // >= format.page_bytes
  const KvSlotMove* moves = nullptr;  // [count], host memory
  int64_t count = 0;
};

// Expands slots [slot, slot + tokens) of a page back to fp32 (tests, checks and tools; the
// attention kernels decode in registers instead).
struct KvDequantizeParams {
  BufferView<const uint8_t> page;  // [format.page_bytes]
  KvTierFormat format;
  KvPageLayout layout;
  int64_t slot = 0;
  int64_t tokens = 0;
  BufferView<float> k;    // [tokens, head_dim]
  BufferView<float> v;    // [tokens, head_dim]
  KvCodebooks codebooks;  // Huffman-coded tiers only
};

// One page as an attention kernel sees it.
struct KvPageRef {
  const uint8_t* data = nullptr;  // [page_bytes], laid out by the tier's layout
  int32_t slots = 0;              // slots written, <= layout.tokens; the valid bits say which live
  int32_t tier = 0;               // index into PagedAttentionParams::formats
};

// Grouped-query attention of `q_tokens` queries over one sequence's compressed pages followed by
// its full-precision recent tokens. Every live paged token precedes every query; recent token r
// sits after all paged tokens, and query t (the last q_tokens recent tokens are the queries' own)
// sees recent tokens [0, recent_tokens - q_tokens + t]. Query head h reads kv-head
// h / (heads / kv_heads). Pages are decoded in registers; no fp32 copy of the KV is written.
struct PagedAttentionParams {
  const float* q = nullptr;  // [q_tokens, heads, head_dim]
  float* out = nullptr;      // [q_tokens, heads, head_dim]
  int64_t q_tokens = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // divides heads
  int64_t head_dim = 0;
  float scale = 1.f;
  const KvTierFormat* formats = nullptr;   // [tier_count]
  const KvPageLayout* layouts = nullptr;   // [tier_count]
  const KvCodebooks* codebooks = nullptr;  // [tier_count]; read for Huffman-coded tiers only
  int32_t tier_count = 0;
  const KvPageRef* pages = nullptr;       // [page_offsets[kv_heads]]
  const int32_t* page_offsets = nullptr;  // [kv_heads + 1]: kv-head h owns pages [po[h], po[h+1])
  const float* recent_k = nullptr;        // [recent_tokens, kv_heads, head_dim]
  const float* recent_v = nullptr;        // [recent_tokens, kv_heads, head_dim]
  int64_t recent_tokens = 0;              // >= q_tokens
  // Optional, both or neither: += the attention weight each key gets, summed over the queries
  // and over the query heads of its kv-head (cumulative attention: the H2O score).
  // page_scores: [sum of pages[i].slots], the pages in order, slot by slot (dead slots get 0);
  // recent_scores: [kv_heads, recent_tokens].
  float* page_scores = nullptr;
  float* recent_scores = nullptr;
  // With scores: keep each query head's apart instead of summing a kv-head's (LeanKV takes
  // their max). page_scores is then [heads / kv_heads, sum of pages[i].slots] (query head h of
  // kv-head h / g writes row h % g) and recent_scores [heads, recent_tokens].
  bool scores_per_head = false;
};

// At most this many tiers in a paged attention (the CUDA kernels' limit too).
inline constexpr int kMaxKvTiers = 4;

// One tier's pages of a batch as compressed sparse rows (FlashInfer's paged-KV indptr /
// indices / last-page-length, with a token count for every page since pages of a list may be
// partly filled anywhere after evictions and compaction). List i owns pages
// ids[indptr[i]], ..., ids[indptr[i + 1] - 1], page j holding slots[j] written slots; page id p
// is the bytes at pool + p * page_bytes. indptr values are absolute, so one table may cover
// more lists than a call reads (a step's table covers every layer; a call passes the pointer to
// its layer's first list).
struct KvPageTable {
  const int32_t* indptr = nullptr;  // [lists + 1], host
  const int32_t* ids = nullptr;     // [indptr[lists]], host
  const int32_t* slots = nullptr;   // [indptr[lists]], host; each <= the tier's layout.tokens
};

// What a backend prepares once for a decode step's BatchPagedAttention calls, one per layer
// (FlashInfer's plan/run split: on the GPU, the work split and the page tables of every layer
// go to the device once). Made by Backend::PlanBatchPagedAttention; opaque to callers.
class BatchAttentionPlan {
 public:
  explicit BatchAttentionPlan(const void* backend) : backend_(backend) {}
  virtual ~BatchAttentionPlan() = default;
  // The backend that made it (a Backend*, opaque here).
  const void* backend() const { return backend_; }

 private:
  const void* backend_;
};

// PagedAttentionParams for a batch of sequences at once: one call per layer of a decode step,
// however many sequences the step holds. Sequence b's queries are rows
// [q_indptr[b], q_indptr[b + 1]) of q and out, the last of its recent tokens; list b * kv_heads + h
// is its kv-head h, whose pages are tier 0's list, then tier 1's, and so on. Sequence b attends
// exactly as a PagedAttentionParams call of its own would (that is the oracle), and its scores
// go where that call's would, shifted to page_scores + page_score_offsets[b] and
// recent_scores + recent_score_offsets[b].
struct BatchPagedAttentionParams {
  int64_t batch = 0;
  const int32_t* q_indptr = nullptr;  // [batch + 1], host
  BufferView<const float> q;          // [q_indptr[batch], heads, head_dim]
  BufferView<float> out;              // [q_indptr[batch], heads, head_dim]
  int64_t heads = 0;
  int64_t kv_heads = 0;  // divides heads
  int64_t head_dim = 0;
  float scale = 1.f;
  const KvTierFormat* formats = nullptr;   // [tier_count], host
  const KvPageLayout* layouts = nullptr;   // [tier_count], host
  const KvCodebooks* codebooks = nullptr;  // [tier_count]; Huffman-coded tiers only
  int32_t tier_count = 0;
  // The page pool: page id p at pool.data + p * page_bytes; ids must lie in
  // [0, pool.size / page_bytes).
  BufferView<const uint8_t> pool;
  int64_t page_bytes = 0;           // >= every tier's format.page_bytes, a multiple of 16
  KvPageTable tables[kMaxKvTiers];  // [tier_count]; lists = batch * kv_heads
  // Sequence b's full-precision recent tokens, recent_tokens[b] of them (>= its queries):
  // recent_k[b] / recent_v[b] hold [recent_tokens[b], kv_heads, head_dim].
  const BufferView<const float>* recent_k = nullptr;  // [batch], host array of views
  const BufferView<const float>* recent_v = nullptr;  // [batch]
  const int64_t* recent_tokens = nullptr;             // [batch], host
  // Optional, all or none: cumulative attention as PagedAttentionParams gives it, sequence by
  // sequence (see there; scores_per_head for every sequence alike); each sequence's regions
  // must lie inside the views.
  BufferView<float> page_scores;
  BufferView<float> recent_scores;
  const int64_t* page_score_offsets = nullptr;    // [batch], host
  const int64_t* recent_score_offsets = nullptr;  // [batch], host
  bool scores_per_head = false;
  // Optional: the step's plan from the same backend's PlanBatchPagedAttention, and which of its
  // layers this call is. The call must then be that layer exactly (the same pages, windows and
  // queries); anything else is InvalidArgument.
  const BatchAttentionPlan* plan = nullptr;
  int64_t layer = 0;
};

// A decode step's attention over all its layers, as Backend::PlanBatchPagedAttention takes it:
// `batch` is BatchPagedAttentionParams without q, out, scores and plan; its tables cover
// layers * batch * kv_heads lists (layer-major), its recent_k / recent_v hold layers * batch
// views (layer l's at l * batch), and its codebooks layers * tier_count (layer l's at
// l * tier_count). LayerOfStep gives one layer's BatchPagedAttentionParams.
struct BatchPagedAttentionStep {
  int64_t layers = 0;
  BatchPagedAttentionParams batch;
  bool scores = false;  // whether the layers' calls will ask for key scores
  // With scores, where each (layer, sequence)'s scores will start ([layers * batch], host; layer
  // l's calls pass l's), or null when the calls' offsets are not known ahead.
  const int64_t* page_score_offsets = nullptr;
  const int64_t* recent_score_offsets = nullptr;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_OP_PARAMS_H_
