#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

__device__ __forceinline__ int MaxCode(const KvQuantSpec& spec) {
  return (spec.levels > 0 ? spec.levels : 1 << spec.bits) - 1;
}

// The fp32 values the group parameters take once stored in fp16, as ref::MakeIntGroupParams.
struct IntGroup {
  uint16_t scale16, zero16;
  float zero, inv;
};

__device__ __forceinline__ uint16_t ToHalfBits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ float FromHalfBits(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

__device__ IntGroup MakeIntGroup(float mn, float mx, int max_code) {
  const float levels = static_cast<float>(max_code);
  IntGroup g;
  g.scale16 = ToHalfBits(__fdiv_rn(__fsub_rn(mx, mn), levels));
  g.zero16 = ToHalfBits(mn);
  const float scale = FromHalfBits(g.scale16);
  g.zero = FromHalfBits(g.zero16);
  g.inv = scale > 0.f && isfinite(scale) ? __fdiv_rn(1.f, scale) : 0.f;
  return g;
}

__device__ __forceinline__ int IntCode(float x, const IntGroup& g, float levels) {
  const float t = fminf(fmaxf(__fmul_rn(__fsub_rn(x, g.zero), g.inv), 0.f), levels);
  return static_cast<int>(rintf(t));
}

// Byte and shift of code c of slot `slot` (layout in kernels/kv_format.h).
// Tiles of `tile` tokens: channel-major when tile > 1, token-major rows otherwise.
__device__ __forceinline__ void CodePosition(const KvQuantSpec& spec, int d, int tile, int64_t slot,
                                             int c, int64_t* byte, int* shift) {
  const int row_bytes = d * spec.bits / 8;
  if (tile <= 1) {
    *byte = slot * row_bytes + c % row_bytes;
    *shift = spec.bits == 8 ? 0 : (c / row_bytes) * spec.bits;
    return;
  }
  const int per = 8 / spec.bits;
  *byte = slot / tile * tile * row_bytes + (c / per) * tile + slot % tile;
  *shift = (c % per) * spec.bits;
}

// Replaces a code's bits in the segment. Several threads may share a byte (codes of other
// channels or tokens), so the aligned word is updated atomically: clear these bits, set them.
__device__ __forceinline__ void PackCode(const KvQuantSpec& spec, int d, int tile, uint8_t* segment,
                                         int64_t slot, int c, int code) {
  int64_t byte;
  int shift;
  CodePosition(spec, d, tile, slot, c, &byte, &shift);
  const uintptr_t at = reinterpret_cast<uintptr_t>(segment + byte);
  unsigned int* word = reinterpret_cast<unsigned int*>(at & ~uintptr_t{3});
  const int s = shift + static_cast<int>(at & 3) * 8;
  atomicAnd(word, ~(static_cast<unsigned int>((1 << spec.bits) - 1) << s));
  atomicOr(word, static_cast<unsigned int>(code) << s);
}

__device__ __forceinline__ int UnpackCode(const KvQuantSpec& spec, int d, int tile,
                                          const uint8_t* segment, int64_t slot, int c) {
  int64_t byte;
  int shift;
  CodePosition(spec, d, tile, slot, c, &byte, &shift);
  return (segment[byte] >> shift) & ((1 << spec.bits) - 1);
}

// Units of work of one segment: one per (token, channel) for fp16, per (token, channel group)
// for per-token specs, per (token group, channel block) for specs grouped along tokens.
__host__ __device__ __forceinline__ int64_t QuantizeWork(const KvQuantSpec& spec, int d,
                                                         int64_t n) {
  const int gs = spec.group == 0 ? d : spec.group;
  if (spec.codec == KvCodec::kF16) return n * d;
  if (spec.grouping == KvGrouping::kPerToken) return n * (d / gs);
  return n / gs * (spec.grouping == KvGrouping::kBlock ? d / spec.block_channels : d);
}

// Unit i of a segment (QuantizeWork): x [n, stride] into the page's codes and metadata.
__device__ void QuantizeUnit(const KvQuantSpec& spec, int d, int tile, const float* __restrict__ x,
                             int64_t stride, int64_t n, uint8_t* page, int32_t codes_off,
                             int32_t meta_off, int64_t slot, int32_t page_tokens, int64_t i) {
  const int row_bytes = d * spec.bits / 8;
  const int gs = spec.group == 0 ? d : spec.group;
  uint16_t* meta = reinterpret_cast<uint16_t*>(page + meta_off);
  if (spec.codec == KvCodec::kF16) {
    if (i >= n * d) return;
    const int64_t t = i / d, c = i % d;
    reinterpret_cast<uint16_t*>(page + codes_off + (slot + t) * row_bytes)[c] =
        ToHalfBits(x[t * stride + c]);
    return;
  }
  if (spec.grouping == KvGrouping::kPerToken) {
    const int groups = d / gs;
    if (i >= n * groups) return;
    const int64_t t = i / groups;
    const int c0 = static_cast<int>(i % groups) * gs;
    const float* xr = x + t * stride;
    uint8_t* row = page + codes_off + (slot + t) * row_bytes;
    float mn = xr[c0], mx = mn;
    for (int c = c0; c < c0 + gs; ++c) {
      mn = fminf(mn, xr[c]);
      mx = fmaxf(mx, xr[c]);
    }
    if (spec.codec == KvCodec::kFp8) {
      const uint16_t s16 = ToHalfBits(__fdiv_rn(fmaxf(-mn, mx), 448.f));
      const float scale = FromHalfBits(s16);
      const float inv = scale > 0.f && isfinite(scale) ? __fdiv_rn(1.f, scale) : 0.f;
      meta[static_cast<int64_t>(c0 / gs) * page_tokens + slot + t] = s16;
      for (int c = c0; c < c0 + gs; ++c) {
        row[c] = __nv_cvt_float_to_fp8(__fmul_rn(xr[c], inv), __NV_SATFINITE, __NV_E4M3);
      }
      return;
    }
    const IntGroup g = MakeIntGroup(mn, mx, MaxCode(spec));
    const int64_t at = static_cast<int64_t>(c0 / gs) * page_tokens + slot + t;
    meta[at] = g.scale16;
    meta[at + static_cast<int64_t>(groups) * page_tokens] = g.zero16;
    const float levels = static_cast<float>(MaxCode(spec));
    for (int c = c0; c < c0 + gs; ++c) {
      PackCode(spec, d, tile, page + codes_off, slot + t, c, IntCode(xr[c], g, levels));
    }
    return;
  }
  const int bc = spec.grouping == KvGrouping::kBlock ? spec.block_channels : 1, blocks = d / bc;
  const int64_t token_groups = n / gs;
  if (i >= token_groups * blocks) return;
  const int64_t t0 = (i / blocks) * gs;
  const int b = static_cast<int>(i % blocks);
  float mn = x[t0 * stride + b * bc], mx = mn;
  for (int64_t t = t0; t < t0 + gs; ++t) {
    for (int c = b * bc; c < (b + 1) * bc; ++c) {
      mn = fminf(mn, x[t * stride + c]);
      mx = fmaxf(mx, x[t * stride + c]);
    }
  }
  const IntGroup g = MakeIntGroup(mn, mx, MaxCode(spec));
  uint16_t* scales = meta + ((slot + t0) / gs) * 2 * blocks;
  scales[b] = g.scale16;
  scales[blocks + b] = g.zero16;
  const float levels = static_cast<float>(MaxCode(spec));
  for (int64_t t = t0; t < t0 + gs; ++t) {
    for (int c = b * bc; c < (b + 1) * bc; ++c) {
      PackCode(spec, d, tile, page + codes_off, slot + t, c, IntCode(x[t * stride + c], g, levels));
    }
  }
}

// grid: [Blocks(QuantizeWork)], block: [kThreads]; one thread per unit of the segment.
__global__ void QuantizeKernel(KvQuantSpec spec, int d, int tile,
                               const float* __restrict__ x,  // [n, stride]
                               int64_t stride, int64_t n, uint8_t* page, int32_t codes_off,
                               int32_t meta_off, int64_t slot, int32_t page_tokens) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= QuantizeWork(spec, d, n)) return;
  QuantizeUnit(spec, d, tile, x, stride, n, page, codes_off, meta_off, slot, page_tokens, i);
}

