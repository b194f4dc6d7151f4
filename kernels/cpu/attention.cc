#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {
namespace {

void AttentionBlas(const AttentionParams& p, const VecOps& ops, int threads) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t kv = p.q_start + p.q_tokens;  // keys any query of the chunk can see
  const int64_t q_ld = p.heads * p.head_dim, kv_ld = p.kv_heads * p.head_dim;
  UseSingleThreadedBlas();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<float> s(p.q_tokens * kv);
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t kvh = h / group;
      // s [q_tokens, kv] = scale * q_h [q_tokens, head_dim] . k_kvh^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.q_tokens, kv, p.head_dim, p.scale,
                  p.q + h * p.head_dim, q_ld, p.k + kvh * p.head_dim, kv_ld, 0.f, s.data(), kv);
      // Causal softmax: query t sees keys [0, q_start + t].
      for (int64_t t = 0; t < p.q_tokens; ++t) {
        float* row = s.data() + t * kv;
        const int64_t visible = p.q_start + t + 1;
        const float mx = *std::max_element(row, row + visible);
        ops.exp(row, mx, row, visible);
        float sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += row[j];
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
        std::fill(row + visible, row + kv, 0.f);
      }
      // out_h [q_tokens, head_dim] = s . v_kvh [kv, head_dim]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p.q_tokens, p.head_dim, kv, 1.f,
                  s.data(), kv, p.v + kvh * p.head_dim, kv_ld, 0.f, p.out + h * p.head_dim, q_ld);
    }
  }
}

}  // namespace

void Attention(const AttentionParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  // Each head's scores and outputs are two SGEMMs over the chunk's queries (one query when
  // decoding); the per-(token, head) loops below stay as the plain-C++ scalar baseline.
  if (isa != Isa::kScalar) return AttentionBlas(p, ops, threads);
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
