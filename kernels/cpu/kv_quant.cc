#include "kernels/cpu/kv_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/ggml_quant.h"
#include "kernels/kv_format.h"
#include "kernels/ref/kv_quant.h"

namespace sluice::kernels::cpu {
namespace {

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own `_mm512_undefined_*`
// placeholders once inlined here; the warning is about the headers, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SLUICE_KQ_NS kq_scalar
#define SLUICE_KQ_LEVEL 0
#include "kernels/cpu/kv_quant_impl.inc"
#undef SLUICE_KQ_NS
#undef SLUICE_KQ_LEVEL

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SLUICE_KQ_NS kq_avx2
#define SLUICE_KQ_LEVEL 1
#include "kernels/cpu/kv_quant_impl.inc"
#undef SLUICE_KQ_NS
#undef SLUICE_KQ_LEVEL
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#define SLUICE_KQ_NS kq_avx512
#define SLUICE_KQ_LEVEL 2
#include "kernels/cpu/kv_quant_impl.inc"
#undef SLUICE_KQ_NS
#undef SLUICE_KQ_LEVEL
#pragma GCC pop_options
#pragma GCC diagnostic pop

using SegmentFn = void (*)(const KvQuantSpec&, int, int, const float*, int64_t, int64_t, uint8_t*,
                           int32_t, int32_t, int64_t, int32_t);

}  // namespace

void KvQuantize(const KvQuantizeParams& p, Isa isa) {
  const SegmentFn segment = isa == Isa::kAvx512 ? kq_avx512::QuantizeSegment
                            : isa == Isa::kAvx2 ? kq_avx2::QuantizeSegment
                                                : kq_scalar::QuantizeSegment;
  const KvTierFormat& f = p.format;
  const KvPageLayout& l = p.layout;
  segment(f.k, f.head_dim, l.k_tile, p.k.data, p.stride, p.tokens, p.page.data, l.k_codes, l.k_meta,
          p.slot, l.tokens);
  segment(f.v, f.head_dim, 1, p.v.data, p.stride, p.tokens, p.page.data, l.v_codes, l.v_meta,
          p.slot, l.tokens);
  KvWriteTokenMeta(f, l, p.page.data, p.slot, p.tokens, p.scores.data, p.positions.data);
}

}  // namespace sluice::kernels::cpu