// Token t of a write: its score, position and valid bit (atomic OR per 64-bit word).
__device__ void TokenMetaUnit(bool token_meta, const KvPageLayout& layout, uint8_t* page,
                              const float* scores, const int32_t* positions, int64_t slot,
                              int64_t t) {
  const int64_t s = slot + t;
  if (token_meta) {
    reinterpret_cast<float*>(page + layout.scores)[s] = scores ? scores[t] : 0.f;
    reinterpret_cast<int32_t*>(page + layout.positions)[s] = positions ? positions[t] : -1;
  }
  atomicOr(reinterpret_cast<unsigned long long*>(page + layout.valid) + s / 64, 1ull << (s % 64));
}

// grid: [Blocks(tokens)], block: [kThreads]; one thread per token.
__global__ void TokenMetaKernel(KvQuantizeParams p) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= p.tokens) return;
  TokenMetaUnit(p.format.token_meta, p.layout, p.page.data, p.scores.data, p.positions.data, p.slot,
                t);
}

// A batch (KvQuantizeBatchImage): each block finds its job by binary search of the jobs' first
// blocks, then does one unit of the job's K segment, V segment or token metadata, in that order
// of unit index. Jobs write distinct pages, so no two blocks of different jobs touch one byte.
// grid: [total blocks], block: [kThreads].
__global__ void QuantizeBatchKernel(const KvQuantizeFormat* __restrict__ formats,
                                    const KvQuantizeJob* __restrict__ jobs,   // [count]
                                    const int64_t* __restrict__ first_block,  // [count + 1]
                                    int64_t count) {
  const int64_t block = blockIdx.x;
  int64_t lo = 0, hi = count;  // the last job whose first block is <= block
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const KvQuantizeJob& j = jobs[lo];
  const KvTierFormat& f = formats[j.format].format;
  const KvPageLayout& l = formats[j.format].layout;
  int64_t i = (block - first_block[lo]) * blockDim.x + threadIdx.x;
  const int64_t k_work = QuantizeWork(f.k, f.head_dim, j.tokens);
  if (i < k_work) {
    QuantizeUnit(f.k, f.head_dim, l.k_tile, j.k, j.stride, j.tokens, j.page, l.k_codes, l.k_meta,
                 j.slot, l.tokens, i);
    return;
  }
  i -= k_work;
  const int64_t v_work = QuantizeWork(f.v, f.head_dim, j.tokens);
  if (i < v_work) {
    QuantizeUnit(f.v, f.head_dim, 1, j.v, j.stride, j.tokens, j.page, l.v_codes, l.v_meta, j.slot,
                 l.tokens, i);
    return;
  }
  i -= v_work;
  if (i < j.tokens) TokenMetaUnit(f.token_meta, l, j.page, j.scores, j.positions, j.slot, i);
}

