#include "kernels/cpu/paged_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/vec.h"
#include "kernels/ggml_quant.h"
#include "kernels/kv_format.h"
#include "kernels/kv_huffman.h"

namespace sluice::kernels::cpu {
namespace {

using ExpFn = void (*)(const float* x, float shift, float* y, int64_t n);

constexpr int kMaxGroup = static_cast<int>(kPagedAttentionMaxGroup);

struct Partial {
  float m;     // running max of scores
  float l;     // sum of exp(score - m)
  float* acc;  // [head_dim] sum of exp(score - m) * v
};

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own `_mm512_undefined_*`
// placeholders once inlined here; the warning is about the headers, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SLUICE_PA_NS pa_scalar
#define SLUICE_PA_LEVEL 0
#include "kernels/cpu/paged_attention_impl.inc"
#undef SLUICE_PA_NS
#undef SLUICE_PA_LEVEL

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SLUICE_PA_NS pa_avx2
#define SLUICE_PA_LEVEL 1
#include "kernels/cpu/paged_attention_impl.inc"
#undef SLUICE_PA_NS
#undef SLUICE_PA_LEVEL
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#define SLUICE_PA_NS pa_avx512
#define SLUICE_PA_LEVEL 2
#include "kernels/cpu/paged_attention_impl.inc"
#undef SLUICE_PA_NS
#undef SLUICE_PA_LEVEL
#pragma GCC pop_options
#pragma GCC diagnostic pop

using AttendFn = void (*)(const PagedAttentionParams&, const KvHuffmanTier*, uint8_t*, int64_t,
                          int64_t, int32_t, int32_t, const float*, ExpFn, float*, Partial*,
                          const int64_t*, float*, int64_t);
using DecodeRowFn = void (*)(const KvQuantSpec&, int, int, const uint8_t*, int32_t, int32_t,
                             int32_t, int64_t, int32_t, const float*, float*);

AttendFn AttendFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return pa_avx512::AttendPages;
    case Isa::kAvx2:
      return pa_avx2::AttendPages;
    default:
      return pa_scalar::AttendPages;
  }
}

DecodeRowFn DecodeRowFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return pa_avx512::DecodeRow;
    case Isa::kAvx2:
      return pa_avx2::DecodeRow;
    default:
      return pa_scalar::DecodeRow;
  }
}

const float* Fp8Lut() {
  static const std::vector<float> lut = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(i));
    return t;
  }();
  return lut.data();
}

// Queries up to this many take the fused path; longer runs gather and use dense attention.
constexpr int64_t kMaxFusedQueries = 4;
// Pages of one kv-head a task of the fused path attends to (the last run of a head may be
// shorter): a few tasks per thread for one long sequence, few partials to merge for short ones.
constexpr int64_t kPagesPerTask = 8;

// The unit layouts of the Huffman-coded tiers (entries of other tiers stay default), and the
// largest unit page among them.
std::vector<KvHuffmanTier> HuffmanTiers(const PagedAttentionParams& p, int32_t* max_unit_bytes) {
  std::vector<KvHuffmanTier> tiers(p.tier_count);
  *max_unit_bytes = 8;
  for (int32_t t = 0; t < p.tier_count; ++t) {
    if (p.formats[t].huffman_bits == 0.f) continue;
    tiers[t] = MakeKvHuffmanTier(p.formats[t]).value();  // the layout was validated
    *max_unit_bytes = std::max(*max_unit_bytes, tiers[t].unit_layout.bytes_used);
  }
  return tiers;
}

