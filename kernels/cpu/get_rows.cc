#include "kernels/cpu/get_rows.h"

#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

void GetRows(const GetRowsParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.table_type));
  const int64_t row_bytes = p.dim / t->block_size * t->type_size;
  const bool parallel = threads > 1 && p.count * p.dim >= (int64_t{1} << 15);
#pragma omp parallel for num_threads(threads) if (parallel)
  for (int64_t i = 0; i < p.count; ++i) {
    ops.dequantize(p.table_type, static_cast<const uint8_t*>(p.table) + p.ids[i] * row_bytes,
                   p.out + i * p.dim, p.dim);
  }
}

}  // namespace sluice::kernels::cpu
