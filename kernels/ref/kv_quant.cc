#include "kernels/ref/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ggml_quant.h"
#include "kernels/kv_format.h"
#include "kernels/kv_huffman.h"

namespace sluice::kernels::ref {
namespace {

uint16_t* Meta16(uint8_t* page, int32_t offset) {
  return reinterpret_cast<uint16_t*>(page + offset);
}
const uint16_t* Meta16(const uint8_t* page, int32_t offset) {
  return reinterpret_cast<const uint16_t*>(page + offset);
}

// ORs `code` into its place in the code segment (zeroed beforehand).
void PackCode(const KvQuantSpec& spec, int d, int tile, uint8_t* segment, int64_t slot, int c,
              int code) {
  const KvCodePosition at = KvCodePositionOf(spec, d, tile, slot, c);
  const int mask = (1 << spec.bits) - 1;
  segment[at.byte] =
      static_cast<uint8_t>((segment[at.byte] & ~(mask << at.shift)) | (code << at.shift));
}

// Quantizes the rows of tokens [0, n) (x rows `stride` apart) into slots [slot, slot + n) of one
// segment pair (codes at `codes` in tiles of `tile` tokens, metadata at `meta`) of `page`.
void QuantizeSegment(const KvQuantSpec& spec, int32_t d, int tile, const float* x, int64_t stride,
                     int64_t n, uint8_t* page, int32_t codes, int32_t meta, int64_t slot,
                     int32_t page_tokens) {
  const int row_bytes = KvRowBytes(spec, d);
  const int g = KvGroupOf(spec, d);
  auto row = [&](int64_t t) { return page + codes + (slot + t) * row_bytes; };
  auto value = [&](int64_t t, int c) { return x[t * stride + c]; };
  if (spec.codec == KvCodec::kF16) {
    for (int64_t t = 0; t < n; ++t) {
      uint16_t* h = reinterpret_cast<uint16_t*>(row(t));
      for (int c = 0; c < d; ++c) h[c] = FloatToFp16(value(t, c));
    }
    return;
  }
  if (spec.codec == KvCodec::kFp8) {
    uint16_t* m = Meta16(page, meta);
    for (int64_t t = 0; t < n; ++t) {
      for (int c0 = 0; c0 < d; c0 += g) {
        float amax = 0;
        for (int c = c0; c < c0 + g; ++c) amax = std::max(amax, std::fabs(value(t, c)));
        const Fp8GroupParams gp = MakeFp8GroupParams(amax);
        m[KvTokenMetaIndex(page_tokens, slot + t, c0 / g)] = gp.scale16;
        for (int c = c0; c < c0 + g; ++c) row(t)[c] = FloatToFp8E4M3(value(t, c) * gp.inv_scale);
      }
    }
    return;
  }
  const int max_code = KvMaxCode(spec);
  uint16_t* m = Meta16(page, meta);
  if (spec.grouping == KvGrouping::kPerToken) {
    for (int64_t t = 0; t < n; ++t) {
      for (int c0 = 0; c0 < d; c0 += g) {
        float mn = value(t, c0), mx = mn;
        for (int c = c0; c < c0 + g; ++c) {
          mn = std::min(mn, value(t, c));
          mx = std::max(mx, value(t, c));
        }
        const IntGroupParams gp = MakeIntGroupParams(mn, mx, max_code);
        const int64_t at = KvTokenMetaIndex(page_tokens, slot + t, c0 / g);
        m[at] = gp.scale16;
        m[at + static_cast<int64_t>(d / g) * page_tokens] = gp.zero16;
        for (int c = c0; c < c0 + g; ++c) {
          PackCode(spec, d, tile, page + codes, slot + t, c, IntCode(value(t, c), gp, max_code));
        }
      }
    }
    return;
  }
  // Grouped along tokens: per channel (block_channels 1) or per 2D block.
  const int bc = spec.grouping == KvGrouping::kBlock ? spec.block_channels : 1;
  const int blocks = d / bc;
  for (int64_t t0 = 0; t0 < n; t0 += g) {
    const int64_t grp = (slot + t0) / g;
    uint16_t* scales = m + grp * 2 * blocks;
    uint16_t* zeros = scales + blocks;
    for (int b = 0; b < blocks; ++b) {
      float mn = value(t0, b * bc), mx = mn;
      for (int64_t t = t0; t < t0 + g; ++t) {
        for (int c = b * bc; c < (b + 1) * bc; ++c) {
          mn = std::min(mn, value(t, c));
          mx = std::max(mx, value(t, c));
        }
      }
      const IntGroupParams gp = MakeIntGroupParams(mn, mx, max_code);
      scales[b] = gp.scale16;
      zeros[b] = gp.zero16;
      for (int64_t t = t0; t < t0 + g; ++t) {
        for (int c = b * bc; c < (b + 1) * bc; ++c) {
          PackCode(spec, d, tile, page + codes, slot + t, c, IntCode(value(t, c), gp, max_code));
        }
      }
    }
  }
}

void DequantizeSegment(const KvQuantSpec& spec, int32_t d, int tile, const uint8_t* page,
                       int32_t codes, int32_t meta, int64_t slot, int64_t n, int32_t page_tokens,
                       float* out) {
  const int row_bytes = KvRowBytes(spec, d);
  const int g = KvGroupOf(spec, d);
  const uint16_t* m = Meta16(page, meta);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t s = slot + t;
    const uint8_t* row = page + codes + s * row_bytes;
    float* o = out + t * d;
    for (int c = 0; c < d; ++c) {
      switch (spec.codec) {
        case KvCodec::kF16:
          o[c] = Fp16ToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
          break;
        case KvCodec::kFp8:
          o[c] = Fp8E4M3ToFloat(row[c]) * Fp16ToFloat(m[KvTokenMetaIndex(page_tokens, s, c / g)]);
          break;
        case KvCodec::kInt: {
          float scale, zero;
          if (spec.grouping == KvGrouping::kPerToken) {
            const int64_t at = KvTokenMetaIndex(page_tokens, s, c / g);
            scale = Fp16ToFloat(m[at]);
            zero = Fp16ToFloat(m[at + static_cast<int64_t>(d / g) * page_tokens]);
          } else {
            const int bc = spec.grouping == KvGrouping::kBlock ? spec.block_channels : 1;
            const int blocks = d / bc;
            const uint16_t* scales = m + (s / g) * 2 * blocks;
            scale = Fp16ToFloat(scales[c / bc]);
            zero = Fp16ToFloat(scales[blocks + c / bc]);
          }
          o[c] = zero + static_cast<float>(KvCodeAt(spec, d, tile, page + codes, s, c)) * scale;
          break;
        }
      }
    }
  }
}

}  // namespace