// Appends the live tokens of page `r` to k and v, decoded to fp32.
// origin: each gathered token's index in page_scores (`first_slot` is the page's first).
void GatherPage(const PagedAttentionParams& p, const KvPageRef& r, const KvHuffmanTier& huffman,
                DecodeRowFn decode, int64_t first_slot, std::vector<uint8_t>& unit,
                std::vector<float>& k, std::vector<float>& v, std::vector<int64_t>& origin) {
  const int d = static_cast<int>(p.head_dim);
  auto gather = [&](const KvTierFormat& f, const KvPageLayout& l, const uint8_t* data, int n,
                    int64_t base) {
    const uint64_t* valid = reinterpret_cast<const uint64_t*>(data + l.valid);
    for (int32_t s = 0; s < n; ++s) {
      if (!((valid[s / 64] >> (s % 64)) & 1)) continue;
      origin.push_back(base + s);
      const size_t at = k.size();
      k.resize(at + d);
      v.resize(at + d);
      decode(f.k, d, l.k_tile, data, l.k_codes, l.k_row_bytes, l.k_meta, s, l.tokens, Fp8Lut(),
             k.data() + at);
      decode(f.v, d, 1, data, l.v_codes, l.v_row_bytes, l.v_meta, s, l.tokens, Fp8Lut(),
             v.data() + at);
    }
  };
  const KvTierFormat& f = p.formats[r.tier];
  if (f.huffman_bits == 0.f) return gather(f, p.layouts[r.tier], r.data, r.slots, first_slot);
  const int u = huffman.layout.unit_tokens;
  unit.resize(huffman.unit_layout.bytes_used);
  for (int first = 0; first < r.slots; first += u) {
    KvDecodeUnit(huffman, p.codebooks[r.tier], r.data, first / u, unit.data());
    gather(huffman.unit_format, huffman.unit_layout, unit.data(), std::min(u, r.slots - first),
           first_slot + first);
  }
}

void DenseOverGathered(const PagedAttentionParams& p, Isa isa, int threads) {
  const int64_t d = p.head_dim, kvh_count = p.kv_heads;
  const DecodeRowFn decode = DecodeRowFor(isa);
  int32_t max_unit_bytes;
  const std::vector<KvHuffmanTier> huffman = HuffmanTiers(p, &max_unit_bytes);
  std::vector<uint8_t> unit;
  // Each kv-head holds its own number of live tokens; each runs as its own dense call.
  std::vector<std::vector<float>> k(kvh_count), v(kvh_count);
  std::vector<std::vector<int64_t>> origin(kvh_count);
  int64_t first_slot = 0;
  for (int64_t h = 0; h < kvh_count; ++h) {
    for (int32_t i = p.page_offsets[h]; i < p.page_offsets[h + 1]; ++i) {
      GatherPage(p, p.pages[i], huffman[p.pages[i].tier], decode, first_slot, unit, k[h], v[h],
                 origin[h]);
      first_slot += p.pages[i].slots;
    }
  }
  const int64_t total_slots = first_slot;
  const int64_t g = p.heads / p.kv_heads;
  std::vector<float> q(p.q_tokens * g * d), out(p.q_tokens * g * d), key_scores;
  for (int64_t h = 0; h < kvh_count; ++h) {
    const int64_t paged = static_cast<int64_t>(k[h].size()) / d;
    if (p.page_scores != nullptr) key_scores.assign(g * (paged + p.recent_tokens), 0.f);
    const int64_t kv_tokens = paged + p.recent_tokens;
    k[h].resize(kv_tokens * d);
    v[h].resize(kv_tokens * d);
    for (int64_t r = 0; r < p.recent_tokens; ++r) {
      std::memcpy(k[h].data() + (paged + r) * d, p.recent_k + (r * kvh_count + h) * d, d * 4);
      std::memcpy(v[h].data() + (paged + r) * d, p.recent_v + (r * kvh_count + h) * d, d * 4);
    }
    for (int64_t t = 0; t < p.q_tokens; ++t) {
      std::memcpy(q.data() + t * g * d, p.q + (t * p.heads + h * g) * d, g * d * 4);
    }
    Attention({.q = q.data(),
               .k = k[h].data(),
               .v = v[h].data(),
               .out = out.data(),
               .q_tokens = p.q_tokens,
               .kv_tokens = kv_tokens,
               .q_start = kv_tokens - p.q_tokens,
               .heads = g,
               .kv_heads = 1,
               .head_dim = d,
               .scale = p.scale,
               .key_scores = p.page_scores != nullptr ? key_scores.data() : nullptr},
              isa, threads);
    for (int64_t t = 0; t < p.q_tokens; ++t) {
      std::memcpy(p.out + (t * p.heads + h * g) * d, out.data() + t * g * d, g * d * 4);
    }
    if (p.page_scores == nullptr) continue;
    for (int64_t hi = 0; hi < g; ++hi) {
      const float* ks = key_scores.data() + hi * kv_tokens;
      float* ps = p.page_scores + (p.scores_per_head ? hi * total_slots : 0);
      float* rs = p.recent_scores + (p.scores_per_head ? h * g + hi : h) * p.recent_tokens;
      for (int64_t j = 0; j < paged; ++j) ps[origin[h][j]] += ks[j];
      for (int64_t r = 0; r < p.recent_tokens; ++r) rs[r] += ks[paged + r];
    }
  }
}

}  // namespace

