#include "kernels/kv_format.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace sluice::kernels {
namespace {

int32_t Align64(int64_t x) { return static_cast<int32_t>((x + 63) / 64 * 64); }

absl::Status ValidateSpec(const KvQuantSpec& s, int32_t head_dim, const char* which) {
  switch (s.codec) {
    case KvCodec::kF16:
      if (s.bits != 16) return absl::InvalidArgumentError(absl::StrCat(which, ": f16 has 16 bits"));
      return absl::OkStatus();
    case KvCodec::kFp8:
      if (s.bits != 8) return absl::InvalidArgumentError(absl::StrCat(which, ": fp8 has 8 bits"));
      if (s.grouping != KvGrouping::kPerToken) {
        return absl::InvalidArgumentError(absl::StrCat(which, ": fp8 groups along channels only"));
      }
      break;
    case KvCodec::kInt:
      if (s.bits != 2 && s.bits != 4 && s.bits != 8) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, ": int codes have 2, 4 or 8 bits, not ", s.bits));
      }
      if (s.levels != 0 && (s.levels < 2 || s.levels > (1 << s.bits))) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, ": levels ", s.levels, " outside [2, 2^", s.bits, "]"));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(which, ": unknown codec"));
  }
  if (s.codec != KvCodec::kInt && s.levels != 0) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": levels apply to int codes only"));
  }
  const int32_t g = KvGroupOf(s, head_dim);
  if (s.grouping == KvGrouping::kPerToken) {
    if (g <= 0 || head_dim % g != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": channel group ", g, " does not divide head_dim ", head_dim));
    }
    return absl::OkStatus();
  }
  if (s.grouping != KvGrouping::kPerChannel && s.grouping != KvGrouping::kBlock) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": unknown grouping"));
  }
  if (g < 1 || g > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, ": token group ", g, " outside [1, 1024]"));
  }
  if (s.grouping == KvGrouping::kBlock &&
      (s.block_channels <= 0 || head_dim % s.block_channels != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": block_channels ", s.block_channels,
                                                   " does not divide head_dim ", head_dim));
  }
  return absl::OkStatus();
}

// Bytes of metadata for `tokens` tokens (a multiple of the token group for grouped specs).
int64_t MetaBytes(const KvQuantSpec& s, int32_t head_dim, int64_t tokens) {
  if (s.codec == KvCodec::kF16) return 0;
  const int32_t g = KvGroupOf(s, head_dim);
  const int64_t per_value = s.codec == KvCodec::kFp8 ? 2 : 4;  // scale (+ zero), fp16 each
  switch (s.grouping) {
    case KvGrouping::kPerToken:
      return tokens * (head_dim / g) * per_value;
    case KvGrouping::kPerChannel:
      return tokens / g * head_dim * per_value;
    case KvGrouping::kBlock:
      return tokens / g * (head_dim / s.block_channels) * per_value;
  }
  return 0;
}

std::string SpecName(const KvQuantSpec& s, int32_t head_dim) {
  if (s.codec == KvCodec::kF16) return "f16";
  std::string codec = s.codec == KvCodec::kFp8 ? "fp8" : absl::StrCat("int", s.bits);
  if (s.levels != 0) absl::StrAppend(&codec, "(", s.levels, " levels)");
  const int32_t g = KvGroupOf(s, head_dim);
  switch (s.grouping) {
    case KvGrouping::kPerToken:
      return absl::StrCat(codec, "/token", g);
    case KvGrouping::kPerChannel:
      return absl::StrCat(codec, "/channel", g);
    case KvGrouping::kBlock:
      return absl::StrCat(codec, "/block", g, "x", s.block_channels);
  }
  return codec;
}

}  // namespace

int32_t KvGroupOf(const KvQuantSpec& spec, int32_t head_dim) {
  return spec.group == 0 ? head_dim : spec.group;
}

int32_t KvRowBytes(const KvQuantSpec& spec, int32_t head_dim) { return head_dim * spec.bits / 8; }

std::string KvTierFormatName(const KvTierFormat& f) {
  std::string name =
      absl::StrCat("k ", SpecName(f.k, f.head_dim), " v ", SpecName(f.v, f.head_dim));
  if (f.huffman_bits > 0) absl::StrAppend(&name, " huffman");
  return name;
}

