#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decode_attention_kernels.h"
#include "kernels/cuda/huffman_unit.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kWarps = kDecodeThreads / 32;

__device__ __forceinline__ float HalfBits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// A small non-negative int code as a float without the int-to-float unit (16 per clock on
// sm_80/90): 2^23 + code has the code in its mantissa; subtracting 2^23 is exact.
__device__ __forceinline__ float CodeToFloat(uint32_t code) {
  return __int_as_float(0x4B000000u | code) - 8388608.f;
}

__device__ __forceinline__ float Fp8ToFloat(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__host__ __device__ inline int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }

// x / f.d (FastDiv, decode_attention_kernels.h): one multiply-high, exact for 0 <= x < 2^32 / d.
__device__ __forceinline__ int FastDivide(int x, const FastDiv& f) {
  return f.d == 1 ? x : static_cast<int>(__umulhi(static_cast<uint32_t>(x), f.mul));
}

// Shared memory of one block, in order.
struct Smem {
  uint8_t* pages;  // [2, page_stride]: two page buffers
  int64_t page_stride;
  uint8_t* unit;  // [unit_buffer_bytes]
  float* q;       // [R, head_dim], pre-scaled
  float* acc;     // [R, head_dim]
  float* meta;    // [meta_floats]: K meta then V meta of the current view, as floats
  float* sc;      // [R, view_tokens]: logits, then weights
  float* m;       // [R]
  float* l;       // [R]
  float* factor;  // [R]
  float* qsum;    // [R, head_dim / 8]: sums of q over 8-channel slices
};

__host__ __device__ inline int64_t SmemBytes(const DecodeKernelParams& p, int rows) {
  int64_t b = 2 * Align16(p.page_buffer_bytes) + Align16(p.unit_buffer_bytes);
  b += 2 * static_cast<int64_t>(rows) * p.head_dim * 4;
  b += Align16(static_cast<int64_t>(p.meta_floats) * 4);
  b += Align16(static_cast<int64_t>(rows) * p.view_tokens * 4);
  b += 3 * Align16(rows * 4);
  b += Align16(static_cast<int64_t>(rows) * (p.head_dim / 8) * 4);
  return b;
}

// Carves shared memory front to back, each piece 16-byte aligned.
struct SmemCursor {
  uint8_t* at;
  __device__ __forceinline__ uint8_t* operator()(int64_t bytes) {
    uint8_t* r = at;
    at += Align16(bytes);
    return r;
  }
};

__device__ __forceinline__ Smem CarveSmem(uint8_t* base, const DecodeKernelParams& p, int rows) {
  Smem s;
  SmemCursor take{base};
  s.page_stride = Align16(p.page_buffer_bytes);
  s.pages = take(2 * s.page_stride);
  s.unit = take(p.unit_buffer_bytes);
  s.q = reinterpret_cast<float*>(take(static_cast<int64_t>(rows) * p.head_dim * 4));
  s.acc = reinterpret_cast<float*>(take(static_cast<int64_t>(rows) * p.head_dim * 4));
  s.meta = reinterpret_cast<float*>(take(static_cast<int64_t>(p.meta_floats) * 4));
  s.sc = reinterpret_cast<float*>(take(static_cast<int64_t>(rows) * p.view_tokens * 4));
  s.m = reinterpret_cast<float*>(take(rows * 4));
  s.l = reinterpret_cast<float*>(take(rows * 4));
  s.factor = reinterpret_cast<float*>(take(rows * 4));
  s.qsum = reinterpret_cast<float*>(take(static_cast<int64_t>(rows) * (p.head_dim / 8) * 4));
  return s;
}

// A run of tokens of a fixed-width page (a page, or a decoded Huffman unit) in shared memory.
struct View {
  const uint8_t* data;  // the page (or unit page) bytes
  const KvTierFormat* f;
  const KvPageLayout* l;
  int n;                  // tokens: slots [0, n)
  const uint64_t* valid;  // valid bits; token t is bit valid_shift + t
  int valid_shift;
  int key_base;               // key index of token 0 within the bh's keys
  const DecodeTierConsts* c;  // of f and l
};

__device__ __forceinline__ bool Live(const View& v, int t) {
  const int b = v.valid_shift + t;
  return (v.valid[b >> 6] >> (b & 63)) & 1;
}

// Converts the view's K and V meta segments to floats: K at meta[0, kh), V at meta[kh, ...).
__device__ __forceinline__ void ConvertMeta(const View& v, int d, float* meta, int* k_halves) {
  (void)d;
  const int kh = v.c->k_meta_halves, vh = v.c->v_meta_halves;
  const uint16_t* km = reinterpret_cast<const uint16_t*>(v.data + v.l->k_meta);
  const uint16_t* vm = reinterpret_cast<const uint16_t*>(v.data + v.l->v_meta);
  for (int i = threadIdx.x; i < kh; i += kDecodeThreads) meta[i] = HalfBits(km[i]);
  for (int i = threadIdx.x; i < vh; i += kDecodeThreads) meta[kh + i] = HalfBits(vm[i]);
  *k_halves = kh;
}

// Logits of the view's tokens for every row: sc[r, t] (masked: -inf). One thread per token for
// tiled int keys, one warp per token for token-major keys.
template <int R>
__device__ __forceinline__ void ScoreView(const DecodeKernelParams& p, const Smem& s, const View& v,
                                          const float* kmeta, int rows_here) {
  const int d = p.head_dim, N = v.l->tokens, vt = p.view_tokens;
  const KvQuantSpec& ks = v.f->k;
  const uint8_t* codes = v.data + v.l->k_codes;
  if (ks.codec == KvCodec::kInt) {
    const int shift = v.c->k_per_shift, per = 1 << shift;
    const int bits = ks.bits, mask = (1 << bits) - 1;
    const int T = v.l->k_tile, rb = v.l->k_row_bytes;
    const int gs = ks.group == 0 ? d : ks.group;
    for (int t = threadIdx.x; t < v.n; t += kDecodeThreads) {
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.f;
      const int tile_index = FastDivide(t, v.c->k_tile);
      const uint8_t* tile = codes + tile_index * T * rb + (t - tile_index * T);
      if (ks.grouping == KvGrouping::kPerToken) {
        const int groups = v.c->k_groups;
        for (int gi = 0; gi < groups; ++gi) {
          float part[R];
#pragma unroll
          for (int r = 0; r < R; ++r) part[r] = 0.f;
          for (int c = gi * gs; c < (gi + 1) * gs; c += per) {
            const uint32_t byte = tile[(c >> shift) * T];
            for (int e = 0; e < per; ++e) {
              const float x = CodeToFloat((byte >> (e * bits)) & mask);
#pragma unroll
              for (int r = 0; r < R; ++r) part[r] = fmaf(s.q[r * d + c + e], x, part[r]);
            }
          }
          const float scale = kmeta[gi * N + t], zero = kmeta[(groups + gi) * N + t];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            // sum_c q_c (zero + code_c scale) over the group's channels.
            float qs = 0.f;
            if (v.c->k_group8 != 0) {
              for (int j = 0; j < gs / 8; ++j) qs += s.qsum[r * (d / 8) + gi * (gs / 8) + j];
            } else {
              for (int c = gi * gs; c < (gi + 1) * gs; ++c) qs += s.q[r * d + c];
            }
            acc[r] += scale * part[r] + zero * qs;
          }
        }
      } else {
        const int blocks = v.c->k_blocks;
        const float* ms = kmeta + FastDivide(t, v.c->k_group) * 2 * blocks;
        const float* mz = ms + blocks;
        for (int c = 0; c < d; c += per) {
          const uint32_t byte = tile[(c >> shift) * T];
          for (int e = 0; e < per; ++e) {
            const int ch = c + e;
            const int bi = FastDivide(ch, v.c->k_block);
            const float x = fmaf(CodeToFloat((byte >> (e * bits)) & mask), ms[bi], mz[bi]);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = fmaf(s.q[r * d + ch], x, acc[r]);
          }
        }
      }
      const bool live = Live(v, t);
#pragma unroll
      for (int r = 0; r < R; ++r) s.sc[r * vt + t] = live && r < rows_here ? acc[r] : -INFINITY;
    }
    return;
  }
  // f16 / fp8: token-major rows.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < v.n; t += kWarps) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int c = lane; c < d; c += 32) {
      float x;
      if (ks.codec == KvCodec::kF16) {
        x = HalfBits(reinterpret_cast<const uint16_t*>(codes + t * v.l->k_row_bytes)[c]);
      } else {
        x = Fp8ToFloat(codes[t * v.l->k_row_bytes + c]) *
            kmeta[FastDivide(c, v.c->k_group) * N + t];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(s.q[r * d + c], x, acc[r]);
    }
    const bool live = Live(v, t);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float x = WarpSum(acc[r]);
      if (lane == 0) s.sc[r * vt + t] = live && r < rows_here ? x : -INFINITY;
    }
  }
}

