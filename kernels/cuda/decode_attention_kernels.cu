#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decode_attention_kernels.h"
#include "kernels/cuda/launch.cuh"

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

__device__ __forceinline__ Smem CarveSmem(uint8_t* base, const DecodeKernelParams& p, int rows) {
  Smem s;
  uint8_t* at = base;
  auto take = [&](int64_t bytes) {
    uint8_t* r = at;
    at += Align16(bytes);
    return r;
  };
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
  int key_base;  // key index of token 0 within the bh's keys
};

__device__ __forceinline__ bool Live(const View& v, int t) {
  const int b = v.valid_shift + t;
  return (v.valid[b >> 6] >> (b & 63)) & 1;
}

// Converts the view's K and V meta segments to floats: K at meta[0, kh), V at meta[kh, ...).
__device__ __forceinline__ void ConvertMeta(const View& v, int d, float* meta, int* k_halves) {
  const int kh = KvMetaHalves(v.f->k, d, v.l->tokens);
  const int vh = KvMetaHalves(v.f->v, d, v.l->tokens);
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
    const int bits = ks.bits, per = 8 / bits, mask = (1 << bits) - 1;
    const int T = v.l->k_tile, rb = v.l->k_row_bytes;
    const int gs = ks.group == 0 ? d : ks.group;
    for (int t = threadIdx.x; t < v.n; t += kDecodeThreads) {
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.f;
      const uint8_t* tile = codes + (t / T) * T * rb + (t % T);
      if (ks.grouping == KvGrouping::kPerToken) {
        const int groups = d / gs;
        for (int gi = 0; gi < groups; ++gi) {
          float part[R];
#pragma unroll
          for (int r = 0; r < R; ++r) part[r] = 0.f;
          for (int c = gi * gs; c < (gi + 1) * gs; c += per) {
            const uint32_t byte = tile[(c / per) * T];
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
            if (gs % 8 == 0) {
              for (int j = 0; j < gs / 8; ++j) qs += s.qsum[r * (d / 8) + gi * (gs / 8) + j];
            } else {
              for (int c = gi * gs; c < (gi + 1) * gs; ++c) qs += s.q[r * d + c];
            }
            acc[r] += scale * part[r] + zero * qs;
          }
        }
      } else {
        const int bc = ks.grouping == KvGrouping::kBlock ? ks.block_channels : 1;
        const int blocks = d / bc;
        const float* ms = kmeta + (t / gs) * 2 * blocks;
        const float* mz = ms + blocks;
        for (int c = 0; c < d; c += per) {
          const uint32_t byte = tile[(c / per) * T];
          for (int e = 0; e < per; ++e) {
            const int ch = c + e;
            const float x =
                fmaf(CodeToFloat((byte >> (e * bits)) & mask), ms[ch / bc], mz[ch / bc]);
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
  const int gs = ks.group == 0 ? d : ks.group;
  for (int t = warp; t < v.n; t += kWarps) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int c = lane; c < d; c += 32) {
      float x;
      if (ks.codec == KvCodec::kF16) {
        x = HalfBits(reinterpret_cast<const uint16_t*>(codes + t * v.l->k_row_bytes)[c]);
      } else {
        x = Fp8ToFloat(codes[t * v.l->k_row_bytes + c]) * kmeta[(c / gs) * N + t];
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
    if (lane == 0) {
      const float f = m_new == -INFINITY ? 1.f : expf(m_old - m_new);
      s.factor[r] = f;
      s.l[r] = s.l[r] * f + sum;
      s.m[r] = m_new;
    }
  }
}

__device__ __forceinline__ void RescaleAcc(const Smem& s, int rows, int d) {
  for (int i = threadIdx.x; i < rows * d; i += kDecodeThreads) s.acc[i] *= s.factor[i / d];
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
  const int gs = vs.group == 0 ? d : vs.group, groups = d / gs;
  const bool is_int = vs.codec == KvCodec::kInt;
  const int cols = is_int ? rb : d;
  const int per = is_int ? 8 / vs.bits : 1;
  const int bits = is_int ? vs.bits : 8, mask = (1 << bits) - 1;
  const int splits = max(1, kDecodeThreads / cols);
  for (int item = threadIdx.x; item < cols * splits; item += kDecodeThreads) {
    const int col = item % cols, split = item / cols;
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
          const int gi = (col + e * rb) / gs;
          const float x = fmaf(CodeToFloat((byte >> (e * bits)) & mask), vmeta[gi * N + t],
                               vmeta[(groups + gi) * N + t]);
#pragma unroll
          for (int r = 0; r < R; ++r) a[r][e] = fmaf(w[r], x, a[r][e]);
        }
      } else {
        const float x = vs.codec == KvCodec::kF16
                            ? HalfBits(reinterpret_cast<const uint16_t*>(codes + t * rb)[col])
                            : Fp8ToFloat(codes[t * rb + col]) * vmeta[(col / gs) * N + t];
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
  RescaleAcc(s, R, p.head_dim);
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
  const int64_t base = p.recent_offsets[b];
  const int n = i1 - i0;
  for (int j = warp; j < n; j += kWarps) {
    const int i = i0 + j;
    const float* k = p.recent_k + ((base + i) * p.kv_heads + kvh) * d;
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
      const int row = row0 + r, tq = row / p.group;
      const bool visible = r < rows_here && i <= rcount - p.q_tokens + tq;
      if (lane == 0) s.sc[r * vt + j] = visible ? x : -INFINITY;
    }
  }
  __syncthreads();
  SoftmaxView<R>(p, s, n, logits ? logits + static_cast<int64_t>(key_base + i0) * p.rows : nullptr,
                 row0);
  __syncthreads();
  RescaleAcc(s, R, d);
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kDecodeThreads) {
    float a[R];
#pragma unroll
    for (int r = 0; r < R; ++r) a[r] = 0.f;
    for (int j = 0; j < n; ++j) {
      const float x = p.recent_v[((base + i0 + j) * p.kv_heads + kvh) * d + c];
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

// 32 bits of a bitstream starting at bit `pos` (the stream's words 4-byte aligned).
__device__ __forceinline__ uint32_t BitWindow(const uint32_t* words, uint32_t pos) {
  return __funnelshift_r(words[pos >> 5], words[(pos >> 5) + 1], pos & 31);
}

// Decodes unit `index` of the Huffman-coded page `page` (shared memory) into `unit`: one thread
// per stream (4 K, 4 V), the others copy the unit's meta. Branch-free: one table lookup and
// one add per symbol.
__device__ __forceinline__ void DecodeUnit(const DecodeTier& tier, int d, const uint8_t* page,
                                           int index, uint8_t* unit) {
  const KvPageLayout& l = tier.layout;
  const KvPageLayout& ul = tier.unit_layout;
  const int n = d * l.unit_tokens / kKvHuffmanStreams;
  const uint32_t* streams = reinterpret_cast<const uint32_t*>(page + l.streams) + index * 8;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(page + l.bitstream);
  if (threadIdx.x < 2 * kKvHuffmanStreams) {
    const int st = threadIdx.x;
    const bool key = st < kKvHuffmanStreams;
    const uint16_t* table = key ? tier.k_table : tier.v_table;
    const uint32_t mask = (1u << (key ? tier.k_table_bits : tier.v_table_bits)) - 1;
    uint8_t* out = unit + (key ? ul.k_codes + st * n : ul.v_codes + (st - 4) * n);
    uint32_t pos = streams[st];
    for (int i = 0; i < n; ++i) {
      const uint32_t e = __ldg(table + (BitWindow(words, pos) & mask));
      out[i] = static_cast<uint8_t>(e & 0xff);
      pos += e >> 8;
    }
  } else {
    const uint8_t* meta = page + l.unit_meta + index * l.unit_meta_bytes;
    const int kb = l.unit_k_meta_bytes;
    for (int i = threadIdx.x - 8; i < l.unit_meta_bytes; i += kDecodeThreads - 8) {
      if (i < kb) {
        unit[ul.k_meta + i] = meta[i];
      } else {
        unit[ul.v_meta + i - kb] = meta[i];
      }
    }
  }
}

template <int R>
__global__ void __launch_bounds__(kDecodeThreads)
    ChunkKernel(const __grid_constant__ DecodeKernelParams p) {
  SLUICE_DYNAMIC_SHARED(smem_raw, uint8_t);
  const Smem s = CarveSmem(smem_raw, p, R);
  const DecodeChunk chunk = p.chunks[blockIdx.x];
  const int row0 = blockIdx.y * R;
  const int rows_here = min(R, p.rows - row0);
  const int d = p.head_dim;
  const int b = chunk.bh / p.kv_heads, kvh = chunk.bh % p.kv_heads;

  for (int i = threadIdx.x; i < R * d; i += kDecodeThreads) {
    const int r = i / d, c = i % d, row = row0 + r;
    float x = 0.f;
    if (r < rows_here) {
      const int tq = row / p.group, h = kvh * p.group + row % p.group;
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
    const int r = i / (d / 8), j = i % (d / 8);
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
        const View v{page, &tier.format, &tier.layout, ref.slots, valid, 0, key_base};
        RunView<R>(p, s, v, rows_here, logits, row0);
      } else {
        const int u = tier.layout.unit_tokens;
        // Pages are written in whole units; a page list may still count fewer slots of the
        // last one (the rest then stay out of attention, as on the host).
        for (int index = 0; index * u < ref.slots; ++index) {
          DecodeUnit(tier, d, page, index, s.unit);
          __syncthreads();
          const View v{
              s.unit, &tier.unit_format, &tier.unit_layout,   min(u, ref.slots - index * u),
              valid,  index * u,         key_base + index * u};
          RunView<R>(p, s, v, rows_here, logits, row0);
        }
      }
      key_base += ref.slots;
    }
  }
  // The chunk's partial state.
  for (int i = threadIdx.x; i < rows_here * d; i += kDecodeThreads) {
    const int r = i / d, c = i % d;
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
__global__ void ScoreKernel(const __grid_constant__ DecodeKernelParams p, int64_t total_slots,
                            int64_t recent) {
  const int bh = blockIdx.y, kvh = bh % p.kv_heads;
  const int k0 = p.key_offsets[bh], keys = p.key_offsets[bh + 1] - k0;
  const int paged = p.slot_offsets[bh + 1] - p.slot_offsets[bh];
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= keys) return;
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
      p.page_scores[gi * total_slots + p.slot_offsets[bh] + j] += sum;
    } else {
      const int64_t row = p.scores_per_head ? kvh * p.group + gi : kvh;
      p.recent_scores[row * recent + (j - paged)] += sum;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The KIVI kernel: one page format, every size a compile-time constant (FlashInfer's decode
// dispatch: the runtime sizes pick an instantiation).
//
// Keys are B-bit codes per channel over G-token groups (the group is the key tile: byte
// q * G + t of a tile holds channels q * P + s of its token t at bits s * B, P = 8 / B); values
// are B-bit codes per token with a scale and zero per GV channels (byte j of a token's row holds
// channels j + s * RB, RB = D * B / 8). Scales and zeros leave the inner loops:
//   logit[r, t] = sum_c q[r, c] (kz[g, c] + ks[g, c] code[c, t])         (g: t's token group)
//               = sum_c qs[g, c, r] code[c, t] + kb[g, r],    qs = q ks,  kb = sum_c q kz
//   out[r, c]   = sum_t w[r, t] (vz[t, g] + vs[t, g] code[t, c])         (g: c's channel group)
//               = sum_t ps[t, g, r] code[t, c] + vb[r, g],    ps = w vs,  vb = sum_t w vz
// so the page loops hold only FMAs and the code-to-float conversion, which is exact and costs
// one LOP3 and one FADD: a code at bits [o, o + B) of a 32-bit word with o + B <= 23, masked
// and ORed into the bits of 2^23, is the float 2^23 + code * 2^o; subtracting 2^23 leaves
// code * 2^o. Codes in a word's upper half are read from the word shifted right by 16, so
// o = 8 * (byte & 1) + B * s < 16, and the 2^o goes into qs (per channel), the logits (per
// token: odd bytes of a key word) and the output (per channel).
//
// Work of one block (128 threads, kKiviRows = 4 query rows) per page:
//   tables     warp w: token groups w, w + 4, ...; lanes over channels: qs and kb
//   scores     items (4 tokens, 32 channels): 4 x 4 fp32 sums, partial over the 32 channels
//   reduce     thread per token: the slices' sums + kb, masked by the valid bits
//   softmax    warp r: row r's running max and sum, weights, ps and vb
//   values     thread (32-bit word j of every row, token split): R x 4 x P fp32 sums, kept in
//              registers across pages; the splits add up once per chunk.
template <int D, int B, int G, int GV>
struct Kivi {
  static constexpr int kP = 8 / B;                         // codes per byte
  static constexpr int kRowBytes = D * B / 8;              // one token's value codes
  static constexpr int kSlices = D / 32;                   // key channel slices of an item
  static constexpr int kSliceBytes = 32 / kP;              // a slice's bytes per token
  static constexpr int kWords = kRowBytes / 4;             // 32-bit words per value row
  static constexpr int kSplits = kDecodeThreads / kWords;  // token splits of the values
  static constexpr int kVGroups = D / GV;                  // value channel groups
  static_assert(B == 2 || B == 4, "2- or 4-bit codes");
  static_assert(D % 32 == 0 && kWords > 0 && kDecodeThreads % kWords == 0, "head_dim");
  static_assert(G % 4 == 0 && GV % 4 == 0 && D % GV == 0, "groups");
  static_assert(kKiviRows == 4 && kWarps == kKiviRows, "one warp per query row, float4 rows");
};

// 2^e for |e| < 127, a constant once the loops around it are unrolled.
__host__ __device__ constexpr float Pow2(int e) {
  return e >= 0 ? static_cast<float>(1u << e) : 1.f / static_cast<float>(1u << -e);
}

// (a & b) | c in one instruction. Written as C++, ptxas splits it into two LOP3s when b and c
// are both immediates (an instruction takes one); PTX's lop3 keeps it one, with c in a register.
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return (a & b) | c;
#endif
}

// The code at bits [o, o + B) of `w` (o + B <= 23) times 2^o, exactly.
template <int B>
__device__ __forceinline__ float Field(uint32_t w, int o) {
  return __uint_as_float(AndOr(w, ((1u << B) - 1) << o, 0x4B000000u)) - 8388608.f;
}

// Bit offset of value code s of byte b in a 32-bit word (or its upper half shifted down).
template <int B>
__host__ __device__ constexpr int FieldOffset(int b, int s) {
  return (b & 1) * 8 + s * B;
}

// Shared memory of one KIVI block, in order. vt (view_tokens) is a multiple of 4, at least
// the page's slots and kRecentView.
struct KiviSmem {
  uint8_t* pages;  // [2, page_stride]
  int64_t page_stride;
  float* q;       // [D, R], pre-scaled
  float* qs;      // [groups, D, R]: q * key scale * 2^-(B * (c % P))
  float* kb;      // [groups, R]: sum_c q * key zero
  float* sc;      // [slices, R, vt]: partial logits; row r of slice 0 then the logits, weights
  float* ps;      // [vt, VG, R]: weight * value scale
  float* vb;      // [R, VG]: sum_t weight * value zero, over the chunk so far
  float* red;     // [R, D]: the chunk's output, summed over the token splits
  float* m;       // [R]
  float* l;       // [R]
  float* factor;  // [R]
};

template <class K>
__host__ __device__ inline int64_t KiviSmemBytes(const DecodeKernelParams& p, int64_t d) {
  const int64_t R = kKiviRows, groups = p.tiers[0].layout.tokens / kKiviKeyTokens;
  int64_t b = 2 * Align16(p.page_buffer_bytes);
  b += Align16(d * R * 4) + Align16(groups * d * R * 4) + Align16(groups * R * 4);
  b += Align16(K::kSlices * R * p.view_tokens * 4);
  b += Align16(int64_t{p.view_tokens} * K::kVGroups * R * 4);
  b += Align16(R * K::kVGroups * 4) + Align16(R * d * 4) + 3 * Align16(R * 4);
  return b;
}

template <class K, int D>
__device__ __forceinline__ KiviSmem CarveKivi(uint8_t* base, const DecodeKernelParams& p) {
  constexpr int R = kKiviRows;
  const int groups = p.tiers[0].layout.tokens / kKiviKeyTokens;
  KiviSmem s;
  uint8_t* at = base;
  auto take = [&](int64_t bytes) {
    uint8_t* r = at;
    at += Align16(bytes);
    return reinterpret_cast<float*>(r);
  };
  s.page_stride = Align16(p.page_buffer_bytes);
  s.pages = reinterpret_cast<uint8_t*>(take(2 * s.page_stride));
  s.q = take(D * R * 4);
  s.qs = take(int64_t{groups} * D * R * 4);
  s.kb = take(int64_t{groups} * R * 4);
  s.sc = take(int64_t{K::kSlices} * R * p.view_tokens * 4);
  s.ps = take(int64_t{p.view_tokens} * K::kVGroups * R * 4);
  s.vb = take(R * K::kVGroups * 4);
  s.red = take(R * D * 4);
  s.m = take(R * 4);
  s.l = take(R * 4);
  s.factor = take(R * 4);
  return s;
}

__device__ __forceinline__ float4 Scale4(float4 a, float x) {
  return make_float4(a.x * x, a.y * x, a.z * x, a.w * x);
}
__device__ __forceinline__ float Lane4(const float4& a, int r) {
  return r == 0 ? a.x : r == 1 ? a.y : r == 2 ? a.z : a.w;
}

// Row `warp`'s online-softmax step over the n logits in sc (weights replace them). With value
// meta (a page): ps and the row's vb term too.
template <class K, bool kPage>
__device__ __forceinline__ void KiviSoftmax(const KiviSmem& s, int vt, int n, const uint16_t* vm,
                                            int page_tokens) {
  constexpr int R = kKiviRows, VG = K::kVGroups;
  const int r = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* x = s.sc + r * vt;
  float mx = -INFINITY;
  for (int t = lane; t < n; t += 32) mx = fmaxf(mx, x[t]);
  mx = WarpMax(mx);
  const float m_old = s.m[r], m_new = fmaxf(m_old, mx);
  float sum = 0.f, zs[VG];
#pragma unroll
  for (int g = 0; g < VG; ++g) zs[g] = 0.f;
  for (int t = lane; t < n; t += 32) {
    const float logit = x[t];
    const bool live = logit != -INFINITY;
    const float w = live ? expf(logit - m_new) : 0.f;
    x[t] = w;
    sum += w;
    if constexpr (kPage) {
#pragma unroll
      for (int g = 0; g < VG; ++g) {
        const float vs = HalfBits(vm[g * page_tokens + t]);
        const float vz = HalfBits(vm[(VG + g) * page_tokens + t]);
        s.ps[(t * VG + g) * R + r] = live ? w * vs : 0.f;
        zs[g] += live ? w * vz : 0.f;
      }
    }
  }
  sum = WarpSum(sum);
  if constexpr (kPage) {
#pragma unroll
    for (int g = 0; g < VG; ++g) zs[g] = WarpSum(zs[g]);
  }
  if (lane == 0) {
    const float f = m_new == -INFINITY ? 1.f : expf(m_old - m_new);
    s.factor[r] = f;
    s.l[r] = s.l[r] * f + sum;
    s.m[r] = m_new;
#pragma unroll
    for (int g = 0; g < VG; ++g) s.vb[r * VG + g] = s.vb[r * VG + g] * f + zs[g];
  }
}

// The value accumulators [R][4 bytes][P codes] of a thread, scaled by the rows' factors.
template <class K>
__device__ __forceinline__ void KiviRescale(const KiviSmem& s, float (&acc)[kKiviRows][4][K::kP]) {
  const float4 f = *reinterpret_cast<const float4*>(s.factor);
#pragma unroll
  for (int r = 0; r < kKiviRows; ++r) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#pragma unroll
      for (int c = 0; c < K::kP; ++c) acc[r][b][c] *= Lane4(f, r);
    }
  }
}

// One page in shared memory: its n slots (page_tokens in the layout) into the running softmax
// and the value accumulators. Ends synchronized.
template <class K, int D, int G, int GV>
__device__ __forceinline__ void KiviPage(const DecodeKernelParams& p, const KiviSmem& s,
                                         const uint8_t* page, int n, int rows_here, float* logits,
                                         int row0, float (&acc)[kKiviRows][4][K::kP], int word,
                                         int split, const int (&vgroup)[K::kP]) {
  constexpr int R = kKiviRows, P = K::kP, VG = K::kVGroups;
  constexpr int B = 8 / P;
  const KvPageLayout& L = p.tiers[0].layout;
  const int NL = L.tokens, vt = p.view_tokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Tables of the page's key groups: qs and kb.
  const uint16_t* km = reinterpret_cast<const uint16_t*>(page + L.k_meta);
  const float lane_pow = Pow2(-B * (lane % P));  // channel lane + 32 i has c % P == lane % P
  const int groups = (n + G - 1) / G;
  for (int g = warp; g < groups; g += kWarps) {
    float bias[R] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const int c = lane + 32 * i;
      const float ks = HalfBits(km[g * 2 * D + c]) * lane_pow;
      const float kz = HalfBits(km[g * 2 * D + D + c]);
      const float4 qv = *reinterpret_cast<const float4*>(s.q + c * R);
      *reinterpret_cast<float4*>(s.qs + (g * D + c) * R) = Scale4(qv, ks);
#pragma unroll
      for (int r = 0; r < R; ++r) bias[r] = fmaf(Lane4(qv, r), kz, bias[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) bias[r] = WarpSum(bias[r]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) s.kb[g * R + r] = bias[r];
    }
  }
  __syncthreads();

  // Partial logits: item (4 tokens, 32 channels).
  const uint8_t* kc = page + L.k_codes;
  const int quads = (n + 3) / 4;
  for (int item = threadIdx.x; item < quads * K::kSlices; item += kDecodeThreads) {
    const int slice = item % K::kSlices, t0 = (item / K::kSlices) * 4;
    const int tile = t0 / G;  // the key group
    const uint8_t* codes = kc + tile * (G * K::kRowBytes) + slice * (K::kSliceBytes * G) + t0 % G;
    const float* qs = s.qs + (tile * D + slice * 32) * R;
    float a[4][R];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) a[i][r] = 0.f;
    }
#pragma unroll
    for (int qq = 0; qq < K::kSliceBytes; ++qq) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + qq * G);
      const uint32_t hi = w >> 16;
#pragma unroll
      for (int c = 0; c < P; ++c) {
        const float4 qv = *reinterpret_cast<const float4*>(qs + (qq * P + c) * R);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = Field<B>(i < 2 ? w : hi, (i & 1) * 8 + c * B);
#pragma unroll
          for (int r = 0; r < R; ++r) a[i][r] = fmaf(Lane4(qv, r), x, a[i][r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Tokens 1 and 3 of the word sit 8 bits up.
      *reinterpret_cast<float4*>(s.sc + (slice * R + r) * vt + t0) =
          make_float4(a[0][r], a[1][r] * Pow2(-8), a[2][r], a[3][r] * Pow2(-8));
    }
  }
  __syncthreads();

  // Logits: the slices' sums plus kb, masked.
  const uint64_t* valid = reinterpret_cast<const uint64_t*>(page + L.valid);
  for (int t = threadIdx.x; t < n; t += kDecodeThreads) {
    const bool live = (valid[t >> 6] >> (t & 63)) & 1;
    const float* kb = s.kb + (t / G) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x = kb[r];
#pragma unroll
      for (int sl = 0; sl < K::kSlices; ++sl) x += s.sc[(sl * R + r) * vt + t];
      x = live && r < rows_here ? x : -INFINITY;
      s.sc[r * vt + t] = x;
      if (logits != nullptr && r < rows_here)
        logits[static_cast<int64_t>(t) * p.rows + row0 + r] = x;
    }
  }
  __syncthreads();

  KiviSoftmax<K, true>(s, vt, n, reinterpret_cast<const uint16_t*>(page + L.v_meta), NL);
  __syncthreads();

  // Values: word `word` of every row, tokens split, R x 4 x P sums in registers.
  KiviRescale<K>(s, acc);
  const uint8_t* vc = page + L.v_codes + 4 * word;
  for (int t = split; t < n; t += K::kSplits) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(vc + t * K::kRowBytes);
    const uint32_t hi = w >> 16;
#pragma unroll
    for (int c = 0; c < P; ++c) {
      const float4 pw = *reinterpret_cast<const float4*>(s.ps + (t * VG + vgroup[c]) * R);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float x = Field<B>(b < 2 ? w : hi, FieldOffset<B>(b, c));
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][b][c] = fmaf(Lane4(pw, r), x, acc[r][b][c]);
      }
    }
  }
  __syncthreads();
}