namespace {

// The segments over a page's n slots, from `off` on: scores and positions (token_meta), then
// the valid bitmap. Returns the end of the bitmap.
int64_t LayOutTokenSegments(const KvTierFormat& f, int64_t n, int64_t off, KvPageLayout* l) {
  if (f.token_meta) {
    l->scores = static_cast<int32_t>(off);
    off = Align64(off + n * 4);
    l->positions = static_cast<int32_t>(off);
    off = Align64(off + n * 4);
  } else {
    l->scores = l->positions = -1;
  }
  l->valid = static_cast<int32_t>(off);
  return off + (n + 63) / 64 * 8;
}

// The fixed-width layout: the largest whole number of token groups that fits the page, or
// exactly `exact_tokens` tokens (a unit page) when that is > 0.
absl::StatusOr<KvPageLayout> FixedLayout(const KvTierFormat& f, int64_t exact_tokens) {
  if (f.head_dim <= 0 || f.head_dim % 32 != 0 || f.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", f.head_dim, " is not a multiple of 32 in [32, 256]"));
  }
  if (f.page_bytes < 1024 || f.page_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_bytes ", f.page_bytes, " is not a multiple of 64 of at least 1024"));
  }
  if (absl::Status s = ValidateSpec(f.k, f.head_dim, "k"); !s.ok()) return s;
  if (absl::Status s = ValidateSpec(f.v, f.head_dim, "v"); !s.ok()) return s;
  if (f.v.grouping != KvGrouping::kPerToken) {
    return absl::InvalidArgumentError("v: values are grouped along channels (per token) only");
  }
  KvPageLayout l;
  l.token_group = f.k.grouping == KvGrouping::kPerToken ? 1 : KvGroupOf(f.k, f.head_dim);
  l.k_tile = KvCodeTile(f.k, f.head_dim, /*key=*/true);
  const int64_t step = std::max<int64_t>(l.token_group, l.k_tile);  // one divides the other
  l.k_row_bytes = KvRowBytes(f.k, f.head_dim);
  l.v_row_bytes = KvRowBytes(f.v, f.head_dim);
  auto lay_out = [&](int64_t n) {
    int64_t off = 0;
    l.k_codes = 0;
    off = Align64(off + n * l.k_row_bytes);
    l.k_meta = static_cast<int32_t>(off);
    off = Align64(off + MetaBytes(f.k, f.head_dim, n));
    l.v_codes = static_cast<int32_t>(off);
    off = Align64(off + n * l.v_row_bytes);
    l.v_meta = static_cast<int32_t>(off);
    off = Align64(off + MetaBytes(f.v, f.head_dim, n));
    off = LayOutTokenSegments(f, n, off, &l);
    l.bytes_used = static_cast<int32_t>(off);
    return off;
  };
  if (exact_tokens > 0) {
    l.tokens = static_cast<int32_t>(exact_tokens);
    lay_out(exact_tokens);
    return l;
  }
  // Start from the per-token estimate and step down one token group at a time.
  const int64_t per_token =
      l.k_row_bytes + l.v_row_bytes + (f.token_meta ? 8 : 0) +
      (MetaBytes(f.k, f.head_dim, l.token_group) + MetaBytes(f.v, f.head_dim, l.token_group)) /
          l.token_group;
  int64_t n = f.page_bytes / per_token / step * step;
  while (n > 0 && lay_out(n) > f.page_bytes) n -= step;
  if (n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", f.page_bytes, "-byte page cannot hold ",
                                                   step, " tokens of ", KvTierFormatName(f)));
  }
  l.tokens = static_cast<int32_t>(n);
  lay_out(n);
  return l;
}