// Online-softmax step over the view's n logits: running max and sum per row, weights in place
// of the logits, and the factor the accumulators must be scaled by. Optionally copies the
// logits to the global logits array first.
template <int R>
__device__ __forceinline__ void SoftmaxView(const DecodeKernelParams& p, const Smem& s, int n,
                                            float* logits, int row0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, vt = p.view_tokens;
  for (int r = warp; r < R; r += kWarps) {
    float* x = s.sc + r * vt;
    if (logits != nullptr && row0 + r < p.rows) {
      for (int t = lane; t < n; t += 32) logits[static_cast<int64_t>(t) * p.rows + row0 + r] = x[t];
    }
    float mx = -INFINITY;
    for (int t = lane; t < n; t += 32) mx = fmaxf(mx, x[t]);
    mx = WarpMax(mx);
    const float m_old = s.m[r], m_new = fmaxf(m_old, mx);
    float sum = 0.f;
    for (int t = lane; t < n; t += 32) {
      const float w = m_new == -INFINITY ? 0.f : expf(x[t] - m_new);
      x[t] = w;
      sum += w;
    }
    sum = WarpSum(sum);
    // Every lane has read s.m[r] above; lane 0 overwrites it below.
    __syncwarp();
    if (lane == 0) {
      const float f = m_new == -INFINITY ? 1.f : expf(m_old - m_new);
      s.factor[r] = f;
      s.l[r] = s.l[r] * f + sum;
      s.m[r] = m_new;
    }
  }
}

__device__ __forceinline__ void RescaleAcc(const Smem& s, int rows, int d, const FastDiv& dd) {
  for (int i = threadIdx.x; i < rows * d; i += kDecodeThreads) {
    s.acc[i] *= s.factor[FastDivide(i, dd)];
  }
}

// acc[r, :] += sum_t w[r, t] v[t, :] over a fixed-width view. Thread items are (column, split):
// a column is one byte of int codes (8 / bits channels) or one channel; splits share tokens.
template <int R>
__device__ __forceinline__ void AccumulateView(const DecodeKernelParams& p, const Smem& s,
                                               const View& v, const float* vmeta) {
  const int d = p.head_dim, N = v.l->tokens, vt = p.view_tokens;
  const KvQuantSpec& vs = v.f->v;
  const uint8_t* codes = v.data + v.l->v_codes;
  const int rb = v.l->v_row_bytes;
  const int groups = v.c->v_groups;
  const bool is_int = vs.codec == KvCodec::kInt;
  const int cols = v.c->v_cols, per = v.c->v_per, splits = v.c->v_splits;
  const int bits = is_int ? vs.bits : 8, mask = (1 << bits) - 1;
  for (int item = threadIdx.x; item < cols * splits; item += kDecodeThreads) {
    const int split = FastDivide(item, v.c->v_cols_div), col = item - split * cols;
    // The meta group of each code of the column's byte (int), or of the channel.
    int gi[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) gi[e] = FastDivide(col + e * rb * (is_int ? 1 : 0), v.c->v_group);
    float a[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[r][e] = 0.f;
    }
    for (int t = split; t < v.n; t += splits) {
      float w[R];
#pragma unroll
      for (int r = 0; r < R; ++r) w[r] = s.sc[r * vt + t];
      if (is_int) {
        const uint32_t byte = codes[t * rb + col];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (e >= per) break;
          const float x = fmaf(CodeToFloat((byte >> (e * bits)) & mask), vmeta[gi[e] * N + t],
                               vmeta[(groups + gi[e]) * N + t]);
#pragma unroll
          for (int r = 0; r < R; ++r) a[r][e] = fmaf(w[r], x, a[r][e]);
        }
      } else {
        const float x = vs.codec == KvCodec::kF16
                            ? HalfBits(reinterpret_cast<const uint16_t*>(codes + t * rb)[col])
                            : Fp8ToFloat(codes[t * rb + col]) * vmeta[gi[0] * N + t];
#pragma unroll
        for (int r = 0; r < R; ++r) a[r][0] = fmaf(w[r], x, a[r][0]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= per) break;
      const int ch = col + e * rb * (is_int ? 1 : 0);
#pragma unroll
      for (int r = 0; r < R; ++r) atomicAdd(&s.acc[r * d + ch], a[r][e]);
    }
  }
}

// One view: meta, logits, softmax step, accumulation. Ends synchronized.
template <int R>
__device__ __forceinline__ void RunView(const DecodeKernelParams& p, const Smem& s, const View& v,
                                        int rows_here, float* logits, int row0) {
  int kh = 0;
  ConvertMeta(v, p.head_dim, s.meta, &kh);
  __syncthreads();
  ScoreView<R>(p, s, v, s.meta, rows_here);
  __syncthreads();
  SoftmaxView<R>(p, s, v.n, logits ? logits + static_cast<int64_t>(v.key_base) * p.rows : nullptr,
                 row0);
  __syncthreads();
  RescaleAcc(s, R, p.head_dim, p.head_dim_div);
  __syncthreads();
  AccumulateView<R>(p, s, v, s.meta + kh);
  __syncthreads();
}

