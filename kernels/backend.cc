#include "kernels/backend.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::kernels {

std::string_view BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kRef:
      return "ref";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kRmsNorm:
      return "rms_norm";
    case Op::kMatmul:
      return "matmul";
    case Op::kGetRows:
      return "get_rows";
    case Op::kRope:
      return "rope";
    case Op::kSwiGlu:
      return "swiglu";
    case Op::kSoftmax:
      return "softmax";
    case Op::kAttention:
      return "attention";
    case Op::kKvQuantize:
      return "kv_quantize";
    case Op::kKvDequantize:
      return "kv_dequantize";
    case Op::kPagedAttention:
      return "paged_attention";
    case Op::kBatchPagedAttention:
      return "batch_paged_attention";
    case Op::kKvMoveSlots:
      return "kv_move_slots";
  }
  return "unknown";
}

namespace {

absl::Status ValidateRmsNorm(const RmsNormParams& p) {
  if (p.rows < 0)
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: rows=%d < 0", p.rows));
  if (p.dim <= 0)
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: dim=%d <= 0", p.dim));
  if (!(p.eps >= 0.f)) {
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: eps=%g must be >= 0", p.eps));
  }
  if (p.rows > 0 && (p.x == nullptr || p.y == nullptr || p.weight == nullptr)) {
    return absl::InvalidArgumentError("rms_norm: x, weight and y must be non-null");
  }
  return absl::OkStatus();
}

absl::Status Invalid(std::string_view op, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", op, what));
}

absl::Status ValidateMatmul(const MatmulParams& p) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return Invalid("matmul", absl::StrFormat("bad shape m=%d n=%d k=%d", p.m, p.n, p.k));
  }
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  if (t == nullptr) return Invalid("matmul", "unknown weight type");
  if (p.k % t->block_size != 0) {
    return Invalid("matmul", absl::StrFormat("k=%d is not a multiple of the %s block size %d", p.k,
                                             t->name, t->block_size));
  }
  if (p.m > 0 && (p.x == nullptr || p.w == nullptr || p.y == nullptr)) {
    return Invalid("matmul", "x, w and y must be non-null");
  }
  if (p.precision != MatmulPrecision::kFp32 && p.precision != MatmulPrecision::kBf16) {
    return Invalid("matmul",
                   absl::StrFormat("unknown precision %d", static_cast<int>(p.precision)));
  }
  return absl::OkStatus();
}

