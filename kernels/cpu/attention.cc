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
  // Queries run in blocks whose scores fit kScoreFloats (16 queries at least), each block over
  // the keys its last query sees.
  constexpr int64_t kScoreFloats = int64_t{1} << 18;  // 1 MiB
  const int64_t q_block = std::max<int64_t>(16, kScoreFloats / std::max<int64_t>(kv, 1));
  UseSingleThreadedBlas();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    // One block's scores. Each thread keeps its buffer across calls (at most kScoreFloats
    // floats, or 16 queries' worth beyond 16k keys) so that a prefill does not map and fault
    // in a fresh one for every layer.
    thread_local std::vector<float> scores;
    const int64_t need = std::min(q_block, p.q_tokens) * kv;
    if (static_cast<int64_t>(scores.size()) < need) scores.resize(need);
    float* const s = scores.data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t q0 = 0; q0 < p.q_tokens; q0 += q_block) {
        const int64_t nq = std::min(q_block, p.q_tokens - q0);
        const int64_t keys = p.q_start + q0 + nq;  // what the block's last query sees
        // s [nq, keys] = scale * q_h [nq, head_dim] . k_kvh[:keys]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, keys, p.head_dim, p.scale,
                    p.q + q0 * q_ld + h * p.head_dim, q_ld, p.k + kvh * p.head_dim, kv_ld, 0.f, s,
                    keys);
        // Causal softmax: query t sees keys [0, q_start + t].
        for (int64_t i = 0; i < nq; ++i) {
          float* row = s + i * keys;
          const int64_t visible = p.q_start + q0 + i + 1;
          const float mx = *std::max_element(row, row + visible);
          ops.exp(row, mx, row, visible);
          float sum = 0;
          for (int64_t j = 0; j < visible; ++j) sum += row[j];
          const float inv = 1.f / sum;
          for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
          std::fill(row + visible, row + keys, 0.f);
        }
        // out_h [nq, head_dim] = s . v_kvh[:keys] [keys, head_dim]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, p.head_dim, keys, 1.f, s, keys,
                    p.v + kvh * p.head_dim, kv_ld, 0.f, p.out + q0 * q_ld + h * p.head_dim, q_ld);
      }
    }
  }
}

// With key scores: two passes over [kQ, kK] tiles per (head, block of queries). The first pass
// finds each query's score maximum and softmax denominator; the second recomputes the scores,
// normalizes them, and accumulates both the output and each key's column sum (MiniKV §3.2).
// Each thread holds one tile and one output block, whatever the sequence length; heads run in
// parallel and each owns its row of key_scores.
void AttentionWithKeyScores(const AttentionParams& p, const VecOps& ops, int threads) {
  constexpr int64_t kQ = 64, kK = 256;
  const int64_t group = p.heads / p.kv_heads, d = p.head_dim;
  const int64_t q_ld = p.heads * d, kv_ld = p.kv_heads * d;
  UseSingleThreadedBlas();
#pragma omp parallel num_threads(threads) if (threads > 1 && p.heads > 1)
  {
    std::vector<float> s(kQ * kK), m(kQ), l(kQ), o(kQ * d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < p.heads; ++h) {
      const float* kh = p.k + (h / group) * d;
      const float* vh = p.v + (h / group) * d;
      float* scores = p.key_scores + h * p.kv_tokens;
      for (int64_t q0 = 0; q0 < p.q_tokens; q0 += kQ) {
        const int64_t nq = std::min(kQ, p.q_tokens - q0);
        const int64_t kv_end = p.q_start + q0 + nq;  // keys the block's last query sees
        const float* qh = p.q + q0 * q_ld + h * d;
        // Keys [k0, k0 + nk) of the tile that query i sees.
        auto visible = [&](int64_t i, int64_t k0, int64_t nk) {
          return std::clamp<int64_t>(p.q_start + q0 + i + 1 - k0, 0, nk);
        };
        auto tile_scores = [&](int64_t k0, int64_t nk) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, p.scale, qh, q_ld,
                      kh + k0 * kv_ld, kv_ld, 0.f, s.data(), kK);
        };
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.f);
        for (int64_t k0 = 0; k0 < kv_end; k0 += kK) {  // pass 1: max and denominator
          const int64_t nk = std::min(kK, kv_end - k0);
          tile_scores(k0, nk);
          for (int64_t i = 0; i < nq; ++i) {
            const int64_t vis = visible(i, k0, nk);
            if (vis == 0) continue;
            float* row = s.data() + i * kK;
            const float mx = std::max(m[i], *std::max_element(row, row + vis));
            ops.exp(row, mx, row, vis);
            float sum = 0;
            for (int64_t j = 0; j < vis; ++j) sum += row[j];
            l[i] = l[i] * std::exp(m[i] - mx) + sum;
            m[i] = mx;
          }
        }
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t k0 = 0; k0 < kv_end; k0 += kK) {  // pass 2: weights, output, key sums
          const int64_t nk = std::min(kK, kv_end - k0);
          tile_scores(k0, nk);
          for (int64_t i = 0; i < nq; ++i) {
            const int64_t vis = visible(i, k0, nk);
            float* row = s.data() + i * kK;
            ops.exp(row, m[i], row, vis);
            const float inv = 1.f / l[i];
            for (int64_t j = 0; j < vis; ++j) row[j] *= inv;
            std::fill(row + vis, row + nk, 0.f);
          }
          for (int64_t i = 0; i < nq; ++i) {
            const float* row = s.data() + i * kK;
            for (int64_t j = 0; j < nk; ++j) scores[k0 + j] += row[j];
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.f, s.data(), kK,
                      vh + k0 * kv_ld, kv_ld, 1.f, o.data(), d);
        }
        for (int64_t i = 0; i < nq; ++i) {
          std::copy(o.begin() + i * d, o.begin() + (i + 1) * d, p.out + (q0 + i) * q_ld + h * d);
        }
      }
    }
  }
}

}  // namespace

void Attention(const AttentionParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  if (p.key_scores != nullptr) return AttentionWithKeyScores(p, ops, threads);
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