template <int D, int B, int G, int GV>
__global__ void __launch_bounds__(kDecodeThreads)
    KiviChunkKernel(const __grid_constant__ DecodeKernelParams p) {
  using K = Kivi<D, B, G, GV>;
  constexpr int R = kKiviRows, P = K::kP, VG = K::kVGroups;
  SLUICE_DYNAMIC_SHARED(smem_raw, uint8_t);
  const KiviSmem s = CarveKivi<K, D>(smem_raw, p);
  const DecodeChunk chunk = p.chunks[blockIdx.x];
  const int row0 = blockIdx.y * R, rows_here = min(R, p.rows - row0);
  const int b = chunk.bh / p.kv_heads, kvh = chunk.bh % p.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int vt = p.view_tokens;

  // The rows' queries, pre-scaled, as [D, R]; one thread per channel.
  static_assert(D <= kDecodeThreads, "a thread per channel");
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
      s.red[r * D + c] = 0.f;
    }
    *reinterpret_cast<float4*>(s.q + c * R) = make_float4(x[0], x[1], x[2], x[3]);
  }
  if (threadIdx.x < R) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.f;
  }
  if (threadIdx.x < R * VG) s.vb[threadIdx.x] = 0.f;

  // This thread's share of the values: word `word` of each row (channels 4 word + byte +
  // c * RB), tokens split, split + kSplits, ...
  const int word = threadIdx.x % K::kWords, split = threadIdx.x / K::kWords;
  int vgroup[P];