absl::Status ValidateGetRows(const GetRowsParams& p) {
  if (p.count < 0 || p.rows <= 0 || p.dim <= 0) {
    return Invalid("get_rows",
                   absl::StrFormat("bad shape count=%d rows=%d dim=%d", p.count, p.rows, p.dim));
  }
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.table_type));
  if (t == nullptr || p.dim % t->block_size != 0) {
    return Invalid("get_rows", "dim is not a multiple of the table type's block size");
  }
  if (p.count > 0 && (p.table == nullptr || p.ids == nullptr || p.out == nullptr)) {
    return Invalid("get_rows", "table, ids and out must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateRope(const RopeParams& p) {
  if (p.tokens < 0 || p.heads <= 0 || p.head_dim <= 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 ||
      p.rope_dim > p.head_dim) {
    return Invalid("rope", absl::StrFormat("bad shape tokens=%d heads=%d head_dim=%d rope_dim=%d",
                                           p.tokens, p.heads, p.head_dim, p.rope_dim));
  }
  if (!(p.theta_base > 0.f)) return Invalid("rope", "theta_base must be > 0");
  if (p.tokens > 0 && (p.x == nullptr || p.positions == nullptr)) {
    return Invalid("rope", "x and positions must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateSwiGlu(const SwiGluParams& p) {
  if (p.n < 0) return Invalid("swiglu", "n < 0");
  if (p.n > 0 && (p.gate == nullptr || p.up == nullptr || p.out == nullptr)) {
    return Invalid("swiglu", "gate, up and out must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateSoftmax(const SoftmaxParams& p) {
  if (p.rows < 0 || p.cols <= 0) {
    return Invalid("softmax", absl::StrFormat("bad shape rows=%d cols=%d", p.rows, p.cols));
  }
  if (p.rows > 0 && p.x == nullptr) return Invalid("softmax", "x must be non-null");
  return absl::OkStatus();
}

absl::Status ValidateAttention(const AttentionParams& p) {
  if (p.q_tokens < 0 || p.q_start < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0 ||
      p.heads % p.kv_heads != 0) {
    return Invalid("attention",
                   absl::StrFormat("bad shape q_tokens=%d q_start=%d heads=%d kv_heads=%d "
                                   "head_dim=%d",
                                   p.q_tokens, p.q_start, p.heads, p.kv_heads, p.head_dim));
  }
  if (p.kv_tokens < p.q_start + p.q_tokens) {
    return Invalid("attention", absl::StrFormat("kv_tokens=%d < q_start + q_tokens = %d",
                                                p.kv_tokens, p.q_start + p.q_tokens));
  }
  if (p.q_tokens > 0 && (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr)) {
    return Invalid("attention", "q, k, v and out must be non-null");
  }
  return absl::OkStatus();
}

// The layout must be the one ComputePageLayout gives for the format: kernels trust its offsets.
absl::Status ValidateLayout(std::string_view op, const KvTierFormat& format,
                            const KvPageLayout& layout) {
  auto want = ComputePageLayout(format);
  if (!want.ok()) return Invalid(op, std::string(want.status().message()));
  if (want->tokens != layout.tokens || want->k_meta != layout.k_meta ||
      want->v_codes != layout.v_codes || want->v_meta != layout.v_meta ||
      want->valid != layout.valid || want->scores != layout.scores ||
      want->token_group != layout.token_group || want->streams != layout.streams ||
      want->unit_meta != layout.unit_meta || want->bitstream != layout.bitstream) {
    return Invalid(op, "layout does not match ComputePageLayout(format)");
  }
  return absl::OkStatus();
}

// A Huffman-coded tier needs a codebook for K and for V covering every code.
absl::Status ValidateCodebooks(std::string_view op, const KvTierFormat& format,
                               const KvCodebooks& codebooks) {
  if (format.huffman_bits == 0.f) return absl::OkStatus();
  const std::pair<const HuffmanCodebook*, const KvQuantSpec*> books[] = {{codebooks.k, &format.k},
                                                                         {codebooks.v, &format.v}};
  for (const auto& [book, spec] : books) {
    const char* which = spec == &format.k ? "k" : "v";
    if (book == nullptr) {
      return Invalid(op, absl::StrFormat("a Huffman-coded tier needs a %s codebook", which));
    }
    if (book->alphabet_size <= KvMaxCode(*spec) || book->max_length < 1 ||
        book->max_length > kMaxHuffmanCodeLength ||
        book->decode_table.size() != (size_t{1} << book->max_length)) {
      return Invalid(op,
                     absl::StrFormat("%s codebook %d (%d symbols) does not cover %d levels", which,
                                     book->id, book->alphabet_size, KvMaxCode(*spec) + 1));
    }
  }
  return absl::OkStatus();
}

// A view the op uses: in the backend's memory and at least `need` elements long. `seq` >= 0
// names the sequence the view is of (the message is built only on failure).
template <typename T>
absl::Status CheckView(std::string_view op, std::string_view what, const BufferView<T>& v,
                       int64_t need, MemorySpace space, int64_t seq = -1) {
  if (need <= 0) return absl::OkStatus();
  const bool short_view = v.data == nullptr || v.size < need;
  if (!short_view && v.space == space) return absl::OkStatus();
  const std::string name =
      seq >= 0 ? absl::StrFormat("sequence %d's %s", seq, what) : std::string(what);
  if (short_view) {
    return Invalid(op, absl::StrFormat("%s holds %d elements at %p, needs %d", name, v.size,
                                       static_cast<const void*>(v.data), need));
  }
  return Invalid(op, absl::StrFormat("%s is in %s memory; this backend computes in %s memory", name,
                                     MemorySpaceName(v.space), MemorySpaceName(space)));
}

absl::Status ValidateSlots(std::string_view op, const KvPageLayout& l, int64_t slot,
                           int64_t tokens) {
  if (slot < 0 || tokens < 0 || slot + tokens > l.tokens) {
    return Invalid(
        op, absl::StrFormat("slots [%d, %d) outside the page's %d", slot, slot + tokens, l.tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateKvQuantize(const KvQuantizeParams& p, MemorySpace space) {
  SLUICE_RETURN_IF_ERROR(ValidateLayout("kv_quantize", p.format, p.layout));
  SLUICE_RETURN_IF_ERROR(ValidateSlots("kv_quantize", p.layout, p.slot, p.tokens));
  const int64_t g = p.layout.token_group;
  if (p.slot % g != 0 || p.tokens % g != 0) {
    return Invalid("kv_quantize", absl::StrFormat("slot %d and tokens %d must be multiples of the "
                                                  "token group %d",
                                                  p.slot, p.tokens, g));
  }
  if (p.stride < p.format.head_dim) {
    return Invalid("kv_quantize",
                   absl::StrFormat("stride %d < head_dim %d", p.stride, p.format.head_dim));
  }
  if (p.tokens > 0) {
    constexpr std::string_view kOp = "kv_quantize";
    const int64_t rows = (p.tokens - 1) * p.stride + p.format.head_dim;
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "k", p.k, rows, space));
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "v", p.v, rows, space));
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "page", p.page, p.format.page_bytes, space));
    if (p.scores.data != nullptr) {
      SLUICE_RETURN_IF_ERROR(CheckView(kOp, "scores", p.scores, p.tokens, space));
    }
    if (p.positions.data != nullptr) {
      SLUICE_RETURN_IF_ERROR(CheckView(kOp, "positions", p.positions, p.tokens, space));
    }
  }
  SLUICE_RETURN_IF_ERROR(ValidateCodebooks("kv_quantize", p.format, p.codebooks));
  if (p.format.huffman_bits > 0 && p.tokens_written == nullptr) {
    return Invalid("kv_quantize", "a Huffman-coded tier reports tokens_written; it is null");
  }
  return absl::OkStatus();
}

absl::Status ValidateKvDequantize(const KvDequantizeParams& p, MemorySpace space) {
  SLUICE_RETURN_IF_ERROR(ValidateLayout("kv_dequantize", p.format, p.layout));
  SLUICE_RETURN_IF_ERROR(ValidateSlots("kv_dequantize", p.layout, p.slot, p.tokens));
  if (p.tokens > 0) {
    constexpr std::string_view kOp = "kv_dequantize";
    const int64_t rows = p.tokens * p.format.head_dim;
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "page", p.page, p.format.page_bytes, space));
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "k", p.k, rows, space));
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "v", p.v, rows, space));
  }
  return ValidateCodebooks("kv_dequantize", p.format, p.codebooks);
}

