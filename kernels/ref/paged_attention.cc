#include "kernels/ref/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ref/kv_quant.h"

namespace sluice::kernels::ref {

absl::Status PagedAttention(const PagedAttentionParams& p) {
  const int64_t d = p.head_dim, group = p.heads / p.kv_heads;
  int64_t total_slots = 0;
  for (int32_t i = 0; i < p.page_offsets[p.kv_heads]; ++i) total_slots += p.pages[i].slots;
  for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
    // The live paged tokens of this head, dequantized, and the index of each in page_scores.
    std::vector<float> k, v;
    std::vector<int64_t> origin;
    int64_t slot_base = 0;
    for (int32_t i = 0; i < p.page_offsets[kvh]; ++i) slot_base += p.pages[i].slots;
    for (int32_t i = p.page_offsets[kvh]; i < p.page_offsets[kvh + 1]; ++i) {
      const KvPageRef& page = p.pages[i];
      const KvPageLayout& l = p.layouts[page.tier];
      std::vector<float> pk(page.slots * d), pv(page.slots * d);
      KvDequantizeParams dq{.page = HostView(page.data, p.formats[page.tier].page_bytes),
                            .format = p.formats[page.tier],
                            .layout = l,
                            .slot = 0,
                            .tokens = page.slots,
                            .k = HostView(pk),
                            .v = HostView(pv)};
      if (p.codebooks != nullptr) dq.codebooks = p.codebooks[page.tier];
      if (absl::Status st = KvDequantizeAny(dq); !st.ok()) return st;
      const uint64_t* valid = reinterpret_cast<const uint64_t*>(page.data + l.valid);
      for (int32_t s = 0; s < page.slots; ++s) {
        if (!((valid[s / 64] >> (s % 64)) & 1)) continue;
        k.insert(k.end(), pk.begin() + s * d, pk.begin() + (s + 1) * d);
        v.insert(v.end(), pv.begin() + s * d, pv.begin() + (s + 1) * d);
        origin.push_back(slot_base + s);
      }
      slot_base += page.slots;
    }
    const int64_t paged = static_cast<int64_t>(k.size()) / d;
    for (int64_t r = 0; r < p.recent_tokens; ++r) {
      const float* rk = p.recent_k + (r * p.kv_heads + kvh) * d;
      const float* rv = p.recent_v + (r * p.kv_heads + kvh) * d;
      k.insert(k.end(), rk, rk + d);
      v.insert(v.end(), rv, rv + d);
    }
    for (int64_t t = 0; t < p.q_tokens; ++t) {
      const int64_t visible = paged + p.recent_tokens - p.q_tokens + t + 1;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* q = p.q + (t * p.heads + h) * d;
        std::vector<double> s(visible);
        double mx = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double{q[c]} * k[j * d + c];
          s[j] = dot * p.scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        if (p.page_scores != nullptr) {
          // Rows of the score arrays this query head adds to.
          float* ps = p.page_scores + (p.scores_per_head ? (h % group) * total_slots : 0);
          float* rs = p.recent_scores + (p.scores_per_head ? h : kvh) * p.recent_tokens;
          for (int64_t j = 0; j < visible; ++j) {
            const float w = static_cast<float>(s[j] / sum);
            if (j < paged) {
              ps[origin[j]] += w;
            } else {
              rs[j - paged] += w;
            }
          }
        }
        float* out = p.out + (t * p.heads + h) * d;
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < visible; ++j) acc += s[j] * v[j * d + c];
          out[c] = static_cast<float>(acc / sum);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels::ref