void PagedAttention(absl::Span<const PagedAttentionParams> batch, Isa isa, int threads) {
  // Sequences with many queries (a prompt continuing after compressed tokens, or a fresh one)
  // run one after the other, each across the threads; the decoding ones share one task pool.
  std::vector<const PagedAttentionParams*> seqs;
  for (const PagedAttentionParams& p : batch) {
    if (p.q_tokens == 0) continue;
    const bool no_pages = p.page_offsets[p.kv_heads] == 0;
    if (no_pages && p.q_tokens > kMaxFusedQueries && p.page_scores == nullptr) {
      // Prefill of a fresh sequence: everything is full precision.
      Attention({.q = p.q,
                 .k = p.recent_k,
                 .v = p.recent_v,
                 .out = p.out,
                 .q_tokens = p.q_tokens,
                 .kv_tokens = p.recent_tokens,
                 .q_start = p.recent_tokens - p.q_tokens,
                 .heads = p.heads,
                 .kv_heads = p.kv_heads,
                 .head_dim = p.head_dim,
                 .scale = p.scale},
                isa, threads);
    } else if (p.q_tokens > kMaxFusedQueries) {
      DenseOverGathered(p, isa, threads);
    } else {
      seqs.push_back(&p);
    }
  }
  if (seqs.empty()) return;

  const VecOps& ops = GetVecOps(isa);
  const AttendFn attend = AttendFor(isa);
  // What each sequence's tasks share: its tiers' unit layouts, each page's first slot in its
  // page_scores, and (with key scores) every (query, head)'s logits.
  struct SeqWork {
    std::vector<KvHuffmanTier> huffman;
    std::vector<int64_t> slot_offsets;
    std::vector<float> logits;
    int64_t merge_begin = 0;  // its (query, head) merges start here in the batch's
  };
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());
  std::vector<SeqWork> work(n_seqs);
  int32_t max_slots = 1, max_unit_bytes = 8;
  int64_t merges = 0, recent_work = 0;
  for (int64_t si = 0; si < n_seqs; ++si) {
    const PagedAttentionParams& p = *seqs[si];
    SeqWork& w = work[si];
    for (int32_t t = 0; t < p.tier_count; ++t) max_slots = std::max(max_slots, p.layouts[t].tokens);
    int32_t unit_bytes;
    w.huffman = HuffmanTiers(p, &unit_bytes);
    max_unit_bytes = std::max(max_unit_bytes, unit_bytes);
    const int32_t page_count = p.page_offsets[p.kv_heads];
    w.slot_offsets.assign(page_count + 1, 0);
    for (int32_t i = 0; i < page_count; ++i) {
      w.slot_offsets[i + 1] = w.slot_offsets[i] + p.pages[i].slots;
    }
    if (p.page_scores != nullptr) w.logits.resize(p.q_tokens * p.heads * w.slot_offsets.back());
    w.merge_begin = merges;
    merges += p.q_tokens * p.heads;
    recent_work += p.q_tokens * p.heads * p.recent_tokens;
  }
  const int64_t max_g = [&] {
    int64_t g = 1;
    for (const PagedAttentionParams* p : seqs) g = std::max(g, p->heads / p->kv_heads);
    return g;
  }();

  // Tasks: (sequence, query, kv-head, run of kPagesPerTask pages), in that order. The runs are
  // cut by the sequence alone, never by the batch or the threads, and merged in their order,
  // so a sequence's output is the same bits whatever else the batch holds. Task group
  // (sequence, query, kv-head) k owns tasks [group_tasks[k], group_tasks[k + 1]).
  struct Task {
    int32_t seq;
    int64_t t, kvh;
    int32_t begin, end;
  };
  std::vector<Task> tasks;
  std::vector<int64_t> group_tasks = {0};
  const int64_t run = kPagesPerTask;
  for (int32_t si = 0; si < n_seqs; ++si) {
    const PagedAttentionParams& p = *seqs[si];
    for (int64_t t = 0; t < p.q_tokens; ++t) {
      for (int64_t h = 0; h < p.kv_heads; ++h) {
        for (int32_t b = p.page_offsets[h]; b < p.page_offsets[h + 1]; b += run) {
          tasks.push_back(
              {si, t, h, b,
               static_cast<int32_t>(std::min<int64_t>(b + run, p.page_offsets[h + 1]))});
        }
        group_tasks.push_back(static_cast<int64_t>(tasks.size()));
      }
    }
  }
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int d_max = [&] {
    int64_t d = 0;
    for (const PagedAttentionParams* p : seqs) d = std::max(d, p->head_dim);
    return static_cast<int>(d);
  }();
  // Task i's partials: max_g slots of head_dim floats from parts[i * max_g].
  std::vector<float> acc_store(n_tasks * max_g * d_max);
  std::vector<Partial> parts(n_tasks * max_g);
  for (int64_t i = 0; i < n_tasks * max_g; ++i) parts[i].acc = acc_store.data() + i * d_max;