absl::StatusOr<KvPageLayout> HuffmanLayout(const KvTierFormat& f) {
  if (!(f.huffman_bits > 0.f && f.huffman_bits <= 16.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("huffman_bits ", f.huffman_bits, " outside (0, 16]"));
  }
  if (f.k.codec != KvCodec::kInt || f.v.codec != KvCodec::kInt || f.k.bits != 8 || f.v.bits != 8) {
    return absl::InvalidArgumentError(
        "Huffman-coded tiers code 8-bit int keys and values (set levels for fewer)");
  }
  const int32_t unit = KvCodeTile(f.k, f.head_dim, /*key=*/true);
  if (unit != 16 && unit != 32 && unit != 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k: a Huffman-coded tier codes units of 16, 32 or 64 tokens, not a token group of ", unit));
  }
  SLUICE_ASSIGN_OR_RETURN(KvPageLayout unit_layout, FixedLayout(KvUnitFormat(f), unit));
  KvPageLayout l;
  l.token_group = unit;
  l.k_tile = unit;
  l.unit_tokens = unit;
  l.k_row_bytes = unit_layout.k_row_bytes;
  l.v_row_bytes = unit_layout.v_row_bytes;
  l.k_codes = l.k_meta = l.v_codes = l.v_meta = -1;
  l.unit_k_meta_bytes = static_cast<int32_t>(MetaBytes(f.k, f.head_dim, unit));
  l.unit_meta_bytes = l.unit_k_meta_bytes + static_cast<int32_t>(MetaBytes(f.v, f.head_dim, unit));
  const double bits_per_token = 2.0 * f.head_dim * f.huffman_bits;
  auto lay_out = [&](int64_t n) {
    const int64_t units = n / unit;
    l.streams = 0;
    int64_t off = Align64((units * 2 * kKvHuffmanStreams + 1) * 4);
    l.unit_meta = static_cast<int32_t>(off);
    off = Align64(off + units * l.unit_meta_bytes);
    off = LayOutTokenSegments(f, n, off, &l);
    off = Align64(off);
    l.bitstream = static_cast<int32_t>(off);
    l.bytes_used = f.page_bytes;
    // The nominal codes, the padding decoders read past them, and up to a byte of alignment
    // per unit.
    return off + static_cast<int64_t>(std::ceil(n * bits_per_token / 8)) + 8 + units;
  };
  int64_t n = static_cast<int64_t>(f.page_bytes * 8 / bits_per_token) / unit * unit;
  while (n > 0 && lay_out(n) > f.page_bytes) n -= unit;
  if (n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", f.page_bytes, "-byte page cannot hold ",
                                                   unit, " tokens of ", KvTierFormatName(f)));
  }
  l.tokens = static_cast<int32_t>(n);
  lay_out(n);
  return l;
}

}  // namespace

absl::StatusOr<KvPageLayout> ComputePageLayout(const KvTierFormat& f) {
  if (f.huffman_bits != 0.f) return HuffmanLayout(f);
  return FixedLayout(f, 0);
}

KvTierFormat KvUnitFormat(const KvTierFormat& f) {
  KvTierFormat u = f;
  u.huffman_bits = 0.f;
  u.token_meta = false;
  return u;
}

absl::StatusOr<KvPageLayout> ComputeUnitLayout(const KvTierFormat& f) {
  SLUICE_ASSIGN_OR_RETURN(KvPageLayout l, ComputePageLayout(f));
  if (f.huffman_bits == 0.f) return absl::InvalidArgumentError("not a Huffman-coded tier");
  return FixedLayout(KvUnitFormat(f), l.unit_tokens);
}

int32_t KvCodeTile(const KvQuantSpec& spec, int32_t head_dim, bool key) {
  if (!key || spec.codec != KvCodec::kInt) return 1;
  return spec.grouping == KvGrouping::kPerToken ? kKvKeyTile : KvGroupOf(spec, head_dim);
}

KvCodePosition KvCodePositionOf(const KvQuantSpec& spec, int32_t head_dim, int32_t tile,
                                int64_t slot, int c) {
  const int64_t row_bytes = KvRowBytes(spec, head_dim);
  const int bits = spec.bits;
  if (tile <= 1) {
    if (bits >= 8) return {slot * row_bytes + c, 0};
    return {slot * row_bytes + c % row_bytes, static_cast<int>(c / row_bytes) * bits};
  }
  const int64_t per = 8 / bits;
  const int64_t block = slot / tile * tile * row_bytes;
  return {block + (c / per) * tile + slot % tile, static_cast<int>(c % per) * bits};
}

int KvCodeAt(const KvQuantSpec& spec, int32_t head_dim, int32_t tile, const uint8_t* codes,
             int64_t slot, int c) {
  const KvCodePosition p = KvCodePositionOf(spec, head_dim, tile, slot, c);
  return (codes[p.byte] >> p.shift) & ((1 << spec.bits) - 1);
}