absl::Status ValidateKvMoveSlots(const KvMoveSlotsParams& p, MemorySpace space) {
  constexpr std::string_view kOp = "kv_move_slots";
  SLUICE_RETURN_IF_ERROR(ValidateLayout(kOp, p.format, p.layout));
  if (p.layout.token_group != 1 || p.format.huffman_bits > 0) {
    return Invalid(kOp, absl::StrFormat("%s: slots move one by one only where K is grouped per "
                                        "token and codes have a fixed width",
                                        KvTierFormatName(p.format)));
  }
  if (p.count < 0 || (p.count > 0 && p.moves == nullptr)) {
    return Invalid(kOp, "count must be >= 0, with moves non-null");
  }
  if (p.page_bytes < p.format.page_bytes || p.pages < 0) {
    return Invalid(kOp, absl::StrFormat("pages=%d of %d bytes cannot hold %d-byte pages", p.pages,
                                        p.page_bytes, p.format.page_bytes));
  }
  if (p.count > 0)
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "pool", p.pool, p.pages * p.page_bytes, space));
  for (int64_t i = 0; i < p.count; ++i) {
    const KvSlotMove& m = p.moves[i];
    const bool pages_ok =
        m.src_page >= 0 && m.src_page < p.pages && m.dst_page >= 0 && m.dst_page < p.pages;
    const bool slots_ok = m.slots >= 0 && m.src_slot >= 0 && m.dst_slot >= 0 &&
                          m.src_slot + int64_t{m.slots} <= p.layout.tokens &&
                          m.dst_slot + int64_t{m.slots} <= p.layout.tokens;
    if (!pages_ok || !slots_ok) {
      return Invalid(kOp, absl::StrFormat("move %d (page %d slot %d -> page %d slot %d, %d slots) "
                                          "is outside %d pages of %d slots",
                                          i, m.src_page, m.src_slot, m.dst_page, m.dst_slot,
                                          m.slots, p.pages, p.layout.tokens));
    }
  }
  return absl::OkStatus();
}

