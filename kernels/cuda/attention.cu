#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Pass 1: kRows (query, head) rows per block, one warp each, sharing K/V tiles of kKeyTile keys
// (one key per lane while scoring).
constexpr int kRows = 8;
constexpr int kKeyTile = kWarp;
// Pass 2: kScoreKeys keys per block, one thread each, over query tiles of kQueryTile.
constexpr int kScoreKeys = 64;
constexpr int kQueryTile = 32;

// K rows in shared memory are padded by 4 floats: lanes reading different keys' float4 at the
// same offset hit different banks, and every row stays 16-byte aligned.
template <int D>
constexpr int KStride() {
  return D + 4;
}

template <int D>
constexpr size_t ForwardSharedBytes() {
  return sizeof(float) * (kKeyTile * KStride<D>() + kKeyTile * D + kRows * D);
}

template <int D>
constexpr size_t ScoresSharedBytes() {
  return sizeof(float) * (kScoreKeys * KStride<D>() + kQueryTile * D + 2 * kQueryTile);
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// scale * (a . b) over D floats, both 16-byte aligned in shared memory. Both passes score with
// this function, so pass 2 sees bit-identical scores to the ones pass 1 normalized.
template <int D>
__device__ __forceinline__ float Score(const float* a, const float* b, float scale) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int d = 0; d < D; d += 4) {
    const float4 x = *reinterpret_cast<const float4*>(a + d);
    const float4 y = *reinterpret_cast<const float4*>(b + d);
    acc.x = fmaf(x.x, y.x, acc.x);
    acc.y = fmaf(x.y, y.y, acc.y);
    acc.z = fmaf(x.z, y.z, acc.z);
    acc.w = fmaf(x.w, y.w, acc.w);
  }
  return __fmul_rn((acc.x + acc.y) + (acc.z + acc.w), scale);
}

// Copies n rows of D floats from global memory (row r at src + r * src_stride) into shared
// memory (row r at dst + r * dst_stride), the whole block cooperating. `vec`: the source rows
// are 16-byte aligned (D is a multiple of 4, so that holds when the base pointer is).
template <int D>
__device__ __forceinline__ void LoadRows(const float* __restrict__ src, int64_t src_stride, int n,
                                         float* dst, int dst_stride, bool vec) {
  constexpr int kVecs = D / 4;
  for (int i = threadIdx.x; i < n * kVecs; i += blockDim.x) {
    const int r = i / kVecs, c = (i % kVecs) * 4;
    const float* s = src + r * src_stride + c;
    const float4 value = vec ? __ldg(reinterpret_cast<const float4*>(s))
                             : make_float4(__ldg(s), __ldg(s + 1), __ldg(s + 2), __ldg(s + 3));
    *reinterpret_cast<float4*>(dst + r * dst_stride + c) = value;
  }
}