// One thread per (token, channel) of K and V.
__global__ void DequantizeKernel(KvQuantSpec spec, int d, int tile, const uint8_t* page,
                                 int32_t codes_off, int32_t meta_off, int64_t slot, int64_t n,
                                 int32_t page_tokens, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * d) return;
  const int64_t t = i / d, s = slot + t;
  const int c = static_cast<int>(i % d);
  const int row_bytes = d * spec.bits / 8;
  const int gs = spec.group == 0 ? d : spec.group;
  const uint8_t* row = page + codes_off + s * row_bytes;
  const uint16_t* meta = reinterpret_cast<const uint16_t*>(page + meta_off);
  float v;
  if (spec.codec == KvCodec::kF16) {
    v = FromHalfBits(reinterpret_cast<const uint16_t*>(row)[c]);
  } else if (spec.codec == KvCodec::kFp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(row[c], __NV_E4M3);
    v = __half2float(__half(h)) *
        FromHalfBits(meta[static_cast<int64_t>(c / gs) * page_tokens + s]);
  } else if (spec.grouping == KvGrouping::kPerToken) {
    const int64_t at = static_cast<int64_t>(c / gs) * page_tokens + s;
    v = FromHalfBits(meta[at + static_cast<int64_t>(d / gs) * page_tokens]) +
        UnpackCode(spec, d, tile, page + codes_off, s, c) * FromHalfBits(meta[at]);
  } else {
    const int bc = spec.grouping == KvGrouping::kBlock ? spec.block_channels : 1, blocks = d / bc;
    const uint16_t* scales = meta + (s / gs) * 2 * blocks;
    v = FromHalfBits(scales[blocks + c / bc]) +
        UnpackCode(spec, d, tile, page + codes_off, s, c) * FromHalfBits(scales[c / bc]);
  }
  out[t * d + c] = v;
}

constexpr int kThreads = 256;

int Blocks(int64_t work) { return static_cast<int>((work + kThreads - 1) / kThreads); }

