#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace sluice::kernels::ref {

void Attention(const AttentionParams& p) {
  const int64_t group = p.heads / p.kv_heads;
  std::vector<double> score(p.kv_tokens);
  for (int64_t t = 0; t < p.q_tokens; ++t) {
    const int64_t visible = p.q_start + t + 1;
    for (int64_t h = 0; h < p.heads; ++h) {
      const float* q = p.q + (t * p.heads + h) * p.head_dim;
      const int64_t kvh = h / group;
      double mx = -INFINITY;
      for (int64_t s = 0; s < visible; ++s) {
        const float* k = p.k + (s * p.kv_heads + kvh) * p.head_dim;
        double dot = 0;
        for (int64_t d = 0; d < p.head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        score[s] = dot * p.scale;
        mx = std::max(mx, score[s]);
      }
      double sum = 0;
      for (int64_t s = 0; s < visible; ++s) sum += (score[s] = std::exp(score[s] - mx));
      if (p.key_scores != nullptr) {
        for (int64_t s = 0; s < visible; ++s) {
          p.key_scores[h * p.kv_tokens + s] += static_cast<float>(score[s] / sum);
        }
      }
      float* out = p.out + (t * p.heads + h) * p.head_dim;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        double acc = 0;
        for (int64_t s = 0; s < visible; ++s) {
          acc += score[s] * p.v[(s * p.kv_heads + kvh) * p.head_dim + d];
        }
        out[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace sluice::kernels::ref