#pragma unroll
  for (int c = 0; c < P; ++c) vgroup[c] = (4 * word + c * K::kRowBytes) / GV;
  float acc[R][4][P];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int c = 0; c < P; ++c) acc[r][i][c] = 0.f;
    }
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
    KiviPage<K, D, G, GV>(p, s, s.pages + buf * s.page_stride, n, rows_here,
                          logits ? logits + static_cast<int64_t>(key_base) * p.rows : nullptr, row0,
                          acc, word, split, vgroup);
    key_base += n;
  }

  // The recent (fp32) tokens, kRecentView at a time: causal per query token.
  if (chunk.recent_begin >= 0) {
    // The last recent key each row sees.
    const int rcount = static_cast<int>(p.recent_offsets[b + 1] - p.recent_offsets[b]);
    int limit[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      limit[r] = r < rows_here ? rcount - p.q_tokens + (row0 + r) / p.group : -1;
    }
    const int64_t base = p.recent_offsets[b];
    const int key0 = p.key_offsets[chunk.bh + 1] - p.key_offsets[chunk.bh] - rcount;
    for (int i0 = chunk.recent_begin; i0 < chunk.recent_end; i0 += kRecentView) {
      const int n = min(chunk.recent_end - i0, kRecentView);
      for (int j = warp; j < n; j += kWarps) {
        const float* k = p.recent_k + ((base + i0 + j) * p.kv_heads + kvh) * D;
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
      KiviRescale<K>(s, acc);
      for (int t = split; t < n; t += K::kSplits) {
        const float* v = p.recent_v + ((base + i0 + t) * p.kv_heads + kvh) * D + 4 * word;
        float w[R];
#pragma unroll
        for (int r = 0; r < R; ++r) w[r] = s.sc[r * vt + t];
#pragma unroll
        for (int c = 0; c < P; ++c) {
          const float4 vv = *reinterpret_cast<const float4*>(v + c * K::kRowBytes);
#pragma unroll
          for (int bb = 0; bb < 4; ++bb) {
            // In the accumulators' units: value times 2^offset of its code.
            const float x = Lane4(vv, bb) * Pow2(FieldOffset<B>(bb, c));
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][bb][c] = fmaf(w[r], x, acc[r][bb][c]);
          }
        }
      }
      __syncthreads();
    }
  }

  // The splits' sums, back in value units, then the chunk's partial state.
