#include "kernels/cuda/decode_attention.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_kernels.h"
#include "kernels/cuda/device_array.h"
#include "kernels/huffman.h"

namespace sluice::kernels::cuda {
namespace {

int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }
constexpr int64_t kArrayAlignment = 256;
int64_t AlignArray(int64_t x) {
  return (x + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment;
}

// The device arrays of a plan, laid out in one block: first the arrays copied from host data,
// then the scratch arrays the kernels write. Pointers are filled in by Place.
class PlanArrays {
 public:
  template <typename T>
  void Upload(const T** dst, const T* data, size_t n) {
    uploads_.push_back({reinterpret_cast<void**>(const_cast<T**>(dst)), data, n * sizeof(T)});
  }
  template <typename T>
  void Scratch(T** dst, int64_t n) {
    scratch_.push_back({reinterpret_cast<void**>(dst), nullptr,
                        static_cast<size_t>(std::max<int64_t>(1, n)) * sizeof(T)});
  }
  // Bytes of the uploads (what is copied) and of the whole block.
  int64_t upload_bytes() const { return Sum(uploads_); }
  int64_t bytes() const { return Sum(uploads_) + Sum(scratch_); }

  // Points every array into `device` (bytes() long) and stages the uploads' data in `staging`
  // (upload_bytes() long), ready for one copy to `device`.
  void Place(uint8_t* device, uint8_t* staging) const {
    int64_t at = 0;
    for (const Item& u : uploads_) {
      if (u.bytes > 0) std::memcpy(staging + at, u.data, u.bytes);
      *u.dst = device + at;
      at += AlignArray(static_cast<int64_t>(u.bytes));
    }
    for (const Item& w : scratch_) {
      *w.dst = device + at;
      at += AlignArray(static_cast<int64_t>(w.bytes));
    }
  }

 private:
  struct Item {
    void** dst;
    const void* data;
    size_t bytes;
  };
  static int64_t Sum(const std::vector<Item>& items) {
    int64_t n = 0;
    for (const Item& i : items) n += AlignArray(static_cast<int64_t>(i.bytes));
    return n;
  }
  std::vector<Item> uploads_, scratch_;
};

}  // namespace

DecodeTierConsts MakeDecodeTierConsts(const KvTierFormat& f, const KvPageLayout& l, int d) {
  DecodeTierConsts c;
  const KvQuantSpec& k = f.k;
  const KvQuantSpec& v = f.v;
  const int kg = k.group == 0 ? d : k.group;
  if (k.codec == KvCodec::kInt) c.k_per_shift = std::countr_zero(static_cast<unsigned>(8 / k.bits));
  c.k_groups = d / kg;
  c.k_group8 = kg % 8 == 0 ? kg / 8 : 0;
  const int bc = k.grouping == KvGrouping::kBlock ? k.block_channels : 1;
  c.k_blocks = d / bc;
  c.k_tile = MakeFastDiv(static_cast<uint32_t>(std::max(1, l.k_tile)));
  c.k_group = MakeFastDiv(static_cast<uint32_t>(kg));
  c.k_block = MakeFastDiv(static_cast<uint32_t>(bc));
  c.k_meta_halves = KvMetaHalves(k, d, l.tokens);
  const int vg = v.group == 0 ? d : v.group;
  const bool v_int = v.codec == KvCodec::kInt;
  c.v_groups = d / vg;
  c.v_per = v_int ? 8 / v.bits : 1;
  c.v_cols = v_int ? l.v_row_bytes : d;
  c.v_splits = std::max(1, kDecodeThreads / c.v_cols);
  c.v_group = MakeFastDiv(static_cast<uint32_t>(vg));
  c.v_cols_div = MakeFastDiv(static_cast<uint32_t>(c.v_cols));
  c.v_meta_halves = KvMetaHalves(v, d, l.tokens);
  return c;
}

struct DecodeAttentionWorkspace::State {
  DeviceArray<uint8_t> device;
  PinnedArray<uint8_t> staging;
  CudaEvent copied;  // recorded after the last copy out of `staging`
  bool copy_pending = false;
};

DecodeAttentionWorkspace::DecodeAttentionWorkspace() : state_(std::make_unique<State>()) {}
DecodeAttentionWorkspace::DecodeAttentionWorkspace(DecodeAttentionWorkspace&&) noexcept = default;
DecodeAttentionWorkspace& DecodeAttentionWorkspace::operator=(DecodeAttentionWorkspace&&) noexcept =
    default;
DecodeAttentionWorkspace::~DecodeAttentionWorkspace() = default;
int64_t DecodeAttentionWorkspace::device_bytes() const { return state_->device.size(); }

struct DecodeAttentionPlan::State {
  DeviceArray<uint8_t> owned;  // the plan's arrays when it has no workspace
  DecodeKernelParams params;   // layer 0's; Run moves the per-layer pointers to its layer
  DecodeKernelChoice kernel;
  int64_t layers = 1;
  int64_t batch = 0;
  // Per layer: its first chunk (and one past the last layer's), and its tables.
  std::vector<int32_t> layer_chunks;
  struct Tables {
    const uint16_t* k = nullptr;
    const uint16_t* v = nullptr;
    int32_t k_bits = 0;
    int32_t v_bits = 0;
  };
  std::vector<Tables> tables;  // [layers * tier_count]; uploads point into it
  int64_t page_bytes_read = 0;
  int64_t max_keys = 0;
  bool scores = false;
};

DecodeAttentionPlan::DecodeAttentionPlan(std::unique_ptr<State> state) : state_(std::move(state)) {}
DecodeAttentionPlan::DecodeAttentionPlan(DecodeAttentionPlan&&) noexcept = default;
DecodeAttentionPlan& DecodeAttentionPlan::operator=(DecodeAttentionPlan&&) noexcept = default;
DecodeAttentionPlan::~DecodeAttentionPlan() = default;

int64_t DecodeAttentionPlan::chunks() const { return state_->params.chunk_count; }
int64_t DecodeAttentionPlan::layers() const { return state_->layers; }
int64_t DecodeAttentionPlan::page_bytes_read() const { return state_->page_bytes_read; }
std::string DecodeAttentionPlan::kernel() const {
  const int bits = state_->kernel.kivi_bits;
  return bits == 0 ? "generic" : absl::StrCat("kivi", bits);
}

int64_t ChoosePagesPerChunk(absl::Span<const int32_t> page_offsets, int64_t layers,
                            int64_t row_groups, int64_t wave, bool recent_chunk) {
  const int64_t lists = static_cast<int64_t>(page_offsets.size()) - 1;
  if (layers <= 0 || lists <= 0 || lists % layers != 0 || wave <= 0) return 1;
  const int64_t per_layer = lists / layers;
  int64_t longest = 1;
  for (int64_t i = 0; i < lists; ++i) {
    longest = std::max<int64_t>(longest, page_offsets[i + 1] - page_offsets[i]);
  }
  // The model's length of the step's launches with chunks of up to `size` pages.
  const auto cost = [&](int64_t size) {
    int64_t total = 0;
    for (int64_t l = 0; l < layers; ++l) {
      int64_t blocks = 0, recent_blocks = 0, longest_chunk = 0;
      for (int64_t i = l * per_layer; i < (l + 1) * per_layer; ++i) {
        const int64_t n = page_offsets[i + 1] - page_offsets[i];
        const int64_t k = (n + size - 1) / size;
        blocks += k;
        recent_blocks += recent_chunk || k == 0 ? 1 : 0;
        if (k > 0) longest_chunk = std::max(longest_chunk, (n + k - 1) / k);
      }
      // Page chunks in waves; chunks of recent tokens only, short, as their fixed work spread
      // over the wave.
      total += (blocks * row_groups + wave - 1) / wave * (longest_chunk + kChunkFixedPages) +
               (recent_blocks * row_groups * kChunkFixedPages + wave - 1) / wave;
    }
    return total;
  };
  // A wave's share of a layer's pages per block cuts the longest list into about `even` pieces;
  // the sizes tried cut it into up to twice that and 16 more (past that, more pieces only add
  // waves; the 16 let many-wave layers fill their last wave), and the share itself.
  const int64_t layer_pages = page_offsets[lists] / layers;
  const int64_t share = std::max<int64_t>(1, (layer_pages * row_groups + wave - 1) / wave);
  const int64_t even = (longest + share - 1) / share;
  int64_t best = std::min(share, longest), best_cost = cost(best);
  int64_t previous = -1;
  for (int64_t pieces = 1; pieces <= std::min(longest, 2 * even + 16); ++pieces) {
    const int64_t size = (longest + pieces - 1) / pieces;
    if (size == previous) continue;
    previous = size;
    const int64_t c = cost(size);
    if (c < best_cost || (c == best_cost && size > best)) {
      best = size;
      best_cost = c;
    }
  }
  return best;
}

absl::StatusOr<DecodeAttentionPlan> DecodeAttentionPlan::Create(
    const DecodeBatch& b, cudaStream_t stream, DecodeAttentionWorkspace* workspace) {
  const int64_t d = b.head_dim;
  if (d <= 0 || d % 32 != 0 || d > 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("decode attention: head_dim %d is not a multiple of 32 up to 256", d));
  }
  if (b.layers <= 0 || b.batch <= 0 || b.q_tokens <= 0 || b.kv_heads <= 0 ||
      b.heads % b.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "decode attention: layers %d, batch %d, q_tokens %d, heads %d / kv_heads %d", b.layers,
        b.batch, b.q_tokens, b.heads, b.kv_heads));
  }
  if (b.tier_count < 0 || b.tier_count > kDecodeMaxTiers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("decode attention: %d tiers; at most %d", b.tier_count, kDecodeMaxTiers));
  }
  const int64_t g = b.heads / b.kv_heads, rows = g * b.q_tokens;
  const int64_t bh_count = b.batch * b.kv_heads, layers = b.layers;
  auto state = std::make_unique<State>();
  DecodeKernelParams& p = state->params;
  state->layers = layers;
  state->batch = b.batch;
  state->tables.resize(layers * b.tier_count);
  PlanArrays arrays;
  p.tier_count = b.tier_count;
  int64_t page_buffer = 16, unit_buffer = 0, meta_floats = 0, view_tokens = kRecentView;
  for (int t = 0; t < b.tier_count; ++t) {
    DecodeTier& dt = p.tiers[t];
    dt.format = b.formats[t];
    dt.layout = b.layouts[t];
    dt.huffman = dt.format.huffman_bits > 0;
    if (dt.format.head_dim != d) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "decode attention: tier %d has head_dim %d, the batch %d", t, dt.format.head_dim, d));
    }
    if (dt.huffman) {
      dt.unit_format = KvUnitFormat(dt.format);
      SLUICE_ASSIGN_OR_RETURN(dt.unit_layout, ComputeUnitLayout(dt.format));
      // Each layer's codebooks. Without them the tables stay null: an error once a page of
      // that layer uses the tier.
      for (int64_t l = 0; l < layers; ++l) {
        const KvCodebooks cb =
            b.codebooks != nullptr ? b.codebooks[l * b.tier_count + t] : KvCodebooks{};
        State::Tables& tables = state->tables[l * b.tier_count + t];
        if (cb.k != nullptr && cb.v != nullptr) {
          arrays.Upload(&tables.k, cb.k->decode_table.data(), cb.k->decode_table.size());
          arrays.Upload(&tables.v, cb.v->decode_table.data(), cb.v->decode_table.size());
          tables.k_bits = cb.k->max_length;
          tables.v_bits = cb.v->max_length;
        }
      }
      dt.load_bytes = static_cast<int32_t>(Align16(dt.format.page_bytes));
      unit_buffer = std::max<int64_t>(unit_buffer, Align16(dt.unit_layout.bytes_used));
      view_tokens = std::max<int64_t>(view_tokens, dt.layout.unit_tokens);
    } else {
      dt.unit_format = dt.format;
      dt.unit_layout = dt.layout;
      dt.load_bytes = static_cast<int32_t>(Align16(dt.layout.bytes_used));
      view_tokens = std::max<int64_t>(view_tokens, dt.layout.tokens);
    }
    dt.consts = MakeDecodeTierConsts(dt.unit_format, dt.unit_layout, static_cast<int>(d));
    page_buffer = std::max<int64_t>(page_buffer, dt.load_bytes + 16);
    const int n = dt.unit_layout.tokens;
    meta_floats = std::max<int64_t>(
        meta_floats, KvMetaHalves(dt.unit_format.k, d, n) + KvMetaHalves(dt.unit_format.v, d, n));
  }

  // Pages, and each list's keys: its slots, then its sequence's recent tokens. Offsets restart
  // at 0 in every layer (bh_count + 1 of them per layer), so a layer's run sees a one-layer plan.
  const int64_t lists = layers * bh_count;
  std::vector<int32_t> key_offsets(layers * (bh_count + 1), 0), slot_offsets(key_offsets.size());
  int64_t max_layer_keys = 0;
  for (int64_t list = 0; list < lists; ++list) {
    const int64_t l = list / bh_count, bh = list % bh_count, seq = bh / b.kv_heads;
    const int64_t recent = b.recent_offsets[seq + 1] - b.recent_offsets[seq];
    if (recent < b.q_tokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "decode attention: sequence %d has %d recent tokens, fewer than its %d queries", seq,
          recent, b.q_tokens));
    }
    int64_t slots = 0;
    for (int32_t i = b.page_offsets[list]; i < b.page_offsets[list + 1]; ++i) {
      const KvPageRef& r = b.pages[i];
      if (r.tier < 0 || r.tier >= b.tier_count || r.slots < 0 ||
          r.slots > b.layouts[r.tier].tokens || reinterpret_cast<uintptr_t>(r.data) % 16 != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "decode attention: page %d (tier %d, %d slots, data %p) is not valid or not 16-byte "
            "aligned",
            i, r.tier, r.slots, static_cast<const void*>(r.data)));
      }
      if (p.tiers[r.tier].huffman && state->tables[l * b.tier_count + r.tier].k_bits == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "decode attention: page %d (layer %d) is in Huffman-coded tier %d, which has no "
            "codebooks",
            i, l, r.tier));
      }
      slots += r.slots;
      state->page_bytes_read += p.tiers[r.tier].load_bytes;
    }
    const int64_t at = l * (bh_count + 1) + bh;
    slot_offsets[at + 1] = static_cast<int32_t>(slot_offsets[at] + slots);
    key_offsets[at + 1] = static_cast<int32_t>(key_offsets[at] + slots + recent);
    state->max_keys = std::max(state->max_keys, slots + recent);
    max_layer_keys = std::max<int64_t>(max_layer_keys, key_offsets[at + 1]);
  }

  p.page_buffer_bytes = static_cast<int32_t>(page_buffer);
  p.unit_buffer_bytes = static_cast<int32_t>(unit_buffer);
  p.meta_floats = static_cast<int32_t>(meta_floats);
  p.view_tokens = static_cast<int32_t>(view_tokens);
  p.bh_count = static_cast<int32_t>(bh_count);
  p.q_tokens = static_cast<int32_t>(b.q_tokens);
  p.heads = static_cast<int32_t>(b.heads);
  p.kv_heads = static_cast<int32_t>(b.kv_heads);
  p.head_dim = static_cast<int32_t>(d);
  p.group = static_cast<int32_t>(g);
  p.rows = static_cast<int32_t>(rows);
  p.head_dim_div = MakeFastDiv(static_cast<uint32_t>(d));
  p.head_dim8_div = MakeFastDiv(static_cast<uint32_t>(d / 8));
  p.group_div = MakeFastDiv(static_cast<uint32_t>(g));
  p.scale = b.scale;
  state->kernel =
      ChooseDecodeKernel(p.tiers, p.tier_count, static_cast<int>(d), static_cast<int>(rows));
  const bool fold_recent = state->kernel.kivi_bits != 0;

  int device = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int sms = 0, optin = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = DecodeSharedBytes(p, state->kernel);
  if (smem > static_cast<size_t>(optin)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "decode attention: a block needs %d bytes of shared memory (pages of up to %d bytes); "
        "the device allows %d",
        smem, page_buffer, optin));
  }
  int per_sm = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(DecodeBlocksPerSm(p, state->kernel, &per_sm));

  // Split-K: each bh's pages in chunks of near-equal size; its recent tokens go in the last of
  // them (KIVI kernel) or in a chunk of their own (generic kernel). By default the chunk size
  // is ChoosePagesPerChunk's, for waves of SMs x blocks per SM (the occupancy calculator's).
  // A bh's n pages go in ceil(n / size) chunks whose sizes differ by at most one page.
  const int64_t row_groups =
      (rows + state->kernel.rows_per_block - 1) / state->kernel.rows_per_block;
  const int64_t wave = std::max<int64_t>(1, int64_t{sms} * std::max(1, per_sm));
  int64_t per_chunk = b.pages_per_chunk;
  if (per_chunk <= 0) {
    per_chunk = ChoosePagesPerChunk(absl::MakeConstSpan(b.page_offsets, lists + 1), layers,
                                    row_groups, wave, !fold_recent);
  }
  std::vector<DecodeChunk> chunks;
  std::vector<int32_t> chunk_offsets;  // per layer, from its first chunk
  state->layer_chunks = {0};
  int64_t max_layer_chunks = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const int32_t layer_first = static_cast<int32_t>(chunks.size());
    chunk_offsets.push_back(0);
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t list = l * bh_count + bh;
      const int32_t first = b.page_offsets[list], n = b.page_offsets[list + 1] - first;
      const int64_t pieces = (n + per_chunk - 1) / per_chunk;
      int32_t key = 0;
      for (int64_t k = 0; k < pieces; ++k) {
        const int32_t begin = first + static_cast<int32_t>(n * k / pieces);
        const int32_t end = first + static_cast<int32_t>(n * (k + 1) / pieces);
        chunks.push_back({.bh = static_cast<int32_t>(bh),
                          .page_begin = begin,
                          .page_end = end,
                          .key_base = key});
        for (int32_t j = begin; j < end; ++j) key += b.pages[j].slots;
      }
      const int64_t seq = bh / b.kv_heads;
      const int32_t recent =
          static_cast<int32_t>(b.recent_offsets[seq + 1] - b.recent_offsets[seq]);
      if (!fold_recent || pieces == 0) {
        chunks.push_back({.bh = static_cast<int32_t>(bh),
                          .page_begin = first + n,
                          .page_end = first + n,
                          .key_base = key});
      }
      chunks.back().recent_begin = 0;
      chunks.back().recent_end = recent;
      chunk_offsets.push_back(static_cast<int32_t>(chunks.size()) - layer_first);
    }
    state->layer_chunks.push_back(static_cast<int32_t>(chunks.size()));
    max_layer_chunks = std::max<int64_t>(max_layer_chunks, chunks.size() - layer_first);
  }
  p.chunk_count = state->layer_chunks[1];

  arrays.Upload(&p.pages, b.pages, b.page_offsets[lists]);
  arrays.Upload(&p.chunks, chunks.data(), chunks.size());
  arrays.Upload(&p.chunk_offsets, chunk_offsets.data(), chunk_offsets.size());
  arrays.Upload(&p.key_offsets, key_offsets.data(), key_offsets.size());
  arrays.Upload(&p.slot_offsets, slot_offsets.data(), slot_offsets.size());
  arrays.Upload(&p.recent_offsets, b.recent_offsets, b.batch + 1);
  arrays.Upload(&p.recent_k, b.recent_k, layers * b.batch);
  arrays.Upload(&p.recent_v, b.recent_v, layers * b.batch);
  arrays.Scratch(&p.part_m, max_layer_chunks * rows);
  arrays.Scratch(&p.part_l, max_layer_chunks * rows);
  arrays.Scratch(&p.part_acc, max_layer_chunks * rows * d);
  arrays.Scratch(&p.row_m, bh_count * rows);
  arrays.Scratch(&p.row_l, bh_count * rows);
  const bool score_offsets = b.page_score_offsets != nullptr && b.recent_score_offsets != nullptr;
  if ((b.batch == 1 && layers == 1) || score_offsets) {
    state->scores = true;
    arrays.Scratch(&p.logits, max_layer_keys * rows);
    if (score_offsets) {
      arrays.Upload(&p.page_score_offsets, b.page_score_offsets, layers * b.batch);
      arrays.Upload(&p.recent_score_offsets, b.recent_score_offsets, layers * b.batch);
    }
  }
  if (workspace == nullptr) {
    // The plan's own memory; the staging vector goes out of scope, so wait for the copy.
    SLUICE_ASSIGN_OR_RETURN(state->owned, DeviceArray<uint8_t>::Create(arrays.bytes()));
    std::vector<uint8_t> staging(arrays.upload_bytes());
    arrays.Place(state->owned.data(), staging.data());
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(state->owned.data(), staging.data(), staging.size(),
                                                cudaMemcpyHostToDevice, stream));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  } else {
    DecodeAttentionWorkspace::State& w = *workspace->state_;
    // The staging memory is reused: the previous plan's copy out of it must be done. It was
    // queued before that plan's kernels, so this waits for a copy, not for attention.
    if (w.copy_pending) {
      SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(w.copied.get()));
      w.copy_pending = false;
    }
    if (w.copied.get() == nullptr) {
      SLUICE_ASSIGN_OR_RETURN(w.copied, CudaEvent::Create());
    }
    // Growing frees the old device block with cudaFree, which waits for the device.
    SLUICE_RETURN_IF_ERROR(w.device.Reserve(arrays.bytes()));
    SLUICE_RETURN_IF_ERROR(w.staging.Reserve(std::max<int64_t>(1, arrays.upload_bytes())));
    arrays.Place(w.device.data(), w.staging.data());
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        w.device.data(), w.staging.data(), arrays.upload_bytes(), cudaMemcpyHostToDevice, stream));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(w.copied.get(), stream));
    w.copy_pending = true;
  }
  return DecodeAttentionPlan(std::move(state));
}