// check_io false: a plan's sequence, whose queries and outputs come with each layer's call.
absl::Status ValidatePagedAttention(const PagedAttentionParams& p, bool check_io = true) {
  constexpr std::string_view kOp = "paged_attention";
  if (p.q_tokens < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.heads % p.kv_heads != 0 ||
      p.head_dim <= 0) {
    return Invalid(kOp, absl::StrFormat("bad shape q_tokens=%d heads=%d kv_heads=%d head_dim=%d",
                                        p.q_tokens, p.heads, p.kv_heads, p.head_dim));
  }
  if (p.recent_tokens < p.q_tokens) {
    return Invalid(kOp,
                   absl::StrFormat("recent_tokens=%d < q_tokens=%d", p.recent_tokens, p.q_tokens));
  }
  if (p.q_tokens == 0) return absl::OkStatus();
  if ((check_io && (p.q == nullptr || p.out == nullptr)) || p.recent_k == nullptr ||
      p.recent_v == nullptr || p.page_offsets == nullptr) {
    return Invalid(kOp, "q, out, recent_k, recent_v and page_offsets must be non-null");
  }
  if (p.tier_count < 0 || p.tier_count > 4 ||
      (p.tier_count > 0 && (p.formats == nullptr || p.layouts == nullptr))) {
    return Invalid(kOp, "tier_count must be in [0, 4] with formats and layouts for each");
  }
  for (int32_t t = 0; t < p.tier_count; ++t) {
    SLUICE_RETURN_IF_ERROR(ValidateLayout(kOp, p.formats[t], p.layouts[t]));
    if (p.formats[t].head_dim != p.head_dim) {
      return Invalid(kOp, absl::StrFormat("tier %d has head_dim %d, queries %d", t,
                                          p.formats[t].head_dim, p.head_dim));
    }
  }
  // NOTE: page_offsets and pages are read here, so they must be host-readable for every backend
  // (the CUDA backend takes them as pinned host memory).
  if (p.page_offsets[0] != 0) return Invalid(kOp, "page_offsets[0] must be 0");
  for (int64_t h = 0; h < p.kv_heads; ++h) {
    if (p.page_offsets[h + 1] < p.page_offsets[h]) {
      return Invalid(kOp, "page_offsets must not decrease");
    }
  }
  const int32_t n = p.page_offsets[p.kv_heads];
  if (n > 0 && p.pages == nullptr) return Invalid(kOp, "pages must be non-null");
  if ((p.page_scores == nullptr) != (p.recent_scores == nullptr)) {
    return Invalid(kOp, "page_scores and recent_scores go together");
  }
  uint32_t coded_tiers_checked = 0;  // Huffman-coded tiers need codebooks once they have pages
  for (int32_t i = 0; i < n; ++i) {
    const KvPageRef& r = p.pages[i];
    if (r.tier < 0 || r.tier >= p.tier_count || r.data == nullptr || r.slots < 0 ||
        r.slots > p.layouts[r.tier].tokens) {
      return Invalid(kOp, absl::StrFormat("page %d: tier %d, %d slots, data %p is not valid", i,
                                          r.tier, r.slots, static_cast<const void*>(r.data)));
    }
    if (p.formats[r.tier].huffman_bits > 0 && !(coded_tiers_checked & (1u << r.tier))) {
      if (p.codebooks == nullptr) {
        return Invalid(kOp, absl::StrFormat("tier %d is Huffman-coded; codebooks is null", r.tier));
      }
      SLUICE_RETURN_IF_ERROR(ValidateCodebooks(kOp, p.formats[r.tier], p.codebooks[r.tier]));
      coded_tiers_checked |= 1u << r.tier;
    }
  }
  return absl::OkStatus();
}

