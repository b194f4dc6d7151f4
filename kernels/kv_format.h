// How compressed keys and values are laid out inside a KV page: the quantization spec of one
// tier (codec, bits, grouping) and the byte layout that follows from it. Plain data, shared by
// the quantizers, the attention kernels of every backend, and kvstore's memory manager.
//
// A page holds the tokens of one (sequence, layer, kv-head, tier). Its segments, each starting
// on a 64-byte boundary:
//   k codes   [tokens, k_row_bytes]       the token's head_dim codes, packed (see below)
//   k meta    per grouping (see KvMetaBytes): fp16 scale/zero pairs, or fp16 scales for fp8
//   v codes   [tokens, v_row_bytes]
//   v meta
//   scores    [tokens] f32   cumulative attention (only with token_meta)
//   positions [tokens] i32   (only with token_meta)
//   valid     [ceil(tokens / 64)] u64, bit t set = slot t holds a live token
//
// Packing of b-bit codes (b = 2, 4 or 8; P = 8 / b codes per byte):
//  - values: each token's row of D codes takes R = D * b / 8 bytes; byte j holds codes j + s * R
//    for s < P at bits [s * b, s * b + b). One shift-and-mask of a row's bytes yields R
//    consecutive channels: the vector width of value accumulation.
//  - keys: tiles of T tokens (T = the token group G for kPerChannel and kBlock, kKvKeyTile for
//    kPerToken) share one block of T * R bytes, channel-major: byte q * T + t holds channels
//    q * P + s of the tile's token t at bits [s * b, s * b + b). One shift-and-mask of
//    consecutive bytes yields one channel of consecutive tokens: the vector width of score
//    computation, with no horizontal sums. Pages hold whole tiles.
// fp16 values are raw IEEE halves (token-major); fp8 values are OCP E4M3 bytes (token-major).
//
// Quantization groups:
//   kPerToken    int or fp8: one (scale, zero) — fp8: one scale — per `group` channels of a token.
//                Stored planar over the page's N slots: scales [groups][N], then (int) zeros
//                [groups][N], so a vector load reads consecutive tokens' scales.
//   kPerChannel  int, K only (KIVI/MiniKV): one (scale, zero) per channel per `group` tokens.
//   kBlock       int, K only (KVComp 2D block): one (scale, zero) per `group` tokens x
//                `block_channels` channels.
// Asymmetric int: x ~ zero + code * scale, code in [0, levels) (levels = 2^bits unless set),
// scale = (max - min) / (levels - 1) and zero = min in fp16. Fewer levels than 2^bits is
// KVComp's error-controlled quantization: the step is a fixed fraction of each group's range.
//
// Huffman-coded tiers (KvTierFormat::huffman_bits > 0; KVComp §3). K and V are 8-bit int codes
// with up to 256 levels, entropy-coded with one canonical codebook for K and one for V (per
// layer, kernels/huffman.h). Tokens are coded in units of U tokens (U = the key tile: the token
// group of K, 16, 32 or 64). A unit decodes into exactly the fixed-width 8-bit page of U tokens
// that KvUnitFormat / ComputeUnitLayout describe, so the fixed-width kernels run on it from L1.
// Segments of a Huffman-coded page, each starting on a 64-byte boundary:
//   streams   u32 [units * 8 + 1]   bit offset (from `bitstream`) of each unit's 8 streams:
//             K channels [i * D / 4, (i + 1) * D / 4) of the unit's tokens (channel-major, as
//             in the unit page) for i < 4, then V tokens [i * U / 4, (i + 1) * U / 4) (token
//             rows) for i < 4; entry u * 8 of the next unit is where unit u ends. Units start on
//             byte boundaries.
//   unit meta [units][unit_meta_bytes]: the unit page's K meta bytes, then its V meta bytes
//   scores, positions, valid   over the page's slots, as above
//   bitstream to the end of the page; its last HuffmanPaddingBytes() stay free for decoders
// A page holds as many whole units as fit: `tokens` is the slot capacity, sized for
// huffman_bits bits per value; a page whose codes come out longer fills with fewer slots.
#ifndef SLUICE_KERNELS_KV_FORMAT_H_
#define SLUICE_KERNELS_KV_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sluice::kernels {

enum class KvCodec : uint8_t { kF16 = 0, kInt = 1, kFp8 = 2 };
enum class KvGrouping : uint8_t { kPerToken = 0, kPerChannel = 1, kBlock = 2 };

// How one of K or V is stored in one tier.
struct KvQuantSpec {
  KvCodec codec = KvCodec::kF16;
  int32_t bits = 16;  // kF16: 16; kFp8: 8; kInt: 2, 4 or 8
  KvGrouping grouping = KvGrouping::kPerToken;
  int32_t group = 0;           // channels (kPerToken) or tokens (kPerChannel, kBlock); 0 = head_dim
  int32_t block_channels = 0;  // kBlock only: channels per block
  int32_t levels = 0;          // kInt: codes in [0, levels), 2 <= levels <= 2^bits; 0 = 2^bits

  bool operator==(const KvQuantSpec&) const = default;
};

// The format of one tier's pages.
struct KvTierFormat {
  KvQuantSpec k;
  KvQuantSpec v;
  int32_t head_dim = 64;
  int32_t page_bytes = 16 * 1024;
  bool token_meta = false;  // scores and positions segments
  // > 0: K and V codes are Huffman-coded (see above), and pages are sized for this many bits
  // per value on average. 0: fixed-width codes.
  float huffman_bits = 0.f;