// Recent tokens [i0, i1) of sequence b (fp32 rows in global memory), causal per query token.
template <int R>
__device__ __forceinline__ void RunRecent(const DecodeKernelParams& p, const Smem& s, int b,
                                          int kvh, int i0, int i1, int rcount, int row0,
                                          int rows_here, float* logits, int key_base) {
  const int d = p.head_dim, vt = p.view_tokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* recent_k = p.recent_k[b];
  const float* recent_v = p.recent_v[b];
  const int n = i1 - i0;
  for (int j = warp; j < n; j += kWarps) {
    const int i = i0 + j;
    const float* k = recent_k + (static_cast<int64_t>(i) * p.kv_heads + kvh) * d;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int c = lane; c < d; c += 32) {
      const float x = k[c];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(s.q[r * d + c], x, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float x = WarpSum(acc[r]);
      const int row = row0 + r, tq = FastDivide(row, p.group_div);
      const bool visible = r < rows_here && i <= rcount - p.q_tokens + tq;
      if (lane == 0) s.sc[r * vt + j] = visible ? x : -INFINITY;
    }
  }
  __syncthreads();
  SoftmaxView<R>(p, s, n, logits ? logits + static_cast<int64_t>(key_base + i0) * p.rows : nullptr,
                 row0);
  __syncthreads();
  RescaleAcc(s, R, d, p.head_dim_div);
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kDecodeThreads) {
    float a[R];
#pragma unroll
    for (int r = 0; r < R; ++r) a[r] = 0.f;
    for (int j = 0; j < n; ++j) {
      const float x = recent_v[(static_cast<int64_t>(i0 + j) * p.kv_heads + kvh) * d + c];
#pragma unroll
      for (int r = 0; r < R; ++r) a[r] = fmaf(s.sc[r * vt + j], x, a[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) s.acc[r * d + c] += a[r];
  }
  __syncthreads();
}

// Copies a page into shared memory with 16-byte asynchronous copies (one commit group).
__device__ __forceinline__ void LoadPage(uint8_t* dst, const uint8_t* src, int bytes) {
  for (int i = threadIdx.x * 16; i < bytes; i += kDecodeThreads * 16) {
    __pipeline_memcpy_async(dst + i, src + i, 16);
  }
  __pipeline_commit();
}

// Decodes unit `index` of the Huffman-coded page `page` (shared memory) into `unit`: every
// thread decodes (huffman_unit.cuh), then copies its share of the unit's meta.
__device__ __forceinline__ void DecodeUnit(const DecodeTier& tier, int d, const uint8_t* page,
                                           int index, uint8_t* unit) {
  static_assert(kDecodeThreads == kHuffmanUnitThreads, "a block decodes a unit");
  const KvPageLayout& l = tier.layout;
  const KvPageLayout& ul = tier.unit_layout;
  DecodeHuffmanUnit(
      reinterpret_cast<const uint32_t*>(page + l.bitstream),
      reinterpret_cast<const uint32_t*>(page + l.streams) + index * 2 * kKvHuffmanStreams,
      d * l.unit_tokens / kKvHuffmanStreams, tier.k_table, (1u << tier.k_table_bits) - 1,
      tier.v_table, (1u << tier.v_table_bits) - 1, unit + ul.k_codes, unit + ul.v_codes);
  const uint8_t* meta = page + l.unit_meta + index * l.unit_meta_bytes;
  const int kb = l.unit_k_meta_bytes;
  for (int i = threadIdx.x; i < l.unit_meta_bytes; i += kDecodeThreads) {
    unit[i < kb ? ul.k_meta + i : ul.v_meta + i - kb] = meta[i];
  }
}

template <int R>
__global__ void __launch_bounds__(kDecodeThreads, 4)
    ChunkKernel(const __grid_constant__ DecodeKernelParams p) {
  SLUICE_DYNAMIC_SHARED(smem_raw, uint8_t);
  const Smem s = CarveSmem(smem_raw, p, R);
  const DecodeChunk chunk = p.chunks[blockIdx.x];
  const int row0 = blockIdx.y * R;
  const int rows_here = min(R, p.rows - row0);
  const int d = p.head_dim;
  const int b = chunk.bh / p.kv_heads, kvh = chunk.bh % p.kv_heads;

  for (int i = threadIdx.x; i < R * d; i += kDecodeThreads) {
    const int r = FastDivide(i, p.head_dim_div), c = i - r * d, row = row0 + r;
    float x = 0.f;
    if (r < rows_here) {
      const int tq = FastDivide(row, p.group_div), h = kvh * p.group + (row - tq * p.group);
      x = p.q[((static_cast<int64_t>(b) * p.q_tokens + tq) * p.heads + h) * d + c] * p.scale;
    }
    s.q[i] = x;
    s.acc[i] = 0.f;
  }
  if (threadIdx.x < R) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.f;
  }
  __syncthreads();
  // Sums of q over 8-channel slices, for per-token K groups (their zero points factor out).
  for (int i = threadIdx.x; i < R * (d / 8); i += kDecodeThreads) {
    const int r = FastDivide(i, p.head_dim8_div), j = i - r * (d / 8);
    float x = 0.f;
    for (int c = j * 8; c < j * 8 + 8; ++c) x += s.q[r * d + c];
    s.qsum[i] = x;
  }
  __syncthreads();

  float* logits = p.logits == nullptr
                      ? nullptr
                      : p.logits + static_cast<int64_t>(p.key_offsets[chunk.bh]) * p.rows;
  if (chunk.recent_begin >= 0) {
    const int rcount = static_cast<int>(p.recent_offsets[b + 1] - p.recent_offsets[b]);
    const int key_base = p.key_offsets[chunk.bh + 1] - p.key_offsets[chunk.bh] - rcount;
    for (int i0 = chunk.recent_begin; i0 < chunk.recent_end; i0 += kRecentView) {
      const int i1 = min(chunk.recent_end, i0 + kRecentView);
      RunRecent<R>(p, s, b, kvh, i0, i1, rcount, row0, rows_here, logits, key_base);
    }
  } else {
    int key_base = chunk.key_base;
    if (chunk.page_begin < chunk.page_end) {
      const KvPageRef first = p.pages[chunk.page_begin];
      LoadPage(s.pages, first.data, p.tiers[first.tier].load_bytes);
    }
    for (int pi = chunk.page_begin; pi < chunk.page_end; ++pi) {
      const int buf = (pi - chunk.page_begin) & 1;
      if (pi + 1 < chunk.page_end) {
        const KvPageRef next = p.pages[pi + 1];
        LoadPage(s.pages + (buf ^ 1) * s.page_stride, next.data, p.tiers[next.tier].load_bytes);
        __pipeline_wait_prior(1);
      } else {
        __pipeline_wait_prior(0);
      }
      __syncthreads();
      const KvPageRef ref = p.pages[pi];
      const DecodeTier& tier = p.tiers[ref.tier];
      const uint8_t* page = s.pages + buf * s.page_stride;
      const uint64_t* valid = reinterpret_cast<const uint64_t*>(page + tier.layout.valid);
      if (!tier.huffman) {
        const View v{page, &tier.format, &tier.layout, ref.slots, valid, 0, key_base, &tier.consts};
        RunView<R>(p, s, v, rows_here, logits, row0);
      } else {
        const int u = tier.layout.unit_tokens;
        // Pages are written in whole units; a page list may still count fewer slots of the
        // last one (the rest then stay out of attention, as on the host).
        for (int index = 0; index * u < ref.slots; ++index) {
          DecodeUnit(tier, d, page, index, s.unit);
          __syncthreads();
          const View v{
              s.unit, &tier.unit_format, &tier.unit_layout,    min(u, ref.slots - index * u),
              valid,  index * u,         key_base + index * u, &tier.consts};
          RunView<R>(p, s, v, rows_here, logits, row0);
        }
      }
      key_base += ref.slots;
    }
  }
  // The chunk's partial state.
  for (int i = threadIdx.x; i < rows_here * d; i += kDecodeThreads) {
    const int r = FastDivide(i, p.head_dim_div), c = i - r * d;
    p.part_acc[(static_cast<int64_t>(blockIdx.x) * p.rows + row0 + r) * d + c] = s.acc[i];
  }
  if (threadIdx.x < rows_here) {
    p.part_m[static_cast<int64_t>(blockIdx.x) * p.rows + row0 + threadIdx.x] = s.m[threadIdx.x];
    p.part_l[static_cast<int64_t>(blockIdx.x) * p.rows + row0 + threadIdx.x] = s.l[threadIdx.x];
  }
}