IntGroupParams MakeIntGroupParams(float mn, float mx, int max_code) {
  const float levels = static_cast<float>(max_code);
  IntGroupParams g;
  g.scale16 = FloatToFp16((mx - mn) / levels);
  g.zero16 = FloatToFp16(mn);
  g.scale = Fp16ToFloat(g.scale16);
  g.zero = Fp16ToFloat(g.zero16);
  g.inv_scale = g.scale > 0.f && std::isfinite(g.scale) ? 1.f / g.scale : 0.f;
  return g;
}

int IntCode(float x, const IntGroupParams& g, int max_code) {
  const float levels = static_cast<float>(max_code);
  // fmax takes NaN (a NaN or infinite value in the group) to 0, as the CUDA kernel's fmaxf does.
  const float t = std::fmin(std::fmax((x - g.zero) * g.inv_scale, 0.f), levels);
  return static_cast<int>(std::nearbyint(t));
}

Fp8GroupParams MakeFp8GroupParams(float amax) {
  Fp8GroupParams g;
  g.scale16 = FloatToFp16(amax / 448.f);
  g.scale = Fp16ToFloat(g.scale16);
  g.inv_scale = g.scale > 0.f && std::isfinite(g.scale) ? 1.f / g.scale : 0.f;
  return g;
}

void KvQuantize(const KvQuantizeParams& p) {
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  QuantizeSegment(f.k, f.head_dim, l.k_tile, p.k.data, p.stride, p.tokens, p.page.data, l.k_codes,
                  l.k_meta, p.slot, l.tokens);
  QuantizeSegment(f.v, f.head_dim, 1, p.v.data, p.stride, p.tokens, p.page.data, l.v_codes,
                  l.v_meta, p.slot, l.tokens);
  KvWriteTokenMeta(f, l, p.page.data, p.slot, p.tokens, p.scores.data, p.positions.data);
}

absl::Status KvDequantizeAny(const KvDequantizeParams& p) {
  if (p.format.huffman_bits > 0) return KvDequantizeHuffman(p, /*reference=*/true, KvDequantize);
  KvDequantize(p);
  return absl::OkStatus();
}

void KvDequantize(const KvDequantizeParams& p) {
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  DequantizeSegment(f.k, f.head_dim, l.k_tile, p.page.data, l.k_codes, l.k_meta, p.slot, p.tokens,
                    l.tokens, p.k.data);
  DequantizeSegment(f.v, f.head_dim, 1, p.page.data, l.v_codes, l.v_meta, p.slot, p.tokens,
                    l.tokens, p.v.data);
}

}  // namespace sluice::kernels::ref