  bool operator==(const KvTierFormat&) const = default;
};

// Byte offsets of a page's segments and the tokens it holds; computed by ComputePageLayout.
struct KvPageLayout {
  int32_t tokens = 0;       // slots per page
  int32_t token_group = 1;  // writes of K start and end on multiples of this (kPerChannel/kBlock)
  int32_t k_tile = 1;  // tokens per channel-major tile of K codes (KvCodeTile); tokens % it == 0
  int32_t k_row_bytes = 0;
  int32_t v_row_bytes = 0;
  int32_t k_codes = 0;
  int32_t k_meta = 0;
  int32_t v_codes = 0;
  int32_t v_meta = 0;
  int32_t scores = -1;     // -1 without token_meta
  int32_t positions = -1;  // -1 without token_meta
  int32_t valid = 0;
  int32_t bytes_used = 0;  // end of the last segment, <= page_bytes
  // Huffman-coded tiers only (0 or -1 otherwise); k_codes, k_meta, v_codes and v_meta are -1.
  int32_t unit_tokens = 0;      // U
  int32_t streams = -1;         // u32 [tokens / U * 8 + 1]
  int32_t unit_meta = -1;       // [tokens / U][unit_meta_bytes]
  int32_t unit_meta_bytes = 0;  // K meta bytes of a unit page, then V meta bytes
  int32_t unit_k_meta_bytes = 0;
  int32_t bitstream = -1;  // bits from here to page_bytes
};

inline constexpr int kKvHuffmanStreams = 4;  // streams per unit for each of K and V

// Validates `format` and lays out the largest whole number of token groups that fits the page.
// InvalidArgument naming the field for unsupported combinations (fp8 or f16 with token
// groups, V grouped along tokens, head_dim not a multiple of 32 or over 256, groups that do not
// divide head_dim, a page too small for one group).
absl::StatusOr<KvPageLayout> ComputePageLayout(const KvTierFormat& format);

// The fixed-width format a unit of a Huffman-coded tier decodes into (huffman_bits 0, no token
// meta), and its layout: exactly U tokens.
KvTierFormat KvUnitFormat(const KvTierFormat& format);
absl::StatusOr<KvPageLayout> ComputeUnitLayout(const KvTierFormat& format);

// Largest int code of `spec`: levels - 1.
inline int KvMaxCode(const KvQuantSpec& spec) {
  return (spec.levels > 0 ? spec.levels : 1 << spec.bits) - 1;
}

// A short description, e.g. "k int2/channel32 v int2/token64".
std::string KvTierFormatName(const KvTierFormat& format);

// Bytes of the codes of one token row of `spec` with `head_dim` channels.
int32_t KvRowBytes(const KvQuantSpec& spec, int32_t head_dim);

// Effective `group` (0 resolved to head_dim) and, for kBlock, block_channels.
int32_t KvGroupOf(const KvQuantSpec& spec, int32_t head_dim);

// fp16 index, within a per-token meta segment of a page with `page_tokens` slots, of the scale of
// channel group gi of slot `slot`; the zero (int codes) is at + groups * page_tokens.
inline int64_t KvTokenMetaIndex(int32_t page_tokens, int64_t slot, int gi) {
  return static_cast<int64_t>(gi) * page_tokens + slot;
}

inline constexpr int32_t kKvKeyTile = 16;

// Tokens per channel-major tile of a code segment: int keys are tiled (their token group, or
// kKvKeyTile tokens when grouped per token); fp16/fp8 keys and all values are token-major (1).
int32_t KvCodeTile(const KvQuantSpec& spec, int32_t head_dim, bool key);

// Code of channel c of slot `slot` in a code segment of `spec` with tiles of `tile` tokens (int
// codes only).
int KvCodeAt(const KvQuantSpec& spec, int32_t head_dim, int32_t tile, const uint8_t* codes,
             int64_t slot, int c);
// Where that code lives: byte offset in the segment and bit shift.
struct KvCodePosition {
  int64_t byte;
  int shift;
};
KvCodePosition KvCodePositionOf(const KvQuantSpec& spec, int32_t head_dim, int32_t tile,
                                int64_t slot, int c);

// Stores scores and positions (with token_meta; null arrays store 0 and -1) of slots
// [slot, slot + tokens) and marks those slots valid: what every quantizer writes besides codes.
void KvWriteTokenMeta(const KvTierFormat& f, const KvPageLayout& l, uint8_t* page, int64_t slot,
                      int64_t tokens, const float* scores, const int32_t* positions);

// Copies the token in slot `src_slot` of page `src` to slot `dst_slot` of page `dst` (the same
// page is fine, other slots stay as they are): its codes, metadata, score and position, and sets
// the destination's valid bit. Formats whose K is grouped per token and that are not
// Huffman-coded only (l.token_group == 1); the caller checks.
void KvMoveSlot(const KvTierFormat& f, const KvPageLayout& l, const uint8_t* src, int64_t src_slot,
                uint8_t* dst, int64_t dst_slot);

// OCP FP8 E4M3 (bias 7, no infinities, 0x7f/0xff NaN, max 448): round to nearest even,
// saturating to +-448; NaN maps to 0x7f.
uint8_t FloatToFp8E4M3(float f);
float Fp8E4M3ToFloat(uint8_t b);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_KV_FORMAT_H_