// Merges the chunks of one (sequence, kv-head): out = sum_i e^(m_i - M) acc_i / L.
__global__ void MergeKernel(const __grid_constant__ DecodeKernelParams p) {
  const int bh = blockIdx.x, d = p.head_dim;
  const int b = bh / p.kv_heads, kvh = bh % p.kv_heads;
  const int c0 = p.chunk_offsets[bh], c1 = p.chunk_offsets[bh + 1];
  for (int i = threadIdx.x; i < p.rows * d; i += blockDim.x) {
    const int r = i / d, c = i % d;
    float M = -INFINITY;
    for (int k = c0; k < c1; ++k) M = fmaxf(M, p.part_m[static_cast<int64_t>(k) * p.rows + r]);
    float L = 0.f, o = 0.f;
    for (int k = c0; k < c1; ++k) {
      const float m = p.part_m[static_cast<int64_t>(k) * p.rows + r];
      const float w = m == -INFINITY ? 0.f : expf(m - M);
      L += w * p.part_l[static_cast<int64_t>(k) * p.rows + r];
      o += w * p.part_acc[(static_cast<int64_t>(k) * p.rows + r) * d + c];
    }
    const int tq = r / p.group, h = kvh * p.group + r % p.group;
    p.out[((static_cast<int64_t>(b) * p.q_tokens + tq) * p.heads + h) * d + c] = o / L;
    if (c == 0) {
      p.row_m[static_cast<int64_t>(bh) * p.rows + r] = M;
      p.row_l[static_cast<int64_t>(bh) * p.rows + r] = L;
    }
  }
}