absl::Status DecodeAttentionPlan::Run(const float* q, float* out, cudaStream_t stream,
                                      float* page_scores, float* recent_scores,
                                      bool scores_per_head, int64_t layer) const {
  const State& st = *state_;
  if (layer < 0 || layer >= st.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("decode attention: layer %d of a %d-layer plan", layer, st.layers));
  }
  DecodeKernelParams p = st.params;
  const int64_t lists = int64_t{p.bh_count} + 1;
  p.chunks += st.layer_chunks[layer];
  p.chunk_count = st.layer_chunks[layer + 1] - st.layer_chunks[layer];
  p.chunk_offsets += layer * lists;
  p.key_offsets += layer * lists;
  p.slot_offsets += layer * lists;
  p.recent_k += layer * st.batch;
  p.recent_v += layer * st.batch;
  if (p.page_score_offsets != nullptr) {
    p.page_score_offsets += layer * st.batch;
    p.recent_score_offsets += layer * st.batch;
  }
  for (int t = 0; t < p.tier_count; ++t) {
    const State::Tables& tables = st.tables[layer * p.tier_count + t];
    p.tiers[t].k_table = tables.k;
    p.tiers[t].v_table = tables.v;
    p.tiers[t].k_table_bits = tables.k_bits;
    p.tiers[t].v_table_bits = tables.v_bits;
  }
  p.q = q;
  p.out = out;
  const bool scores = page_scores != nullptr || recent_scores != nullptr;
  if (scores && (page_scores == nullptr || recent_scores == nullptr)) {
    return absl::InvalidArgumentError(
        "decode attention: key scores need both page_scores and recent_scores");
  }
  if (scores && !state_->scores) {
    return absl::InvalidArgumentError(
        "decode attention: key scores asked of a plan made without score offsets");
  }
  if (!scores) p.logits = nullptr;
  p.page_scores = page_scores;
  p.recent_scores = recent_scores;
  p.scores_per_head = scores_per_head;
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchDecodeAttention(p, state_->kernel, stream));
  if (scores) {
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchDecodeScores(p, state_->max_keys, stream));
  }
  return absl::OkStatus();
}