// Pass 1. grid: [ceil(q_tokens * group / kRows), kv_heads], block: [kRows * 32],
// dynamic shared memory: ForwardSharedBytes<D>().
// Block b of kv-head g owns rows [first, first + kRows) of that kv-head's rows, row r being
// query r / group of head g * group + r % group; the heaviest blocks (latest queries) run first.
// At least 2 blocks per SM (128 registers a thread): with no floor ptxas spills at 48 (head_dim
// 128), with 3 or 4 at 80 or 64 (96, 80).
template <int D>
__global__ void __launch_bounds__(kRows* kWarp, 2)
    AttentionForwardKernel(const float* __restrict__ q,  // [q_tokens, heads, D]
                           const float* __restrict__ k,  // [kv_tokens, kv_heads, D]
                           const float* __restrict__ v,  // [kv_tokens, kv_heads, D]
                           float* __restrict__ out,      // [q_tokens, heads, D]
                           float* __restrict__ row_max,  // [q_tokens, heads] or null
                           float* __restrict__ row_sum,  // [q_tokens, heads] or null
                           int q_tokens, int64_t q_start, int heads, int kv_heads, float scale,
                           bool vec) {
  constexpr int kPerLane = (D + kWarp - 1) / kWarp;  // output elements lane + 32 i
  SLUICE_DYNAMIC_SHARED(shared4, float4);
  float* ks = reinterpret_cast<float*>(shared4);  // [kKeyTile, KStride<D>]
  float* vs = ks + kKeyTile * KStride<D>();       // [kKeyTile, D]
  float* qs = vs + kKeyTile * D;                  // [kRows, D]

  const int group = heads / kv_heads;
  const int kvh = blockIdx.y;
  const int64_t rows = int64_t{q_tokens} * group;
  const int64_t first = int64_t{gridDim.x - 1 - blockIdx.x} * kRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = first + warp;
  const bool active = r < rows;
  const int64_t t = active ? r / group : 0;
  const int h = kvh * group + (active ? static_cast<int>(r % group) : 0);
  const int64_t limit = active ? q_start + t + 1 : 0;  // this row sees keys [0, limit)
  const int64_t block_limit = q_start + (std::min(first + kRows, rows) - 1) / group + 1;

  const float* qrow = q + (t * heads + h) * D;
  for (int d = lane; d < D; d += kWarp) qs[warp * D + d] = active ? qrow[d] : 0.f;

  const int64_t kv_stride = int64_t{kv_heads} * D;
  float m = -INFINITY, l = 0.f;
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;

  for (int64_t s0 = 0; s0 < block_limit; s0 += kKeyTile) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyTile, block_limit - s0));
    __syncthreads();  // every warp is done with the previous tile (and qs is written)
    LoadRows<D>(k + (s0 * kv_heads + kvh) * D, kv_stride, n, ks, KStride<D>(), vec);
    LoadRows<D>(v + (s0 * kv_heads + kvh) * D, kv_stride, n, vs, D, vec);
    __syncthreads();
    // Keys of this tile the row sees; warp-uniform. Rows of the tile past it may hold stale
    // values and are never read.
    const int nv = static_cast<int>(std::min<int64_t>(n, limit - s0));
    if (nv <= 0) continue;
    const float s =
        lane < nv ? Score<D>(qs + warp * D, ks + lane * KStride<D>(), scale) : -INFINITY;
    const float m_new = fmaxf(m, WarpMax(s));  // finite: the tile holds a visible key
    const float p = lane < nv ? expf(s - m_new) : 0.f;
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * correction + WarpSum(p);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= correction;
    for (int j = 0; j < nv; ++j) {
      const float pj = __shfl_sync(kFullMask, p, j);
      const float* vr = vs + j * D;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (D % kWarp == 0 || d < D) acc[i] = fmaf(pj, vr[d], acc[i]);
      }
    }
    m = m_new;
  }
  if (!active) return;
  float* orow = out + (t * heads + h) * D;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (D % kWarp == 0 || d < D) orow[d] = acc[i] / l;
  }
  if (row_max != nullptr && lane == 0) {
    row_max[t * heads + h] = m;
    row_sum[t * heads + h] = l;
  }
}