// Cumulative attention per key (batch 1): weights from the logits and each row's final max and
// sum, summed over the rows of a kv-head (or per query head), added to the score arrays.
__global__ void ScoreKernel(const __grid_constant__ DecodeKernelParams p) {
  const int bh = blockIdx.y, b = bh / p.kv_heads, kvh = bh % p.kv_heads;
  const int k0 = p.key_offsets[bh], keys = p.key_offsets[bh + 1] - k0;
  const int paged = p.slot_offsets[bh + 1] - p.slot_offsets[bh];
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= keys) return;
  // Sequence b's score rows: its paged slots (every kv-head's, in list order), its recent tokens.
  const int seq_slot0 = p.slot_offsets[b * p.kv_heads];
  const int64_t total_slots = p.slot_offsets[(b + 1) * p.kv_heads] - seq_slot0;
  const int64_t recent = p.recent_offsets[b + 1] - p.recent_offsets[b];
  float* page_scores = p.page_scores + (p.page_score_offsets ? p.page_score_offsets[b] : 0);
  float* recent_scores = p.recent_scores + (p.recent_score_offsets ? p.recent_score_offsets[b] : 0);
  const float* lg = p.logits + static_cast<int64_t>(k0 + j) * p.rows;
  const float* M = p.row_m + static_cast<int64_t>(bh) * p.rows;
  const float* L = p.row_l + static_cast<int64_t>(bh) * p.rows;
  const int buckets = p.scores_per_head ? p.group : 1;
  for (int gi = 0; gi < buckets; ++gi) {
    float sum = 0.f;
    for (int r = 0; r < p.rows; ++r) {
      if (p.scores_per_head && r % p.group != gi) continue;
      sum += lg[r] == -INFINITY ? 0.f : expf(lg[r] - M[r]) / L[r];
    }
    if (j < paged) {
      page_scores[gi * total_slots + (p.slot_offsets[bh] - seq_slot0) + j] += sum;
    } else {
      const int64_t row = p.scores_per_head ? kvh * p.group + gi : kvh;
      recent_scores[row * recent + (j - paged)] += sum;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The KIVI kernel: one page format, every size a compile-time constant (FlashInfer's decode
// dispatch: the runtime sizes pick an instantiation), both products on the tensor cores.
//
// Keys are B-bit codes per channel over 32-token groups (a group is a key tile: byte q * 32 + t
// holds channels q * P + s of its token t at bits s * B, P = 8 / B); values are B-bit codes per
// token with a scale and zero per 32 channels (byte j of a token's row holds channels j + s * RB,
// RB = D * B / 8). Scales and zeros leave the products:
//   logit[r, t] = sum_c q[r, c] (kz[g, c] + ks[g, c] code[c, t])         (g: t's token group)
//               = sum_c code[t, c] kq[g, c, r] + kb[g, r],    kq = q ks,  kb = sum_c q kz
//   out[r, c]   = sum_t w[r, t] (vz[t, h] + vs[t, h] code[t, c])         (h: c's channel group)
//               = sum_t code[t, c] ps[t, h, r] + vb[r, h],    ps = w vs,  vb = sum_t w vz
// Both sums run as mma.sync m16n8k16 (warp_mma.cuh) with the codes as A, exact in fp16 (a code
// masked into the mantissa of 1024 by one LOP3, 1024 subtracted by one HSUB2, both lanes of an
// f16x2 at once), and kq or ps as B in two fp16 parts, hi = fp16(x) and lo = fp16(x - hi),
// side by side in B's 8 columns (4 query rows each): hi + lo carries about 22 bits, so logits
// and outputs match the fp32 reference to ~1e-6 relative. Before the split, kq is scaled by a
// power of two that puts its largest value just under 2^14 (fp16 ends at 65504); ps needs none
// (a weight is at most 1, a value scale is an fp16). Every code position's 2^(bit offset) is
// folded into kq or into the output.
//
// Per page (128 threads, kKiviRows = 4 query rows):
//   keys     warp w: token groups w, w + 4, ...: the group's kq (fp16 parts) and kb, then per 8
//            key bytes (32 tokens x 8 P channels) 2 loads, 8 PRMT, P/2 x (8 LOP3 + 8 HSUB2,
//            2 mma); logits to shared memory
//   softmax  warp r: row r's running max and sum, weights, vb
//   weights  thread per 2 tokens: ps (fp16 parts) for every row and value group
//   values   warp w: 16-token slices w, w + 4, ...: per slice 4 loads per 32 value bytes, 8 PRMT,
//            4P x (LOP3 + HSUB2), 2P mma into D/16 accumulator tiles kept in registers across
//            pages (each warp its own), rescaled by the softmax per page.
template <int D, int B, int G, int GV>
struct Kivi {
  static constexpr int kP = 8 / B;                      // codes per byte
  static constexpr int kRowBytes = D * B / 8;           // one token's value codes
  static constexpr int kKeyByteGroups = D / kP / 8;     // 8-byte column groups of a key tile
  static constexpr int kValueColumns = kRowBytes / 32;  // 32-byte columns of a value row
  static constexpr int kValueTiles = D / 16;            // accumulator tiles of 16 channels
  static constexpr int kVGroups = D / GV;               // value channel groups
  static_assert(B == 2 || B == 4, "2- or 4-bit codes");
  static_assert(G == 32 && GV == 32, "32-token key groups, 32-channel value groups");
  static_assert(D % 64 == 0 && kValueColumns >= 1, "value rows of whole 32-byte columns");
  static_assert(kKiviRows == 4 && kWarps == kKiviRows, "one warp per query row");
};

// 2^e for |e| < 127, a constant once the loops around it are unrolled.
__host__ __device__ constexpr float Pow2(int e) {
  return e >= 0 ? static_cast<float>(1u << e) : 1.f / static_cast<float>(1u << -e);
}
// 2^e for -126 <= e <= 127 at run time.
__device__ __forceinline__ float Pow2Bits(int e) { return __int_as_float((127 + e) << 23); }
// The power of two that scales a nonnegative x to below 2^14, within [-60, 60].
__device__ __forceinline__ int ScaleExponent(float x) {
  const int e = (__float_as_int(x) >> 23) - 127;  // floor(log2 x) for a normal x
  return min(max(13 - e, -60), 60);
}

constexpr uint32_t kHalf1024 = 0x64006400u;  // f16x2 {1024, 1024}

// The f16x2 of the two B-bit codes at bits [lo, lo + B) and [16 + hi, 16 + hi + B) of x, times
// 2^lo and 2^hi, exactly (codes times at most 2^6 stay below 1024).
template <int B>
__device__ __forceinline__ uint32_t CodePair(uint32_t x, int lo, int hi) {
  constexpr uint32_t m = (1u << B) - 1;
  return SubHalf2(AndOr(x, (m << lo) | (m << (16 + hi)), kHalf1024), kHalf1024);
}

// Splits x (two floats) into fp16 parts: *hi = fp16(x), *lo = fp16(x - hi).
__device__ __forceinline__ void SplitHalf2(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  *hi = PackHalf2(x0, x1);
  *lo = PackHalf2(x0 - LowHalf(*hi), x1 - LowHalf(*hi >> 16));
}

// Shared memory of one KIVI block, in order. vt (view_tokens) is a multiple of 16, at least the
// page's slots and kRecentView.
struct KiviSmem {
  uint8_t* pages;  // [2, page_stride]
  int64_t page_stride;
  float* q;       // [D, R], pre-scaled
  uint32_t* kq;   // [warps, 2 parts, R, D / 2]: f16x2 of kq for channels (2i, 2i + 1)
  uint32_t* ps;   // [VG, 2 parts, R, vt / 2]: f16x2 of ps for tokens (2i, 2i + 1)
  float* sc;      // [R, vt]: logits, then weights
  float* vb;      // [R, VG]: sum_t weight * value zero, over the chunk so far
  float* red;     // [R, D]: the chunk's output
  float* m;       // [R]
  float* l;       // [R]
  float* factor;  // [R]
  float* misc;    // [8]: |q| max per warp in [0, 4)
};

__host__ __device__ inline int64_t KiviSmemBytes(const DecodeKernelParams& p) {
  const int64_t R = kKiviRows, vt = p.view_tokens, d = p.head_dim;
  const int64_t VG = d / kKiviValueChannels;
  int64_t b = 2 * Align16(p.page_buffer_bytes);
  b += Align16(d * R * 4) + Align16(int64_t{kWarps} * 2 * R * d * 2);
  b += Align16(VG * 2 * R * vt * 2) + Align16(R * vt * 4);
  b += Align16(R * VG * 4) + Align16(R * d * 4) + 3 * Align16(R * 4) + Align16(8 * 4);
  return b;
}

template <class K, int D>
__device__ __forceinline__ KiviSmem CarveKivi(uint8_t* base, const DecodeKernelParams& p) {
  constexpr int R = kKiviRows;
  const int64_t vt = p.view_tokens;
  KiviSmem s;
  SmemCursor take{base};
  s.page_stride = Align16(p.page_buffer_bytes);
  s.pages = take(2 * s.page_stride);
  s.q = reinterpret_cast<float*>(take(D * R * 4));
  s.kq = reinterpret_cast<uint32_t*>(take(int64_t{kWarps} * 2 * R * D * 2));
  s.ps = reinterpret_cast<uint32_t*>(take(K::kVGroups * 2 * R * vt * 2));
  s.sc = reinterpret_cast<float*>(take(R * vt * 4));
  s.vb = reinterpret_cast<float*>(take(R * K::kVGroups * 4));
  s.red = reinterpret_cast<float*>(take(R * D * 4));
  s.m = reinterpret_cast<float*>(take(R * 4));
  s.l = reinterpret_cast<float*>(take(R * 4));
  s.factor = reinterpret_cast<float*>(take(R * 4));
  s.misc = reinterpret_cast<float*>(take(8 * 4));
  return s;
}

__device__ __forceinline__ float Lane4(const float4& a, int r) {
  return r == 0 ? a.x : r == 1 ? a.y : r == 2 ? a.z : a.w;
}

// Row `warp`'s online-softmax step over the n logits in sc (weights replace them), and the
// row's vb. With value meta (a page), vb gains sum_t w vz.
template <class K, bool kPage>
__device__ __forceinline__ void KiviSoftmax(const KiviSmem& s, int vt, int n, const uint16_t* vm,
                                            int page_tokens) {
  constexpr int VG = K::kVGroups;
  const int r = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* x = s.sc + r * vt;
  float mx = -INFINITY;
  for (int t = lane; t < n; t += 32) mx = fmaxf(mx, x[t]);
  mx = WarpMax(mx);
  const float m_old = s.m[r], m_new = fmaxf(m_old, mx);
  float sum = 0.f, zs[VG];
#pragma unroll
  for (int h = 0; h < VG; ++h) zs[h] = 0.f;
  for (int t = lane; t < n; t += 32) {
    const float logit = x[t];
    const bool live = logit != -INFINITY;
    const float w = live ? expf(logit - m_new) : 0.f;
    x[t] = w;
    sum += w;
    if constexpr (kPage) {
#pragma unroll
      for (int h = 0; h < VG; ++h) {
        zs[h] += live ? w * HalfBits(vm[(VG + h) * page_tokens + t]) : 0.f;
      }
    }
  }
  sum = WarpSum(sum);
  if constexpr (kPage) {
#pragma unroll
    for (int h = 0; h < VG; ++h) zs[h] = WarpSum(zs[h]);
  }
  // Every lane has read s.m[r] above; lane 0 overwrites it below.
  __syncwarp();
  if (lane == 0) {
    const float f = m_new == -INFINITY ? 1.f : expf(m_old - m_new);
    s.factor[r] = f;
    s.l[r] = s.l[r] * f + sum;
    s.m[r] = m_new;
#pragma unroll
    for (int h = 0; h < VG; ++h) s.vb[r * VG + h] = s.vb[r * VG + h] * f + zs[h];
  }
}

// The value accumulators of a warp: kValueTiles tiles of 16 channels x 8 columns (4 rows, hi and
// lo part), PTX's accumulator layout.
template <class K>
using KiviAcc = float[K::kValueTiles][4];

// One page in shared memory: its n slots (page_tokens in the layout) into the running softmax
// and the value accumulators. Ends synchronized.
template <class K, int D>
__device__ __forceinline__ void KiviPage(const DecodeKernelParams& p, const KiviSmem& s,
                                         const uint8_t* page, int n, int rows_here, float* logits,
                                         int row0, KiviAcc<K>& acc) {
  constexpr int R = kKiviRows, P = K::kP, VG = K::kVGroups, B = 8 / P, G = kKiviKeyTokens;
  const KvPageLayout& L = p.tiers[0].layout;
  const int NL = L.tokens, vt = p.view_tokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const int part = g / 4, brow = g % 4;  // this lane's B column: (hi or lo part, row)

  // ---- Keys: warp w takes token groups w, w + 4, ...
  const uint16_t* km = reinterpret_cast<const uint16_t*>(page + L.k_meta);
  const uint64_t* valid = reinterpret_cast<const uint64_t*>(page + L.valid);
  uint32_t* kq = s.kq + warp * (2 * R * D / 2);
  const float qmax = fmaxf(fmaxf(s.misc[0], s.misc[1]), fmaxf(s.misc[2], s.misc[3]));
  const int groups = (n + G - 1) / G;
  for (int gi = warp; gi < groups; gi += kWarps) {
    // kq in fp16 parts, scaled by 2^e (e from the largest |q| * |ks|), and kb.
    const uint32_t* ks2 = reinterpret_cast<const uint32_t*>(km + gi * 2 * D);
    const uint32_t* kz2 = reinterpret_cast<const uint32_t*>(km + gi * 2 * D + D);
    uint32_t ksw[D / 64];
    float kmax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      ksw[j] = ks2[lane + 32 * j];  // channels 2 (lane + 32 j) and + 1
      kmax = fmaxf(kmax, fmaxf(fabsf(LowHalf(ksw[j])), fabsf(LowHalf(ksw[j] >> 16))));
    }
    kmax = WarpMax(kmax);
    const int e = ScaleExponent(kmax * qmax);
    float bias[R] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      const int c = 2 * (lane + 32 * j);
      // Code positions: channel c sits B * (c % P) bits up in its byte.
      const float s0 = LowHalf(ksw[j]) * Pow2Bits(e - B * (c % P));
      const float s1 = LowHalf(ksw[j] >> 16) * Pow2Bits(e - B * ((c + 1) % P));
      const uint32_t z = kz2[lane + 32 * j];
      const float z0 = LowHalf(z), z1 = LowHalf(z >> 16);
      const float4 q0 = *reinterpret_cast<const float4*>(s.q + c * R);
      const float4 q1 = *reinterpret_cast<const float4*>(s.q + (c + 1) * R);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint32_t hi, lo;
        SplitHalf2(Lane4(q0, r) * s0, Lane4(q1, r) * s1, &hi, &lo);
        kq[(0 * R + r) * (D / 2) + c / 2] = hi;
        kq[(1 * R + r) * (D / 2) + c / 2] = lo;
        bias[r] = fmaf(Lane4(q0, r), z0, fmaf(Lane4(q1, r), z1, bias[r]));
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) bias[r] = WarpSum(bias[r]);
    __syncwarp();

    // Logits of the group's 32 tokens: M tile 0 rows (g, g + 8) are tokens (4g, 4g + 1), tile
    // 1 rows are (4g + 2, 4g + 3); K pairs tq and tq + 4 are key bytes q0 + tq and q0 + tq + 4.
    const uint8_t* tile = page + L.k_codes + gi * (G * K::kRowBytes) + 4 * g;
    const uint32_t* kqb = kq + (part * R + brow) * (D / 2);
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int bg = 0; bg < K::kKeyByteGroups; ++bg) {
      const int q0 = 8 * bg;
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(tile + (q0 + tq) * G);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(tile + (q0 + tq + 4) * G);
      uint32_t xa[4], xb[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        xa[k] = __byte_perm(wa, 0, k * 0x1111);  // byte k of the word in every byte
        xb[k] = __byte_perm(wb, 0, k * 0x1111);
      }
#pragma unroll
      for (int j = 0; j < P / 2; ++j) {
        // K pair (2 kp, 2 kp + 1) is channels P (q0 + kp) + 2 j and + 1.
        const int lo = B * 2 * j, hi = B * (2 * j + 1);
        const uint32_t a0[4] = {CodePair<B>(xa[0], lo, hi), CodePair<B>(xa[1], lo, hi),
                                CodePair<B>(xb[0], lo, hi), CodePair<B>(xb[1], lo, hi)};
        const uint32_t a1[4] = {CodePair<B>(xa[2], lo, hi), CodePair<B>(xa[3], lo, hi),
                                CodePair<B>(xb[2], lo, hi), CodePair<B>(xb[3], lo, hi)};
        const uint32_t b[2] = {kqb[(P * (q0 + tq) + 2 * j) / 2],
                               kqb[(P * (q0 + tq + 4) + 2 * j) / 2]};
        MmaF16(d0, a0, b);
        MmaF16(d1, a1, b);
      }
    }
    // Columns (2 tq, 2 tq + 1) hold part tq / 2 of rows 2 (tq % 2) and + 1: add the other part.
    float sum[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sum[i] = d0[i] + __shfl_xor_sync(0xffffffffu, d0[i], 2);
      sum[4 + i] = d1[i] + __shfl_xor_sync(0xffffffffu, d1[i], 2);
    }
    if (tq < 2) {
      const float unscale = Pow2Bits(-e);
      // This lane's rows 2 tq and 2 tq + 1 (selected, not indexed: registers stay registers).
      const float kb[2] = {tq == 0 ? bias[0] : bias[2], tq == 0 ? bias[1] : bias[3]};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        // i: tile i / 4; within it rows g (i % 4 < 2) or g + 8, column 2 tq + i % 2.
        const int t = gi * G + 4 * g + 2 * (i / 4) + (i % 4) / 2, r = 2 * tq + i % 2;
        const bool live = t < n && ((valid[t >> 6] >> (t & 63)) & 1);
        const float x = live && r < rows_here ? fmaf(sum[i], unscale, kb[i % 2]) : -INFINITY;
        s.sc[r * vt + t] = x;
        if (logits != nullptr && r < rows_here && t < n) {
          logits[static_cast<int64_t>(t) * p.rows + row0 + r] = x;
        }
      }
    }
    __syncwarp();
  }
  // The logits of every key group are in sc before any softmax row reads them.
  __syncthreads();

  // ---- Softmax per row.
  const uint16_t* vm = reinterpret_cast<const uint16_t*>(page + L.v_meta);
  KiviSoftmax<K, true>(s, vt, n, vm, NL);
  __syncthreads();

  // ---- ps in fp16 parts, two tokens per thread, zero past the slots up to a multiple of 16.
  // Unscaled: a weight is at most 1, so ps is at most the value scale, an fp16 itself; parts
  // below fp16's normal range keep an absolute error under 2^-25.
  const int pairs = (n + 15) / 16 * 8;
  for (int i = threadIdx.x; i < pairs; i += kDecodeThreads) {
    const int t = 2 * i;
    float w0[R], w1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      w0[r] = t < n ? s.sc[r * vt + t] : 0.f;
      w1[r] = t + 1 < n ? s.sc[r * vt + t + 1] : 0.f;
    }