// Checks what the batch adds to PagedAttentionParams (the CSR tables, the pool, the views, the
// per-sequence arrays) and resolves each sequence into a call of its own: its page refs go to
// *refs, its page offsets (relative to its first ref) to *offsets.
absl::Status SplitBatchPagedAttention(const BatchPagedAttentionParams& p, MemorySpace space,
                                      std::vector<KvPageRef>* refs, std::vector<int32_t>* offsets,
                                      std::vector<PagedAttentionParams>* sequences,
                                      bool check_io = true) {
  constexpr std::string_view kOp = "batch_paged_attention";
  if (p.batch < 0) return Invalid(kOp, absl::StrFormat("batch=%d < 0", p.batch));
  if (p.batch == 0) return absl::OkStatus();
  if (p.kv_heads <= 0 || p.heads <= 0 || p.head_dim <= 0) {
    return Invalid(kOp, absl::StrFormat("bad shape heads=%d kv_heads=%d head_dim=%d", p.heads,
                                        p.kv_heads, p.head_dim));
  }
  if (p.q_indptr == nullptr || p.recent_k == nullptr || p.recent_v == nullptr ||
      p.recent_tokens == nullptr) {
    return Invalid(kOp, "q_indptr, recent_k, recent_v and recent_tokens must be non-null");
  }
  if (p.tier_count < 0 || p.tier_count > kMaxKvTiers ||
      (p.tier_count > 0 && (p.formats == nullptr || p.layouts == nullptr))) {
    return Invalid(kOp, absl::StrFormat("tier_count must be in [0, %d] with formats and layouts "
                                        "for each",
                                        kMaxKvTiers));
  }
  const bool scores = p.page_scores.data != nullptr;
  if (scores != (p.recent_scores.data != nullptr) || scores != (p.page_score_offsets != nullptr) ||
      scores != (p.recent_score_offsets != nullptr)) {
    return Invalid(kOp, "page_scores, recent_scores and their offsets go together");
  }
  if (p.q_indptr[0] != 0) return Invalid(kOp, "q_indptr[0] must be 0");
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.q_indptr[b + 1] < p.q_indptr[b]) {
      return Invalid(kOp, absl::StrFormat("q_indptr decreases at sequence %d", b));
    }
  }
  const int64_t rows = p.q_indptr[p.batch] * p.heads * p.head_dim;
  if (check_io) {
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "q", p.q, rows, space));
    SLUICE_RETURN_IF_ERROR(CheckView(kOp, "out", p.out, rows, space));
  }
  const int64_t lists = p.batch * p.kv_heads;
  const int64_t pool_pages = p.page_bytes > 0 ? p.pool.size / p.page_bytes : 0;
  int64_t pages = 0;
  for (int32_t t = 0; t < p.tier_count; ++t) {
    const KvPageTable& table = p.tables[t];
    if (table.indptr == nullptr) return Invalid(kOp, absl::StrFormat("tier %d has no indptr", t));
    if (table.indptr[0] < 0) return Invalid(kOp, absl::StrFormat("tier %d: indptr < 0", t));
    for (int64_t i = 0; i < lists; ++i) {
      if (table.indptr[i + 1] < table.indptr[i]) {
        return Invalid(kOp, absl::StrFormat("tier %d: indptr decreases at list %d", t, i));
      }
    }
    const int64_t n = table.indptr[lists] - table.indptr[0];
    if (n == 0) continue;
    if (table.ids == nullptr || table.slots == nullptr) {
      return Invalid(kOp, absl::StrFormat("tier %d lists pages but its ids or slots are null", t));
    }
    if (p.page_bytes < p.formats[t].page_bytes || p.page_bytes % 16 != 0) {
      return Invalid(kOp, absl::StrFormat("page_bytes %d: under tier %d's %d or not a multiple "
                                          "of 16",
                                          p.page_bytes, t, p.formats[t].page_bytes));
    }
    for (int32_t j = table.indptr[0]; j < table.indptr[lists]; ++j) {
      if (table.ids[j] < 0 || table.ids[j] >= pool_pages) {
        return Invalid(kOp, absl::StrFormat("tier %d: page id %d outside the pool's [0, %d)", t,
                                            table.ids[j], pool_pages));
      }
    }
    pages += n;
  }
  if (pages > 0) SLUICE_RETURN_IF_ERROR(CheckView(kOp, "pool", p.pool, p.pool.size, space));
  const int64_t row = p.kv_heads * p.head_dim;
  const int64_t group = p.scores_per_head ? p.heads / p.kv_heads : 1;
  refs->clear();
  refs->reserve(pages);
  offsets->assign(p.batch * (p.kv_heads + 1), 0);
  sequences->clear();
  sequences->reserve(p.batch);
  std::vector<size_t> first_ref(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    SLUICE_RETURN_IF_ERROR(
        CheckView(kOp, "recent_k", p.recent_k[b], p.recent_tokens[b] * row, space, b));
    SLUICE_RETURN_IF_ERROR(
        CheckView(kOp, "recent_v", p.recent_v[b], p.recent_tokens[b] * row, space, b));
    first_ref[b] = refs->size();
    int64_t slots = 0;
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      const int64_t list = b * p.kv_heads + h;
      for (int32_t t = 0; t < p.tier_count; ++t) {
        const KvPageTable& table = p.tables[t];
        for (int32_t j = table.indptr[list]; j < table.indptr[list + 1]; ++j) {
          refs->push_back({.data = p.pool.data + int64_t{table.ids[j]} * p.page_bytes,
                           .slots = table.slots[j],
                           .tier = t});
          slots += table.slots[j];
        }
      }
      (*offsets)[b * (p.kv_heads + 1) + h + 1] = static_cast<int32_t>(refs->size() - first_ref[b]);
    }
    const int64_t q0 = p.q_indptr[b];
    PagedAttentionParams s{
        .q = p.q.data == nullptr ? nullptr : p.q.data + q0 * p.heads * p.head_dim,
        .out = p.out.data == nullptr ? nullptr : p.out.data + q0 * p.heads * p.head_dim,
        .q_tokens = p.q_indptr[b + 1] - q0,
        .heads = p.heads,
        .kv_heads = p.kv_heads,
        .head_dim = p.head_dim,
        .scale = p.scale,
        .formats = p.formats,
        .layouts = p.layouts,
        .codebooks = p.codebooks,
        .tier_count = p.tier_count,
        .recent_k = p.recent_k[b].data,
        .recent_v = p.recent_v[b].data,
        .recent_tokens = p.recent_tokens[b],
        .scores_per_head = p.scores_per_head};
    if (scores) {
      // The sequence's regions: [group, its slots] and [group * kv_heads, its recent tokens].
      const int64_t ps = p.page_score_offsets[b], rs = p.recent_score_offsets[b];
      const int64_t ps_need = group * slots, rs_need = group * p.kv_heads * p.recent_tokens[b];
      if (ps < 0 || rs < 0 || ps + ps_need > p.page_scores.size ||
          rs + rs_need > p.recent_scores.size) {
        return Invalid(kOp, absl::StrFormat("sequence %d's scores [%d, +%d) and [%d, +%d) do not "
                                            "fit page_scores (%d) and recent_scores (%d)",
                                            b, ps, ps_need, rs, rs_need, p.page_scores.size,
                                            p.recent_scores.size));
      }
      // The views must reach each region's end; a sequence with no paged slots reads no
      // page_scores, so they may be empty.
      SLUICE_RETURN_IF_ERROR(
          CheckView(kOp, "page_scores", p.page_scores, ps_need > 0 ? ps + ps_need : 0, space));
      SLUICE_RETURN_IF_ERROR(CheckView(kOp, "recent_scores", p.recent_scores, rs + rs_need, space));
      s.page_scores = p.page_scores.data + ps;
      s.recent_scores = p.recent_scores.data + rs;
    }
    sequences->push_back(s);
  }
  for (int64_t b = 0; b < p.batch; ++b) {  // refs has its final address now
    PagedAttentionParams& s = (*sequences)[b];
    s.pages = refs->data() + first_ref[b];
    s.page_offsets = offsets->data() + b * (p.kv_heads + 1);
    if (absl::Status st = ValidatePagedAttention(s, check_io); !st.ok()) {
      return Invalid(kOp, absl::StrFormat("sequence %d: %s", b, st.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::RmsNorm(const RmsNormParams& p) {
  if (!Supports(Op::kRmsNorm)) return Unsupported(Op::kRmsNorm);
  SLUICE_RETURN_IF_ERROR(ValidateRmsNorm(p));
  if (p.rows == 0) return absl::OkStatus();
  return DoRmsNorm(p);
}

absl::Status Backend::Matmul(const MatmulParams& p) {
  if (!Supports(Op::kMatmul)) return Unsupported(Op::kMatmul);
  SLUICE_RETURN_IF_ERROR(ValidateMatmul(p));
  if (p.m == 0) return absl::OkStatus();
  return DoMatmul(p);
}

absl::Status Backend::GetRows(const GetRowsParams& p) {
  if (!Supports(Op::kGetRows)) return Unsupported(Op::kGetRows);
  SLUICE_RETURN_IF_ERROR(ValidateGetRows(p));
  if (p.count == 0) return absl::OkStatus();
  return DoGetRows(p);
}

absl::Status Backend::Rope(const RopeParams& p) {
  if (!Supports(Op::kRope)) return Unsupported(Op::kRope);
  SLUICE_RETURN_IF_ERROR(ValidateRope(p));
  if (p.tokens == 0) return absl::OkStatus();
  return DoRope(p);
}

absl::Status Backend::SwiGlu(const SwiGluParams& p) {
  if (!Supports(Op::kSwiGlu)) return Unsupported(Op::kSwiGlu);
  SLUICE_RETURN_IF_ERROR(ValidateSwiGlu(p));
  if (p.n == 0) return absl::OkStatus();
  return DoSwiGlu(p);
}

absl::Status Backend::Softmax(const SoftmaxParams& p) {
  if (!Supports(Op::kSoftmax)) return Unsupported(Op::kSoftmax);
  SLUICE_RETURN_IF_ERROR(ValidateSoftmax(p));
  if (p.rows == 0) return absl::OkStatus();
  return DoSoftmax(p);
}

absl::Status Backend::Attention(const AttentionParams& p) {
  if (!Supports(Op::kAttention)) return Unsupported(Op::kAttention);
  SLUICE_RETURN_IF_ERROR(ValidateAttention(p));
  if (p.q_tokens == 0) return absl::OkStatus();
  return DoAttention(p);
}

absl::Status Backend::KvQuantize(const KvQuantizeParams& p) {
  if (!Supports(Op::kKvQuantize)) return Unsupported(Op::kKvQuantize);
  SLUICE_RETURN_IF_ERROR(ValidateKvQuantize(p, memory_space()));
  if (p.tokens == 0) {
    if (p.tokens_written != nullptr) *p.tokens_written = 0;
    return absl::OkStatus();
  }
  return DoKvQuantize(p);
}

absl::Status Backend::KvQuantizeBatch(absl::Span<const KvQuantizeParams> items) {
  if (!Supports(Op::kKvQuantize)) return Unsupported(Op::kKvQuantize);
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::Status st = ValidateKvQuantize(items[i], memory_space()); !st.ok()) {
      return absl::Status(st.code(), absl::StrFormat("item %d: %s", i, st.message()));
    }
  }
  return DoKvQuantizeBatch(items);
}

absl::Status Backend::DoKvQuantizeBatch(absl::Span<const KvQuantizeParams> items) {
  for (const KvQuantizeParams& p : items) {
    if (p.tokens == 0) {
      if (p.tokens_written != nullptr) *p.tokens_written = 0;
      continue;
    }
    SLUICE_RETURN_IF_ERROR(DoKvQuantize(p));
  }
  return absl::OkStatus();
}

absl::Status Backend::KvDequantize(const KvDequantizeParams& p) {
  if (!Supports(Op::kKvDequantize)) return Unsupported(Op::kKvDequantize);
  SLUICE_RETURN_IF_ERROR(ValidateKvDequantize(p, memory_space()));
  if (p.tokens == 0) return absl::OkStatus();
  return DoKvDequantize(p);
}

absl::Status Backend::KvMoveSlots(const KvMoveSlotsParams& p) {
  if (!Supports(Op::kKvMoveSlots)) return Unsupported(Op::kKvMoveSlots);
  SLUICE_RETURN_IF_ERROR(ValidateKvMoveSlots(p, memory_space()));
  if (p.count == 0) return absl::OkStatus();
  return DoKvMoveSlots(p);
}

absl::Status Backend::PagedAttention(const PagedAttentionParams& p) {
  if (!Supports(Op::kPagedAttention)) return Unsupported(Op::kPagedAttention);
  SLUICE_RETURN_IF_ERROR(ValidatePagedAttention(p));
  if (p.q_tokens == 0) return absl::OkStatus();
  return DoPagedAttention(p);
}

absl::Status Backend::BatchPagedAttention(const BatchPagedAttentionParams& p) {
  if (!Supports(Op::kBatchPagedAttention)) return Unsupported(Op::kBatchPagedAttention);
  std::vector<KvPageRef> refs;
  std::vector<int32_t> offsets;
  std::vector<PagedAttentionParams> sequences;
  if (p.plan != nullptr && p.plan->backend() != this) {
    return Invalid("batch_paged_attention", "the plan was made by another backend");
  }
  SLUICE_RETURN_IF_ERROR(SplitBatchPagedAttention(p, memory_space(), &refs, &offsets, &sequences));
  if (p.batch == 0 || p.q_indptr[p.batch] == 0) return absl::OkStatus();
  return DoBatchPagedAttention(p, sequences);
}

absl::Status Backend::DoBatchPagedAttention(const BatchPagedAttentionParams&,
                                            absl::Span<const PagedAttentionParams> sequences) {
  for (const PagedAttentionParams& s : sequences) {
    if (s.q_tokens > 0) SLUICE_RETURN_IF_ERROR(DoPagedAttention(s));
  }
  return absl::OkStatus();
}

BatchPagedAttentionParams LayerOfStep(const BatchPagedAttentionStep& step, int64_t layer) {
  BatchPagedAttentionParams p = step.batch;
  const int64_t batch = p.batch;
  for (int32_t t = 0; t < p.tier_count && t < kMaxKvTiers; ++t) {
    if (p.tables[t].indptr != nullptr) p.tables[t].indptr += layer * batch * p.kv_heads;
  }
  if (p.recent_k != nullptr) p.recent_k += layer * batch;
  if (p.recent_v != nullptr) p.recent_v += layer * batch;
  if (p.codebooks != nullptr) p.codebooks += layer * p.tier_count;
  p.q = {};
  p.out = {};
  p.page_scores = {};
  p.recent_scores = {};
  p.page_score_offsets = p.recent_score_offsets = nullptr;
  p.plan = nullptr;
  p.layer = layer;
  return p;
}

absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> Backend::PlanBatchPagedAttention(
    const BatchPagedAttentionStep& step) {
  if (!Supports(Op::kBatchPagedAttention)) return Unsupported(Op::kBatchPagedAttention);
  if (step.layers <= 0) {
    return Invalid("batch_paged_attention", absl::StrFormat("a step of %d layers", step.layers));
  }
  if (step.batch.batch == 0 || !PlansBatchPagedAttention()) return nullptr;
  // Each layer validated and resolved as its call will be; the refs back the sequences.
  std::vector<std::vector<KvPageRef>> refs(step.layers);
  std::vector<std::vector<int32_t>> offsets(step.layers);
  std::vector<std::vector<PagedAttentionParams>> layers(step.layers);
  for (int64_t l = 0; l < step.layers; ++l) {
    SLUICE_RETURN_IF_ERROR(SplitBatchPagedAttention(LayerOfStep(step, l), memory_space(), &refs[l],
                                                    &offsets[l], &layers[l],
                                                    /*check_io=*/false));
  }
  return DoPlanBatchPagedAttention(step, layers);
}

absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> Backend::DoPlanBatchPagedAttention(
    const BatchPagedAttentionStep&, absl::Span<const std::vector<PagedAttentionParams>>) {
  return nullptr;
}

absl::Status Backend::DoRmsNorm(const RmsNormParams&) { return Unsupported(Op::kRmsNorm); }
absl::Status Backend::DoMatmul(const MatmulParams&) { return Unsupported(Op::kMatmul); }
absl::Status Backend::DoGetRows(const GetRowsParams&) { return Unsupported(Op::kGetRows); }
absl::Status Backend::DoRope(const RopeParams&) { return Unsupported(Op::kRope); }
absl::Status Backend::DoSwiGlu(const SwiGluParams&) { return Unsupported(Op::kSwiGlu); }
absl::Status Backend::DoSoftmax(const SoftmaxParams&) { return Unsupported(Op::kSoftmax); }
absl::Status Backend::DoAttention(const AttentionParams&) { return Unsupported(Op::kAttention); }
absl::Status Backend::DoKvQuantize(const KvQuantizeParams&) { return Unsupported(Op::kKvQuantize); }
absl::Status Backend::DoKvDequantize(const KvDequantizeParams&) {
  return Unsupported(Op::kKvDequantize);
}
absl::Status Backend::DoKvMoveSlots(const KvMoveSlotsParams&) {
  return Unsupported(Op::kKvMoveSlots);
}
absl::Status Backend::DoPagedAttention(const PagedAttentionParams&) {
  return Unsupported(Op::kPagedAttention);
}

absl::StatusOr<std::unique_ptr<Backend::Recording>> Backend::Record(
    absl::FunctionRef<absl::Status()> ops) {
  if (!CanRecord()) {
    return absl::UnimplementedError(absl::StrFormat("%s records no ops", name()));
  }
  return DoRecord(ops);
}

absl::Status Backend::Replay(const Recording& recording) { return DoReplay(recording); }

absl::StatusOr<std::unique_ptr<Backend::Recording>> Backend::DoRecord(
    absl::FunctionRef<absl::Status()> ops) {
  (void)ops;
  return absl::UnimplementedError(absl::StrFormat("%s records no ops", name()));
}

absl::Status Backend::DoReplay(const Recording& recording) {
  (void)recording;
  return absl::UnimplementedError(absl::StrFormat("%s has no recordings to replay", name()));
}

absl::Status Backend::Unsupported(Op op) const {
  return absl::UnimplementedError(
      absl::StrFormat("op %s is not supported by backend %s", OpName(op), name()));
}

}  // namespace sluice::kernels