namespace {

// One token's codes and per-token metadata of K or V.
void MoveSegment(const KvQuantSpec& spec, int32_t d, int32_t tile, int32_t row_bytes, int32_t codes,
                 int32_t meta, int32_t tokens, const uint8_t* src, int64_t src_slot, uint8_t* dst,
                 int64_t dst_slot) {
  if (spec.codec == KvCodec::kInt && tile > 1) {
    for (int c = 0; c < d; ++c) {
      const KvCodePosition from = KvCodePositionOf(spec, d, tile, src_slot, c);
      const KvCodePosition to = KvCodePositionOf(spec, d, tile, dst_slot, c);
      const int mask = (1 << spec.bits) - 1;
      const int code = (src[codes + from.byte] >> from.shift) & mask;
      uint8_t& b = dst[codes + to.byte];
      b = static_cast<uint8_t>((b & ~(mask << to.shift)) | (code << to.shift));
    }
  } else {
    std::memmove(dst + codes + dst_slot * row_bytes, src + codes + src_slot * row_bytes, row_bytes);
  }
  if (spec.codec == KvCodec::kF16) return;
  // Per-token metadata, planar: scales [groups][tokens], then (int) zeros.
  const int groups = d / KvGroupOf(spec, d) * (spec.codec == KvCodec::kInt ? 2 : 1);
  const uint16_t* from = reinterpret_cast<const uint16_t*>(src + meta);
  uint16_t* to = reinterpret_cast<uint16_t*>(dst + meta);
  for (int gi = 0; gi < groups; ++gi) {
    to[static_cast<int64_t>(gi) * tokens + dst_slot] =
        from[static_cast<int64_t>(gi) * tokens + src_slot];
  }
}

}  // namespace

void KvWriteTokenMeta(const KvTierFormat& f, const KvPageLayout& l, uint8_t* page, int64_t slot,
                      int64_t tokens, const float* scores, const int32_t* positions) {
  if (f.token_meta) {
    float* s = reinterpret_cast<float*>(page + l.scores);
    int32_t* pos = reinterpret_cast<int32_t*>(page + l.positions);
    for (int64_t t = 0; t < tokens; ++t) {
      s[slot + t] = scores ? scores[t] : 0.f;
      pos[slot + t] = positions ? positions[t] : -1;
    }
  }
  uint64_t* valid = reinterpret_cast<uint64_t*>(page + l.valid);
  for (int64_t t = slot; t < slot + tokens; ++t) valid[t / 64] |= uint64_t{1} << (t % 64);
}

void KvMoveSlot(const KvTierFormat& f, const KvPageLayout& l, const uint8_t* src, int64_t src_slot,
                uint8_t* dst, int64_t dst_slot) {
  MoveSegment(f.k, f.head_dim, l.k_tile, l.k_row_bytes, l.k_codes, l.k_meta, l.tokens, src,
              src_slot, dst, dst_slot);
  MoveSegment(f.v, f.head_dim, 1, l.v_row_bytes, l.v_codes, l.v_meta, l.tokens, src, src_slot, dst,
              dst_slot);
  if (f.token_meta) {
    std::memmove(dst + l.scores + dst_slot * 4, src + l.scores + src_slot * 4, 4);
    std::memmove(dst + l.positions + dst_slot * 4, src + l.positions + src_slot * 4, 4);
  }
  reinterpret_cast<uint64_t*>(dst + l.valid)[dst_slot / 64] |= uint64_t{1} << (dst_slot % 64);
}

uint8_t FloatToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7e;  // saturate to the largest finite value
  // Subnormals: multiples of 2^-9 below 2^-6.
  if (a < 0.015625f) {
    const int m = static_cast<int>(std::nearbyint(a * 512.f));  // round half to even
    return sign | static_cast<uint8_t>(m);  // m == 8 is exactly 2^-6, the first normal
  }
  int e;
  const float fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  // a = (1 + m/8) * 2^(e-1); 3 mantissa bits.
  float mant = std::nearbyint((fr * 2.f - 1.f) * 8.f);
  int exp = e - 1;
  if (mant >= 8.f) {
    mant = 0.f;
    ++exp;
  }
  const int biased = exp + 7;
  if (biased > 15 || (biased == 15 && mant > 6.f)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(biased << 3) | static_cast<uint8_t>(mant);
}

float Fp8E4M3ToFloat(uint8_t b) {
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.f + m / 8.f, e - 7);
}

}  // namespace sluice::kernels