#pragma unroll
    for (int h = 0; h < VG; ++h) {
      const uint32_t vs = t < n ? *reinterpret_cast<const uint32_t*>(vm + h * NL + t) : 0u;
      const float v0 = LowHalf(vs), v1 = LowHalf(vs >> 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint32_t hi, lo;
        // A dead slot's weight is 0 and its scale may be anything: keep it out.
        SplitHalf2(w0[r] > 0.f ? w0[r] * v0 : 0.f, w1[r] > 0.f ? w1[r] * v1 : 0.f, &hi, &lo);
        s.ps[((h * 2 + 0) * R + r) * (vt / 2) + i] = hi;
        s.ps[((h * 2 + 1) * R + r) * (vt / 2) + i] = lo;
      }
    }
  }
  __syncthreads();

  // ---- Values: warp w takes 16-token slices w, w + 4, ... First the softmax factor on the
  // accumulators (column 2 tq + i % 2 is row (2 tq + i % 2) % 4).
  {
    const float f0 = s.factor[(2 * tq) % 4], f1 = s.factor[(2 * tq + 1) % 4];
#pragma unroll
    for (int mt = 0; mt < K::kValueTiles; ++mt) {
      acc[mt][0] *= f0;
      acc[mt][1] *= f1;
      acc[mt][2] *= f0;
      acc[mt][3] *= f1;
    }
  }
  const uint8_t* vc = page + L.v_codes + 4 * g;
  const int slices = (n + 15) / 16;
  for (int sl = warp; sl < slices; sl += kWarps) {
    // K pairs tq and tq + 4 are tokens (2 tq, 2 tq + 1) and (2 tq + 8, 2 tq + 9) of the slice.
    const int t0 = 16 * sl + 2 * tq;
#pragma unroll
    for (int col = 0; col < K::kValueColumns; ++col) {
      const uint8_t* at = vc + 32 * col;
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(at + t0 * K::kRowBytes);
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(at + (t0 + 1) * K::kRowBytes);
      const uint32_t w2 = *reinterpret_cast<const uint32_t*>(at + (t0 + 8) * K::kRowBytes);
      const uint32_t w3 = *reinterpret_cast<const uint32_t*>(at + (t0 + 9) * K::kRowBytes);
      uint32_t x01[4], x23[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // Byte k of the first token in bytes 0-1, of the second in bytes 2-3.
        const uint32_t sel = k * 0x11 + (4 + k) * 0x1100;
        x01[k] = __byte_perm(w0, w1, sel);
        x23[k] = __byte_perm(w2, w3, sel);
      }
#pragma unroll
      for (int c = 0; c < P; ++c) {
        // Channels 32 col + 4 g + k + c RB: value group col + c RB / 32.
        const int h = col + c * K::kRowBytes / 32;
        const uint32_t* psb = s.ps + ((h * 2 + part) * R + brow) * (vt / 2);
        const uint32_t b[2] = {psb[t0 / 2], psb[t0 / 2 + 4]};
#pragma unroll
        for (int k0 = 0; k0 < 4; k0 += 2) {
          // Tile rows g and g + 8: channels with byte k0 and k0 + 1.
          const uint32_t a[4] = {
              CodePair<B>(x01[k0], B * c, B * c), CodePair<B>(x01[k0 + 1], B * c, B * c),
              CodePair<B>(x23[k0], B * c, B * c), CodePair<B>(x23[k0 + 1], B * c, B * c)};
          MmaF16(acc[(col * P + c) * 2 + k0 / 2], a, b);
        }
      }
    }
  }
  __syncthreads();
}