namespace {

// A batch's sequences (one layer) as DecodeBatch arrays, appended: every list's pages, the list
// offsets, and each sequence's window.
struct FlatLayer {
  std::vector<KvPageRef> pages;
  std::vector<int32_t> page_offsets = {0};
  std::vector<int64_t> recent_offsets = {0};
  std::vector<const float*> recent_k, recent_v;

  void Append(absl::Span<const PagedAttentionParams> sequences) {
    recent_offsets.resize(1);
    for (const PagedAttentionParams& s : sequences) {
      recent_k.push_back(s.recent_k);
      recent_v.push_back(s.recent_v);
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        pages.insert(pages.end(), s.pages + s.page_offsets[h], s.pages + s.page_offsets[h + 1]);
        page_offsets.push_back(static_cast<int32_t>(pages.size()));
      }
      recent_offsets.push_back(recent_offsets.back() + s.recent_tokens);
    }
  }
};

// The DecodeBatch of `flat`: `batch` sequences over `layers` layers shaped like `shape` (one of
// them), with `codebooks` ([layers * tier_count]).
DecodeBatch BatchOf(const PagedAttentionParams& shape, int64_t batch, int64_t layers,
                    const KvCodebooks* codebooks, const FlatLayer& flat) {
  return {.layers = layers,
          .batch = batch,
          .q_tokens = shape.q_tokens,
          .heads = shape.heads,
          .kv_heads = shape.kv_heads,
          .head_dim = shape.head_dim,
          .scale = shape.scale,
          .formats = shape.formats,
          .layouts = shape.layouts,
          .codebooks = codebooks,
          .tier_count = shape.tier_count,
          .pages = flat.pages.data(),
          .page_offsets = flat.page_offsets.data(),
          .recent_offsets = flat.recent_offsets.data(),
          .recent_k = flat.recent_k.data(),
          .recent_v = flat.recent_v.data()};
}

}  // namespace

