// GGML tensor element types as stored in GGUF files: their block layouts, sizes, and scalar
// dequantization to fp32. Shared by the GGUF reader (model/) and the fused-dequant kernels.
#ifndef SLUICE_KERNELS_GGML_QUANT_H_
#define SLUICE_KERNELS_GGML_QUANT_H_

#include <cstdint>
#include <string_view>

namespace sluice::kernels {

// Values are GGML's `ggml_type` numbers, as written in GGUF tensor infos.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;
  int64_t block_size;  // elements per block
  int64_t type_size;   // bytes per block
};

// Traits of a type this build can convert, or nullptr for any other number (the caller
// reports it, naming the tensor).
const GgmlTypeTraits* FindGgmlType(uint32_t type);
std::string_view GgmlTypeName(uint32_t type);  // "q4_1", or "type 12" for unknown numbers

// Block layouts (32 elements each), bit-exact with GGML.
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // element j: low nibble of qs[j] (j < 16), high nibble of qs[j-16]
};
struct BlockQ4_1 {
  uint16_t d;      // fp16 scale
  uint16_t m;      // fp16 minimum
  uint8_t qs[16];  // nibbles as in BlockQ4_0
};
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);

float Fp16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);  // round to nearest even
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);  // round to nearest even; NaN stays NaN

// Dequantizes `n` elements (a multiple of the type's block size) starting at `src`, a row in
// the type's storage layout, into `dst` [n]. The type must be one FindGgmlType knows.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_GGML_QUANT_H_