// Pass 2. grid: [ceil((q_start + q_tokens) / kScoreKeys), heads], block: [kScoreKeys],
// dynamic shared memory: ScoresSharedBytes<D>().
// Thread i owns key j = blockIdx.x * kScoreKeys + i of head blockIdx.y and walks the queries
// that see it (q_start + t >= j) in shared-memory tiles. Keys no query sees are not touched.
template <int D>
__global__ void __launch_bounds__(kScoreKeys)
    KeyScoresKernel(const float* __restrict__ q,        // [q_tokens, heads, D]
                    const float* __restrict__ k,        // [kv_tokens, kv_heads, D]
                    const float* __restrict__ row_max,  // [q_tokens, heads]
                    const float* __restrict__ row_sum,  // [q_tokens, heads]
                    float* __restrict__ key_scores,     // [heads, kv_tokens]
                    int q_tokens, int64_t q_start, int heads, int kv_heads, int64_t kv_tokens,
                    float scale, bool vec) {
  SLUICE_DYNAMIC_SHARED(shared4, float4);
  float* ks = reinterpret_cast<float*>(shared4);  // [kScoreKeys, KStride<D>]
  float* qs = ks + kScoreKeys * KStride<D>();     // [kQueryTile, D]
  float* ms = qs + kQueryTile * D;                // [kQueryTile] row maxima
  float* inv_ls = ms + kQueryTile;                // [kQueryTile] 1 / row normalizers

  const int h = blockIdx.y;
  const int kvh = h / (heads / kv_heads);
  const int64_t j0 = int64_t{blockIdx.x} * kScoreKeys;
  const int n = static_cast<int>(std::min<int64_t>(kScoreKeys, q_start + q_tokens - j0));
  LoadRows<D>(k + (j0 * kv_heads + kvh) * D, int64_t{kv_heads} * D, n, ks, KStride<D>(), vec);

  const int64_t j = j0 + threadIdx.x;
  const bool owns_key = threadIdx.x < n;
  const float* krow = ks + threadIdx.x * KStride<D>();
  float acc = 0.f;
  // Query t sees key j when q_start + t >= j: the block's first key j0 is seen from t = j0 -
  // q_start on.
  for (int64_t t0 = std::max<int64_t>(0, j0 - q_start); t0 < q_tokens; t0 += kQueryTile) {
    const int nq = static_cast<int>(std::min<int64_t>(kQueryTile, q_tokens - t0));
    __syncthreads();  // the previous query tile has been read
    LoadRows<D>(q + (t0 * heads + h) * D, int64_t{heads} * D, nq, qs, D, vec);
    for (int i = threadIdx.x; i < nq; i += blockDim.x) {
      ms[i] = row_max[(t0 + i) * heads + h];
      inv_ls[i] = 1.f / row_sum[(t0 + i) * heads + h];
    }
    __syncthreads();  // also orders the K tile before its first use
    if (!owns_key) continue;
    for (int i = 0; i < nq; ++i) {
      if (q_start + t0 + i < j) continue;
      acc += expf(Score<D>(qs + i * D, krow, scale) - ms[i]) * inv_ls[i];
    }
  }
  if (owns_key) key_scores[h * kv_tokens + j] += acc;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int D>
cudaError_t LaunchForHeadDim(const AttentionParams& p, float* workspace, cudaStream_t stream) {
  const bool vec = Aligned16(p.q) && Aligned16(p.k) && Aligned16(p.v);
  const int64_t group = p.heads / p.kv_heads;
  float* row_max = nullptr;
  float* row_sum = nullptr;
  if (p.key_scores != nullptr) {
    row_max = workspace;
    row_sum = workspace + p.q_tokens * p.heads;
  }

  constexpr size_t kForwardShared = ForwardSharedBytes<D>();
  if (cudaError_t e = cudaFuncSetAttribute(AttentionForwardKernel<D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kForwardShared));
      e != cudaSuccess) {
    return e;
  }
  const dim3 forward_grid(static_cast<unsigned>((p.q_tokens * group + kRows - 1) / kRows),
                          static_cast<unsigned>(p.kv_heads));
  SLUICE_LAUNCH(forward_grid, kRows * kWarp, kForwardShared, stream, AttentionForwardKernel<D>)
  (p.q, p.k, p.v, p.out, row_max, row_sum, static_cast<int>(p.q_tokens), p.q_start,
   static_cast<int>(p.heads), static_cast<int>(p.kv_heads), p.scale, vec);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (p.key_scores == nullptr) return cudaSuccess;

  constexpr size_t kScoresShared = ScoresSharedBytes<D>();
  if (cudaError_t e =
          cudaFuncSetAttribute(KeyScoresKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kScoresShared));
      e != cudaSuccess) {
    return e;
  }
  const int64_t seen = p.q_start + p.q_tokens;  // keys some query of the chunk sees
  const dim3 scores_grid(static_cast<unsigned>((seen + kScoreKeys - 1) / kScoreKeys),
                         static_cast<unsigned>(p.heads));
  SLUICE_LAUNCH(scores_grid, kScoreKeys, kScoresShared, stream, KeyScoresKernel<D>)
  (p.q, p.k, row_max, row_sum, p.key_scores, static_cast<int>(p.q_tokens), p.q_start,
   static_cast<int>(p.heads), static_cast<int>(p.kv_heads), p.kv_tokens, p.scale, vec);
  return cudaGetLastError();
}

}  // namespace

bool AttentionSupportsHeadDim(int64_t head_dim) {
  switch (head_dim) {
    case 8:
    case 16:
    case 32:
    case 64:
    case 80:
    case 96:
    case 128:
    case 256:
      return true;
    default:
      return false;
  }
}

size_t AttentionWorkspaceBytes(const AttentionParams& p) {
  if (p.key_scores == nullptr) return 0;
  return 2 * static_cast<size_t>(p.q_tokens * p.heads) * sizeof(float);
}

cudaError_t LaunchAttention(const AttentionParams& p, float* workspace, cudaStream_t stream) {
  switch (p.head_dim) {
    case 8:
      return LaunchForHeadDim<8>(p, workspace, stream);
    case 16:
      return LaunchForHeadDim<16>(p, workspace, stream);
    case 32:
      return LaunchForHeadDim<32>(p, workspace, stream);
    case 64:
      return LaunchForHeadDim<64>(p, workspace, stream);
    case 80:
      return LaunchForHeadDim<80>(p, workspace, stream);
    case 96:
      return LaunchForHeadDim<96>(p, workspace, stream);
    case 128:
      return LaunchForHeadDim<128>(p, workspace, stream);
    case 256:
      return LaunchForHeadDim<256>(p, workspace, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sluice::kernels::cuda