cudaError_t QuantizeSegment(const KvQuantSpec& spec, int d, int tile, const float* x,
                            int64_t stride, int64_t n, uint8_t* page, int32_t codes, int32_t meta,
                            int64_t slot, int32_t page_tokens, cudaStream_t stream) {
  SLUICE_LAUNCH(Blocks(QuantizeWork(spec, d, n)), kThreads, 0, stream, QuantizeKernel)
  (spec, d, tile, x, stride, n, page, codes, meta, slot, page_tokens);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchKvQuantize(const KvQuantizeParams& p, cudaStream_t stream) {
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  if (cudaError_t e = QuantizeSegment(f.k, f.head_dim, l.k_tile, p.k.data, p.stride, p.tokens,
                                      p.page.data, l.k_codes, l.k_meta, p.slot, l.tokens, stream);
      e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = QuantizeSegment(f.v, f.head_dim, 1, p.v.data, p.stride, p.tokens, p.page.data,
                                      l.v_codes, l.v_meta, p.slot, l.tokens, stream);
      e != cudaSuccess) {
    return e;
  }
  SLUICE_LAUNCH(Blocks(p.tokens), kThreads, 0, stream, TokenMetaKernel)(p);
  return cudaGetLastError();
}

KvQuantizeBatchImage PlanKvQuantizeBatch(const KvQuantizeParams* items, int64_t count) {
  std::vector<KvQuantizeFormat> formats;
  std::vector<KvQuantizeJob> jobs;
  std::vector<int64_t> first_block = {0};
  jobs.reserve(count);
  first_block.reserve(count + 1);
  for (int64_t n = 0; n < count; ++n) {
    const KvQuantizeParams& p = items[n];
    if (p.tokens == 0 || p.format.huffman_bits > 0) continue;
    int32_t format = 0;
    while (format < static_cast<int32_t>(formats.size()) && !(formats[format].format == p.format)) {
      ++format;
    }
    if (format == static_cast<int32_t>(formats.size())) formats.push_back({p.format, p.layout});
    jobs.push_back({.k = p.k.data,
                    .v = p.v.data,
                    .scores = p.scores.data,
                    .positions = p.positions.data,
                    .page = p.page.data,
                    .stride = p.stride,
                    .tokens = p.tokens,
                    .slot = p.slot,
                    .format = format});
    const int64_t units = QuantizeWork(p.format.k, p.format.head_dim, p.tokens) +
                          QuantizeWork(p.format.v, p.format.head_dim, p.tokens) + p.tokens;
    first_block.push_back(first_block.back() + (units + kThreads - 1) / kThreads);
  }
  KvQuantizeBatchImage image;
  if (jobs.empty()) return image;
  image.count = static_cast<int64_t>(jobs.size());
  image.blocks = first_block.back();
  const auto append = [&image](const void* data, size_t bytes) {
    const size_t at = (image.bytes.size() + 15) / 16 * 16;
    image.bytes.resize(at + bytes);
    std::memcpy(image.bytes.data() + at, data, bytes);
    return at;
  };
  image.formats_at = append(formats.data(), formats.size() * sizeof(formats[0]));
  image.jobs_at = append(jobs.data(), jobs.size() * sizeof(jobs[0]));
  image.first_block_at = append(first_block.data(), first_block.size() * sizeof(int64_t));
  return image;
}

cudaError_t LaunchKvQuantizeBatch(const KvQuantizeBatchImage& image, uint8_t* device_image,
                                  cudaStream_t stream) {
  if (image.count == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemcpyAsync(device_image, image.bytes.data(), image.bytes.size(),
                                      cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return e;
  }
  SLUICE_LAUNCH(static_cast<unsigned>(image.blocks), kThreads, 0, stream, QuantizeBatchKernel)
  (reinterpret_cast<const KvQuantizeFormat*>(device_image + image.formats_at),
   reinterpret_cast<const KvQuantizeJob*>(device_image + image.jobs_at),
   reinterpret_cast<const int64_t*>(device_image + image.first_block_at), image.count);
  return cudaGetLastError();
}

cudaError_t LaunchKvDequantize(const KvDequantizeParams& p, cudaStream_t stream) {
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  const int64_t work = p.tokens * f.head_dim;
  SLUICE_LAUNCH(Blocks(work), kThreads, 0, stream, DequantizeKernel)
  (f.k, f.head_dim, l.k_tile, p.page.data, l.k_codes, l.k_meta, p.slot, p.tokens, l.tokens,
   p.k.data);
  SLUICE_LAUNCH(Blocks(work), kThreads, 0, stream, DequantizeKernel)
  (f.v, f.head_dim, 1, p.page.data, l.v_codes, l.v_meta, p.slot, p.tokens, l.tokens, p.v.data);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