// After a KIVI chunk's pages: the accumulators into shared memory, the recent tokens, the
// chunk's partial state. Takes what it needs afresh from the chunk (fewer registers live across
// the page loop).
template <class K, int D>
__device__ __forceinline__ void KiviFinish(const DecodeKernelParams& p, const KiviSmem& s,
                                           KiviAcc<K>& acc) {
  constexpr int R = kKiviRows, P = K::kP, VG = K::kVGroups, B = 8 / P, GV = kKiviValueChannels;
  const DecodeChunk chunk = p.chunks[blockIdx.x];
  const int row0 = blockIdx.y * R, rows_here = min(R, p.rows - row0);
  const int b = chunk.bh / p.kv_heads, kvh = chunk.bh % p.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int vt = p.view_tokens;
  float* logits = p.logits == nullptr
                      ? nullptr
                      : p.logits + static_cast<int64_t>(p.key_offsets[chunk.bh]) * p.rows;

  // The warps' accumulators into red, in value units: tile (col, c, k0 / 2) rows g and g + 8
  // are channels 32 col + 4 g + k0 (+ 1) + c RB, scaled by 2^(B c); columns 2 tq + i % 2 are
  // part tq / 2 of row (2 tq + i % 2) % 4.
  {
    const int g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int col = 0; col < K::kValueColumns; ++col) {
#pragma unroll
      for (int c = 0; c < P; ++c) {
#pragma unroll
        for (int k0 = 0; k0 < 4; k0 += 2) {
          const float* d = acc[(col * P + c) * 2 + k0 / 2];
          const int ch = 32 * col + 4 * g + k0 + c * K::kRowBytes;
          const float u = Pow2(-B * c);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = (2 * tq + i % 2) % 4;
            atomicAdd(&s.red[r * D + ch + i / 2], d[i] * u);
          }
        }
      }
    }
  }
  __syncthreads();

  // The recent (fp32) tokens, kRecentView at a time: causal per query token.
  if (chunk.recent_begin >= 0) {
    // The last recent key each row sees.
    const int rcount = static_cast<int>(p.recent_offsets[b + 1] - p.recent_offsets[b]);
    int limit[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      limit[r] = r < rows_here ? rcount - p.q_tokens + (row0 + r) / p.group : -1;
    }
    const float* recent_k = p.recent_k[b];
    const float* recent_v = p.recent_v[b];
    const int key0 = p.key_offsets[chunk.bh + 1] - p.key_offsets[chunk.bh] - rcount;
    for (int i0 = chunk.recent_begin; i0 < chunk.recent_end; i0 += kRecentView) {
      const int n = min(chunk.recent_end - i0, kRecentView);
      for (int j = warp; j < n; j += kWarps) {
        const float* k = recent_k + (static_cast<int64_t>(i0 + j) * p.kv_heads + kvh) * D;
        float a[R] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < D / 32; ++i) {
          const int c = lane + 32 * i;
          const float x = k[c];
          const float4 qv = *reinterpret_cast<const float4*>(s.q + c * R);
#pragma unroll
          for (int r = 0; r < R; ++r) a[r] = fmaf(Lane4(qv, r), x, a[r]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float x = WarpSum(a[r]);
          const float logit = i0 + j <= limit[r] ? x : -INFINITY;
          if (lane == 0) {
            s.sc[r * vt + j] = logit;
            if (logits != nullptr && r < rows_here) {
              logits[static_cast<int64_t>(key0 + i0 + j) * p.rows + row0 + r] = logit;
            }
          }
        }
      }
      __syncthreads();
      KiviSoftmax<K, false>(s, vt, n, nullptr, 0);
      __syncthreads();
      if (threadIdx.x < D) {
        const int c = threadIdx.x;
        float o[R];
#pragma unroll
        for (int r = 0; r < R; ++r) o[r] = s.red[r * D + c] * s.factor[r];
        for (int t = 0; t < n; ++t) {
          const float x = recent_v[(static_cast<int64_t>(i0 + t) * p.kv_heads + kvh) * D + c];
#pragma unroll
          for (int r = 0; r < R; ++r) o[r] = fmaf(s.sc[r * vt + t], x, o[r]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) s.red[r * D + c] = o[r];
      }
      __syncthreads();
    }
  }

  // The chunk's partial state.
  if (threadIdx.x < D) {
    const int c = threadIdx.x;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows_here) {
        p.part_acc[(static_cast<int64_t>(blockIdx.x) * p.rows + row0 + r) * D + c] =
            s.red[r * D + c] + s.vb[r * VG + c / GV];
      }
    }
  }
  if (threadIdx.x < rows_here) {
    p.part_m[static_cast<int64_t>(blockIdx.x) * p.rows + row0 + threadIdx.x] = s.m[threadIdx.x];
    p.part_l[static_cast<int64_t>(blockIdx.x) * p.rows + row0 + threadIdx.x] = s.l[threadIdx.x];
  }
}

