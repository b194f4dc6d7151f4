// Reference quantizer and dequantizer of KV pages: the definition of the page formats in
// kernels/kv_format.h, one scalar step at a time. Other backends write byte-identical pages.
#ifndef SLUICE_KERNELS_REF_KV_QUANT_H_
#define SLUICE_KERNELS_REF_KV_QUANT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid (Backend::KvQuantize checks them). Fixed-width tiers only.
void KvQuantize(const KvQuantizeParams& p);
void KvDequantize(const KvDequantizeParams& p);
// KvDequantize for any tier: Huffman-coded units are decoded one bit at a time
// (KvDecodeUnitReference) first.
absl::Status KvDequantizeAny(const KvDequantizeParams& p);

// The asymmetric int parameters of a group with minimum `mn` and maximum `mx`, as stored (fp16)
// and as used when coding (their fp32 values). Shared by every backend's quantizer, so that all
// of them produce the same codes.
struct IntGroupParams {
  uint16_t scale16, zero16;
  float scale, zero, inv_scale;
};
// max_code = KvMaxCode(spec): the group's range is cut into max_code steps.
IntGroupParams MakeIntGroupParams(float mn, float mx, int max_code);
// clamp(round_half_even((x - zero) * inv_scale), 0, max_code).
int IntCode(float x, const IntGroupParams& g, int max_code);

// The fp8 scale of a group whose largest magnitude is `amax` (fp16 as stored; fp32 values).
struct Fp8GroupParams {
  uint16_t scale16;
  float scale, inv_scale;
};
Fp8GroupParams MakeFp8GroupParams(float amax);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_KV_QUANT_H_