#pragma omp parallel num_threads(threads) if (threads > 1 && n_tasks > 1)
  {
    std::vector<float> scratch(static_cast<size_t>(max_slots) * max_g * (1 + d_max));
    std::vector<uint8_t> unit(max_unit_bytes);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tasks; ++i) {
      const Task& task = tasks[i];
      const PagedAttentionParams& p = *seqs[task.seq];
      SeqWork& w = work[task.seq];
      const int64_t g = p.heads / p.kv_heads, total_slots = w.slot_offsets.back();
      float* task_logits = w.logits.empty()
                               ? nullptr
                               : w.logits.data() + (task.t * p.heads + task.kvh * g) * total_slots;
      attend(p, w.huffman.data(), unit.data(), task.kvh, task.t, task.begin, task.end, Fp8Lut(),
             ops.exp, scratch.data(), parts.data() + i * max_g, w.slot_offsets.data(), task_logits,
             total_slots);
    }
  }

  // Merge the page partials of each (sequence, query, head) with its recent full-precision
  // tokens (on the threads once they average more than 64). The merges of sequence si are
  // [work[si].merge_begin, + q_tokens * heads). With key scores: each merge's final max and
  // normalizer, and its recent weights.
  std::vector<int64_t> merge_seq(merges);
  for (int64_t si = 0; si < n_seqs; ++si) {
    const int64_t end = work[si].merge_begin + seqs[si]->q_tokens * seqs[si]->heads;
    std::fill(merge_seq.begin() + work[si].merge_begin, merge_seq.begin() + end, si);
  }
  std::vector<int64_t> recent_at(merges + 1, 0);  // merge mi's recent weights start here
  for (int64_t mi = 0; mi < merges; ++mi) {
    const PagedAttentionParams& p = *seqs[merge_seq[mi]];
    recent_at[mi + 1] = recent_at[mi] + (p.page_scores != nullptr ? p.recent_tokens : 0);
  }
  std::vector<float> final_m(merges), final_l(merges), recent_w(recent_at.back());
  // Task groups of the sequences before si: sum of q_tokens * kv_heads.
  std::vector<int64_t> group_begin(n_seqs + 1, 0);
  for (int64_t si = 0; si < n_seqs; ++si) {
    group_begin[si + 1] = group_begin[si] + seqs[si]->q_tokens * seqs[si]->kv_heads;
  }
  int64_t max_recent = 1;
  for (const PagedAttentionParams* p : seqs) max_recent = std::max(max_recent, p->recent_tokens);