#pragma unroll
  for (int c = 0; c < P; ++c) {
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) {
      const int ch = 4 * word + bb + c * K::kRowBytes;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        atomicAdd(&s.red[r * D + ch], acc[r][bb][c] * Pow2(-FieldOffset<B>(bb, c)));
      }
    }
  }
  __syncthreads();
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

// The chunk kernel's shared memory for `p`, with the kernel allowed that much past 48 KiB.
template <int R>
cudaError_t AllowShared(const DecodeKernelParams& p, int64_t* smem) {
  *smem = SmemBytes(p, R);
  if (*smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(ChunkKernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(*smem));
}

template <int R>
cudaError_t LaunchRows(const DecodeKernelParams& p, cudaStream_t stream) {
  int64_t smem = 0;
  if (cudaError_t e = AllowShared<R>(p, &smem); e != cudaSuccess) return e;
  const dim3 grid(p.chunk_count, (p.rows + R - 1) / R);
  SLUICE_LAUNCH(grid, kDecodeThreads, smem, stream, ChunkKernel<R>)(p);
  return cudaGetLastError();
}

template <int R>
cudaError_t BlocksPerSm(const DecodeKernelParams& p, int* blocks) {
  int64_t smem = 0;
  if (cudaError_t e = AllowShared<R>(p, &smem); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, ChunkKernel<R>, kDecodeThreads,
                                                       static_cast<size_t>(smem));
}

// The KIVI instantiations: head_dim 64 or 128, 2- or 4-bit codes. `f(kernel, shared bytes)`.
template <typename F>
cudaError_t WithKivi(const DecodeKernelParams& p, int bits, F&& f) {
  constexpr int G = kKiviKeyTokens, GV = kKiviValueChannels;
  const auto go = [&](auto kernel, auto k) {
    using K = decltype(k);
    const int64_t smem = KiviSmemBytes<K>(p, p.head_dim);
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (e != cudaSuccess) return e;
    }
    return f(kernel, smem);
  };
  if (p.head_dim == 128 && bits == 4)
    return go(KiviChunkKernel<128, 4, G, GV>, Kivi<128, 4, G, GV>{});
  if (p.head_dim == 128 && bits == 2)
    return go(KiviChunkKernel<128, 2, G, GV>, Kivi<128, 2, G, GV>{});
  if (p.head_dim == 64 && bits == 4) return go(KiviChunkKernel<64, 4, G, GV>, Kivi<64, 4, G, GV>{});
  if (p.head_dim == 64 && bits == 2) return go(KiviChunkKernel<64, 2, G, GV>, Kivi<64, 2, G, GV>{});
  return cudaErrorInvalidValue;
}

}  // namespace