// At least 4 blocks per SM (128 registers a thread at most): ptxas otherwise aims low and
// spills.
template <int D, int B, int G, int GV>
__global__ void __launch_bounds__(kDecodeThreads, 4)
    KiviChunkKernel(const __grid_constant__ DecodeKernelParams p) {
  using K = Kivi<D, B, G, GV>;
  constexpr int R = kKiviRows, VG = K::kVGroups;
  SLUICE_DYNAMIC_SHARED(smem_raw, uint8_t);
  const KiviSmem s = CarveKivi<K, D>(smem_raw, p);
  const DecodeChunk chunk = p.chunks[blockIdx.x];
  const int row0 = blockIdx.y * R, rows_here = min(R, p.rows - row0);
  const int b = chunk.bh / p.kv_heads, kvh = chunk.bh % p.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The rows' queries, pre-scaled, as [D, R]; one thread per channel; |q| max per warp.
  static_assert(D <= kDecodeThreads, "a thread per channel");
  float qabs = 0.f;
  if (threadIdx.x < D) {
    const int c = threadIdx.x;
    float x[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = row0 + r, tq = row / p.group, h = kvh * p.group + row % p.group;
      x[r] =
          r < rows_here
              ? p.q[((static_cast<int64_t>(b) * p.q_tokens + tq) * p.heads + h) * D + c] * p.scale
              : 0.f;
      qabs = fmaxf(qabs, fabsf(x[r]));
      s.red[r * D + c] = 0.f;
    }
    *reinterpret_cast<float4*>(s.q + c * R) = make_float4(x[0], x[1], x[2], x[3]);
  }
  qabs = WarpMax(qabs);
  if (lane == 0) s.misc[warp] = qabs;
  if (threadIdx.x < R) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.f;
  }
  if (threadIdx.x < R * VG) s.vb[threadIdx.x] = 0.f;
  KiviAcc<K> acc;
#pragma unroll
  for (int mt = 0; mt < K::kValueTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = 0.f;
  }
  __syncthreads();

  float* logits = p.logits == nullptr
                      ? nullptr
                      : p.logits + static_cast<int64_t>(p.key_offsets[chunk.bh]) * p.rows;
  const int load_bytes = p.tiers[0].load_bytes;
  if (chunk.page_begin < chunk.page_end) {
    LoadPage(s.pages, p.pages[chunk.page_begin].data, load_bytes);
  }
  int key_base = chunk.key_base;
  for (int pi = chunk.page_begin; pi < chunk.page_end; ++pi) {
    const int buf = (pi - chunk.page_begin) & 1;
    if (pi + 1 < chunk.page_end) {
      LoadPage(s.pages + (buf ^ 1) * s.page_stride, p.pages[pi + 1].data, load_bytes);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    const int n = p.pages[pi].slots;
    KiviPage<K, D>(p, s, s.pages + buf * s.page_stride, n, rows_here,
                   logits ? logits + static_cast<int64_t>(key_base) * p.rows : nullptr, row0, acc);
    key_base += n;
  }
  KiviFinish<K, D>(p, s, acc);
}

// Calls f(kernel, shared bytes) with the chunk kernel `k` names for `p`, the kernel allowed
// that much shared memory past 48 KiB: the generic kernel for 1, 2, 4 or 8 rows, or a KIVI
// instantiation (head_dim 128 at 2 or 4 bits, 64 at 4).
template <typename F>
cudaError_t WithChunkKernel(const DecodeKernelParams& p, DecodeKernelChoice k, F&& f) {
  const auto go = [&](auto kernel, int64_t smem) {
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (e != cudaSuccess) return e;
    }
    return f(kernel, smem);
  };
  constexpr int G = kKiviKeyTokens, GV = kKiviValueChannels;
  if (k.kivi_bits != 0) {
    const int64_t smem = KiviSmemBytes(p);
    if (p.head_dim == 128 && k.kivi_bits == 4) return go(KiviChunkKernel<128, 4, G, GV>, smem);
    if (p.head_dim == 128 && k.kivi_bits == 2) return go(KiviChunkKernel<128, 2, G, GV>, smem);
    if (p.head_dim == 64 && k.kivi_bits == 4) return go(KiviChunkKernel<64, 4, G, GV>, smem);
    return cudaErrorInvalidValue;
  }
  const int64_t smem = SmemBytes(p, k.rows_per_block);
  switch (k.rows_per_block) {
    case 1:
      return go(ChunkKernel<1>, smem);
    case 2:
      return go(ChunkKernel<2>, smem);
    case 4:
      return go(ChunkKernel<4>, smem);
    case 8:
      return go(ChunkKernel<8>, smem);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

DecodeKernelChoice ChooseDecodeKernel(const DecodeTier* tiers, int tier_count, int d, int rows) {
  DecodeKernelChoice k;
  if (tier_count == 1 && !tiers[0].huffman) {
    const KvQuantSpec& ks = tiers[0].format.k;
    const KvQuantSpec& vs = tiers[0].format.v;
    const bool kivi = ks.codec == KvCodec::kInt && ks.grouping == KvGrouping::kPerChannel &&
                      ks.group == kKiviKeyTokens && vs.codec == KvCodec::kInt &&
                      vs.grouping == KvGrouping::kPerToken && vs.group == kKiviValueChannels &&
                      ks.bits == vs.bits &&
                      // Value rows of whole 32-byte columns: 128 channels at 2 or 4 bits, 64 at 4.
                      ((d == 128 && (ks.bits == 2 || ks.bits == 4)) || (d == 64 && ks.bits == 4)) &&
                      tiers[0].layout.k_tile == kKiviKeyTokens;
    if (kivi) {
      k.kivi_bits = ks.bits;
      k.rows_per_block = kKiviRows;
      return k;
    }
  }
  // The generic kernel: the smallest of 1, 2, 4, 8 rows that holds a kv-head's rows, else 8.
  while (k.rows_per_block < 8 && k.rows_per_block < rows) k.rows_per_block *= 2;
  return k;
}

size_t DecodeSharedBytes(const DecodeKernelParams& p, DecodeKernelChoice k) {
  return static_cast<size_t>(k.kivi_bits != 0 ? KiviSmemBytes(p) : SmemBytes(p, k.rows_per_block));
}

cudaError_t DecodeBlocksPerSm(const DecodeKernelParams& p, DecodeKernelChoice k, int* blocks) {
  return WithChunkKernel(p, k, [&](auto kernel, int64_t smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kDecodeThreads,
                                                         static_cast<size_t>(smem));
  });
}

cudaError_t LaunchDecodeAttention(const DecodeKernelParams& p, DecodeKernelChoice k,
                                  cudaStream_t stream) {
  const cudaError_t e = WithChunkKernel(p, k, [&](auto kernel, int64_t smem) {
    const dim3 grid(p.chunk_count, (p.rows + k.rows_per_block - 1) / k.rows_per_block);
    SLUICE_LAUNCH(grid, kDecodeThreads, smem, stream, kernel)(p);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  SLUICE_LAUNCH(p.bh_count, 256, 0, stream, MergeKernel)(p);
  return cudaGetLastError();
}

cudaError_t LaunchDecodeScores(const DecodeKernelParams& p, int64_t max_keys, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((max_keys + 127) / 128), p.bh_count);
  SLUICE_LAUNCH(grid, 128, 0, stream, ScoreKernel)(p);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