absl::Status PagedAttention(const PagedAttentionParams& p, cudaStream_t stream,
                            DecodeAttentionWorkspace* workspace) {
  FlatLayer flat;
  flat.Append({&p, 1});
  SLUICE_ASSIGN_OR_RETURN(
      DecodeAttentionPlan plan,
      DecodeAttentionPlan::Create(BatchOf(p, 1, 1, p.codebooks, flat), stream, workspace));
  SLUICE_RETURN_IF_ERROR(
      plan.Run(p.q, p.out, stream, p.page_scores, p.recent_scores, p.scores_per_head));
  // Without a workspace the plan's device memory goes with it: let the kernels finish first.
  if (workspace == nullptr) SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

bool RunsAsOnePlan(const BatchPagedAttentionParams& p,
                   absl::Span<const PagedAttentionParams> sequences) {
  if (sequences.empty() || sequences.front().q_tokens == 0) return false;
  // Scores need each sequence's place in the score arrays.
  if (p.page_scores.data != nullptr &&
      (p.page_score_offsets == nullptr || p.recent_score_offsets == nullptr)) {
    return false;
  }
  for (const PagedAttentionParams& s : sequences) {
    if (s.q_tokens != sequences.front().q_tokens) return false;
  }
  return true;
}

absl::Status BatchPagedAttention(const BatchPagedAttentionParams& p,
                                 absl::Span<const PagedAttentionParams> sequences,
                                 cudaStream_t stream, DecodeAttentionWorkspace* workspace) {
  if (!RunsAsOnePlan(p, sequences)) {
    return absl::InvalidArgumentError(
        "decode attention: one plan takes sequences with the same queries (and, with key "
        "scores, each sequence's score offsets)");
  }
  // One page list for the batch: sequence b's lists after those of the sequences before it.
  FlatLayer flat;
  flat.Append(sequences);
  DecodeBatch batch = BatchOf(sequences.front(), p.batch, 1, p.codebooks, flat);
  const bool scores = p.page_scores.data != nullptr;
  if (scores) {
    batch.page_score_offsets = p.page_score_offsets;
    batch.recent_score_offsets = p.recent_score_offsets;
  }
  SLUICE_ASSIGN_OR_RETURN(DecodeAttentionPlan plan,
                          DecodeAttentionPlan::Create(batch, stream, workspace));
  // Sequence b's queries are rows [b * q_tokens, (b + 1) * q_tokens): q and out as they are.
  SLUICE_RETURN_IF_ERROR(plan.Run(p.q.data, p.out.data, stream,
                                  scores ? p.page_scores.data : nullptr,
                                  scores ? p.recent_scores.data : nullptr, p.scores_per_head));
  if (workspace == nullptr) SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> DecodeStepPlan::Create(
    const void* backend, const BatchPagedAttentionStep& step,
    absl::Span<const std::vector<PagedAttentionParams>> layers, cudaStream_t stream,
    DecodeAttentionWorkspace* workspace) {
  if (layers.empty()) return nullptr;
  // Scores need every (layer, sequence)'s offsets now.
  if (step.scores && (step.page_score_offsets == nullptr || step.recent_score_offsets == nullptr)) {
    return nullptr;
  }
  for (const std::vector<PagedAttentionParams>& sequences : layers) {
    if (!RunsAsOnePlan(step.batch, sequences) ||
        sequences.front().q_tokens != layers.front().front().q_tokens) {
      return nullptr;
    }
  }
  FlatLayer flat;
  std::vector<int64_t> first_offsets;
  for (const std::vector<PagedAttentionParams>& sequences : layers) {
    flat.Append(sequences);
    if (first_offsets.empty()) first_offsets = flat.recent_offsets;
    // One window length per sequence in every layer (a decode step's).
    if (flat.recent_offsets != first_offsets) return nullptr;
  }
  const int64_t q_tokens = layers.front().front().q_tokens;
  const int64_t n_layers = static_cast<int64_t>(layers.size());
  DecodeBatch batch =
      BatchOf(layers.front().front(), step.batch.batch, n_layers, step.batch.codebooks, flat);
  if (step.scores) {
    batch.page_score_offsets = step.page_score_offsets;
    batch.recent_score_offsets = step.recent_score_offsets;
  }
  SLUICE_ASSIGN_OR_RETURN(DecodeAttentionPlan plan,
                          DecodeAttentionPlan::Create(batch, stream, workspace));
  auto out = std::unique_ptr<DecodeStepPlan>(new DecodeStepPlan(backend, std::move(plan)));
  if (step.scores) {
    const int64_t n = n_layers * step.batch.batch;
    out->page_score_offsets_.assign(step.page_score_offsets, step.page_score_offsets + n);
    out->recent_score_offsets_.assign(step.recent_score_offsets, step.recent_score_offsets + n);
  }
  out->batch_ = step.batch.batch;
  out->kv_heads_ = step.batch.kv_heads;
  out->q_tokens_ = q_tokens;
  out->pages_ = std::move(flat.pages);
  out->page_offsets_ = std::move(flat.page_offsets);
  out->recent_offsets_ = std::move(flat.recent_offsets);
  out->recent_k_ = std::move(flat.recent_k);
  out->recent_v_ = std::move(flat.recent_v);
  return out;
}

absl::Status DecodeStepPlan::Run(const BatchPagedAttentionParams& p,
                                 absl::Span<const PagedAttentionParams> sequences,
                                 cudaStream_t stream) const {
  const int64_t layer = p.layer, lists = batch_ * kv_heads_;
  if (layer < 0 || layer >= plan_.layers() || p.batch != batch_ || p.kv_heads != kv_heads_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch_paged_attention: layer %d (batch %d, %d kv-heads) is not a layer of the step's "
        "plan (%d layers, batch %d, %d kv-heads)",
        layer, p.batch, p.kv_heads, plan_.layers(), batch_, kv_heads_));
  }
  const bool scores = p.page_scores.data != nullptr;
  if (scores && page_score_offsets_.empty()) {
    return absl::InvalidArgumentError(
        "batch_paged_attention: key scores asked of a step planned without them");
  }
  for (int64_t b = 0; scores && b < batch_; ++b) {
    if (p.page_score_offsets == nullptr || p.recent_score_offsets == nullptr ||
        p.page_score_offsets[b] != page_score_offsets_[layer * batch_ + b] ||
        p.recent_score_offsets[b] != recent_score_offsets_[layer * batch_ + b]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch_paged_attention: sequence %d of layer %d puts its key scores elsewhere than the "
          "step's plan",
          b, layer));
    }
  }
  // The call must be the layer the plan holds: same queries, windows and pages, in order.
  int32_t at = page_offsets_[layer * lists];
  for (int64_t b = 0; b < batch_; ++b) {
    const PagedAttentionParams& s = sequences[b];
    bool same = s.q_tokens == q_tokens_ && s.recent_k == recent_k_[layer * batch_ + b] &&
                s.recent_v == recent_v_[layer * batch_ + b] &&
                s.recent_tokens == recent_offsets_[b + 1] - recent_offsets_[b];
    for (int64_t h = 0; same && h < kv_heads_; ++h) {
      const int64_t list = layer * lists + b * kv_heads_ + h;
      const int32_t n = s.page_offsets[h + 1] - s.page_offsets[h];
      same = n == page_offsets_[list + 1] - page_offsets_[list];
      for (int32_t i = 0; same && i < n; ++i) {
        const KvPageRef& want = pages_[at + i];
        const KvPageRef& got = s.pages[s.page_offsets[h] + i];
        same = got.data == want.data && got.slots == want.slots && got.tier == want.tier;
      }
      at += n;
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch_paged_attention: sequence %d of layer %d differs from the step's plan (its "
          "pages, window or queries changed since PlanBatchPagedAttention)",
          b, layer));
    }
  }
  return plan_.Run(p.q.data, p.out.data, stream, scores ? p.page_scores.data : nullptr,
                   scores ? p.recent_scores.data : nullptr, p.scores_per_head, layer);
}

}  // namespace sluice::kernels::cuda