#pragma omp parallel num_threads(threads) if (threads > 1 && merges > 1 && \
                                              recent_work > merges * 64)
  {
    std::vector<float> s(max_recent);
    std::vector<float> qs(d_max);
#pragma omp for schedule(static)
    for (int64_t mi = 0; mi < merges; ++mi) {
      const int64_t si = merge_seq[mi];
      const PagedAttentionParams& p = *seqs[si];
      const int d = static_cast<int>(p.head_dim);
      const int64_t g = p.heads / p.kv_heads;
      const int64_t local = mi - work[si].merge_begin;
      const int64_t t = local / p.heads, h = local % p.heads, kvh = h / g, hi = h % g;
      const int64_t group = group_begin[si] + t * p.kv_heads + kvh;
      float m = -INFINITY;
      for (int64_t i = group_tasks[group]; i < group_tasks[group + 1]; ++i) {
        m = std::max(m, parts[i * max_g + hi].m);
      }
      const float* q = p.q + (t * p.heads + h) * d;
      const int64_t visible = p.recent_tokens - p.q_tokens + t + 1;
      for (int c = 0; c < d; ++c) qs[c] = q[c] * p.scale;
      for (int64_t r = 0; r < visible; ++r) {
        s[r] = ops.dot(qs.data(), p.recent_k + (r * p.kv_heads + kvh) * d, d);
        m = std::max(m, s[r]);
      }
      float* out = p.out + (t * p.heads + h) * d;
      std::fill(out, out + d, 0.f);
      float l = 0;
      for (int64_t i = group_tasks[group]; i < group_tasks[group + 1]; ++i) {
        const Partial& part = parts[i * max_g + hi];
        if (part.m == -INFINITY) continue;
        const float w = std::exp(part.m - m);
        l += part.l * w;
        for (int c = 0; c < d; ++c) out[c] += w * part.acc[c];
      }
      ops.exp(s.data(), m, s.data(), visible);
      for (int64_t r = 0; r < visible; ++r) {
        l += s[r];
        const float* v = p.recent_v + (r * p.kv_heads + kvh) * d;
        for (int c = 0; c < d; ++c) out[c] += s[r] * v[c];
      }
      const float inv = 1.f / l;
      for (int c = 0; c < d; ++c) out[c] *= inv;
      final_m[mi] = m;
      final_l[mi] = l;
      if (p.page_scores != nullptr) {
        for (int64_t r = 0; r < visible; ++r) recent_w[recent_at[mi] + r] = s[r] * inv;
      }
    }
  }
  // Key scores: each (sequence, kv-head)'s keys on one thread, weight = exp(logit - m) / l,
  // summed over the queries and the head's query heads. Dead slots hold -inf logits and get 0.
  std::vector<std::pair<int64_t, int64_t>> score_items;
  for (int64_t si = 0; si < n_seqs; ++si) {
    if (seqs[si]->page_scores == nullptr) continue;
    for (int64_t kvh = 0; kvh < seqs[si]->kv_heads; ++kvh) score_items.emplace_back(si, kvh);
  }
  const int64_t n_items = static_cast<int64_t>(score_items.size());
#pragma omp parallel for num_threads(threads) if (threads > 1 && n_items > 1)
  for (int64_t item = 0; item < n_items; ++item) {
    const auto [si, kvh] = score_items[item];
    const PagedAttentionParams& p = *seqs[si];
    const SeqWork& w = work[si];
    const int64_t g = p.heads / p.kv_heads, total_slots = w.slot_offsets.back();
    const int64_t s0 = w.slot_offsets[p.page_offsets[kvh]],
                  s1 = w.slot_offsets[p.page_offsets[kvh + 1]];
    for (int64_t t = 0; t < p.q_tokens; ++t) {
      for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
        const int64_t local = t * p.heads + h, mi = w.merge_begin + local;
        const float* lg = w.logits.data() + local * total_slots;
        const float m = final_m[mi], inv = 1.f / final_l[mi];
        float* ps = p.page_scores + (p.scores_per_head ? (h - kvh * g) * total_slots : 0);
        float* rs = p.recent_scores + (p.scores_per_head ? h : kvh) * p.recent_tokens;
        for (int64_t j = s0; j < s1; ++j) ps[j] += std::exp(lg[j] - m) * inv;
        const int64_t visible = p.recent_tokens - p.q_tokens + t + 1;
        for (int64_t r = 0; r < visible; ++r) rs[r] += recent_w[recent_at[mi] + r];
      }
    }
  }
}

void PagedAttention(const PagedAttentionParams& p, Isa isa, int threads) {
  PagedAttention(absl::MakeConstSpan(&p, 1), isa, threads);
}

void KvDequantize(const KvDequantizeParams& p, Isa isa) {
  const DecodeRowFn decode = DecodeRowFor(isa);
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  const int d = f.head_dim;
  for (int64_t t = 0; t < p.tokens; ++t) {
    decode(f.k, d, l.k_tile, p.page.data, l.k_codes, l.k_row_bytes, l.k_meta, p.slot + t, l.tokens,
           Fp8Lut(), p.k.data + t * d);
    decode(f.v, d, 1, p.page.data, l.v_codes, l.v_row_bytes, l.v_meta, p.slot + t, l.tokens,
           Fp8Lut(), p.v.data + t * d);
  }
}

}  // namespace sluice::kernels::cpu
