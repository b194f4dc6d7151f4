#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

void Attention(const AttentionParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  const int64_t group = p.heads / p.kv_heads;
  const int64_t tasks = p.q_tokens * p.heads;
  const bool parallel = threads > 1 && tasks > 1 && tasks * p.kv_tokens * p.head_dim >= (1 << 15);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> score(p.kv_tokens);
    std::vector<float> acc(p.head_dim);
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t t = task / p.heads, h = task % p.heads, kvh = h / group;
      const int64_t visible = p.q_start + t + 1;
      const float* q = p.q + (t * p.heads + h) * p.head_dim;
      float mx = -INFINITY;
      for (int64_t s = 0; s < visible; ++s) {
        score[s] = ops.dot(q, p.k + (s * p.kv_heads + kvh) * p.head_dim, p.head_dim) * p.scale;
        mx = std::max(mx, score[s]);
      }
      float sum = 0;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s = 0; s < visible; ++s) {
        const float w = std::exp(score[s] - mx);
        sum += w;
        const float* v = p.v + (s * p.kv_heads + kvh) * p.head_dim;
        for (int64_t d = 0; d < p.head_dim; ++d) acc[d] += w * v[d];
      }
      float* out = p.out + (t * p.heads + h) * p.head_dim;
      const float inv = 1.f / sum;
      for (int64_t d = 0; d < p.head_dim; ++d) out[d] = acc[d] * inv;
    }
  }
}

}  // namespace sluice::kernels::cpu