DecodeKernelChoice ChooseDecodeKernel(const DecodeTier* tiers, int tier_count, int d, int rows) {
  DecodeKernelChoice k;
  if (tier_count == 1 && !tiers[0].huffman && (d == 64 || d == 128)) {
    const KvQuantSpec& ks = tiers[0].format.k;
    const KvQuantSpec& vs = tiers[0].format.v;
    const bool kivi = ks.codec == KvCodec::kInt && ks.grouping == KvGrouping::kPerChannel &&
                      ks.group == kKiviKeyTokens && vs.codec == KvCodec::kInt &&
                      vs.grouping == KvGrouping::kPerToken && vs.group == kKiviValueChannels &&
                      ks.bits == vs.bits && (ks.bits == 2 || ks.bits == 4) &&
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
  if (k.kivi_bits != 0) {
    int64_t bytes = 0;
    const cudaError_t e = WithKivi(p, k.kivi_bits, [&](auto, int64_t smem) {
      bytes = smem;
      return cudaSuccess;
    });
    return e == cudaSuccess ? static_cast<size_t>(bytes) : 0;
  }
  return static_cast<size_t>(SmemBytes(p, k.rows_per_block));
}

cudaError_t DecodeBlocksPerSm(const DecodeKernelParams& p, DecodeKernelChoice k, int* blocks) {
  if (k.kivi_bits != 0) {
    return WithKivi(p, k.kivi_bits, [&](auto kernel, int64_t smem) {
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kDecodeThreads,
                                                           static_cast<size_t>(smem));
    });
  }
  switch (k.rows_per_block) {
    case 1:
      return BlocksPerSm<1>(p, blocks);
    case 2:
      return BlocksPerSm<2>(p, blocks);
    case 4:
      return BlocksPerSm<4>(p, blocks);
    case 8:
      return BlocksPerSm<8>(p, blocks);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchDecodeAttention(const DecodeKernelParams& p, DecodeKernelChoice k,
                                  cudaStream_t stream) {
  cudaError_t e;
  if (k.kivi_bits != 0) {
    e = WithKivi(p, k.kivi_bits, [&](auto kernel, int64_t smem) {
      const dim3 grid(p.chunk_count, (p.rows + kKiviRows - 1) / kKiviRows);
      SLUICE_LAUNCH(grid, kDecodeThreads, smem, stream, kernel)(p);
      return cudaGetLastError();
    });
  } else {
    switch (k.rows_per_block) {
      case 1:
        e = LaunchRows<1>(p, stream);
        break;
      case 2:
        e = LaunchRows<2>(p, stream);
        break;
      case 4:
        e = LaunchRows<4>(p, stream);
        break;
      case 8:
        e = LaunchRows<8>(p, stream);
        break;
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (e != cudaSuccess) return e;
  SLUICE_LAUNCH(p.bh_count, 256, 0, stream, MergeKernel)(p);
  return cudaGetLastError();
}

cudaError_t LaunchDecodeScores(const DecodeKernelParams& p, int64_t max_keys, int64_t total_slots,
                               int64_t recent, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((max_keys + 127) / 128), p.bh_count);
  SLUICE_LAUNCH(grid, 128, 0, stream, ScoreKernel)(p, total_slots, recent);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
