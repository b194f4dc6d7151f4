#include "kernels/ref/get_rows.h"

namespace sluice::kernels::ref {

void GetRows(const GetRowsParams& p) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.table_type));
  const int64_t row_bytes = p.dim / t->block_size * t->type_size;
  for (int64_t i = 0; i < p.count; ++i) {
    DequantizeRow(p.table_type, static_cast<const uint8_t*>(p.table) + p.ids[i] * row_bytes,
                  p.out + i * p.dim, p.dim);
  }
}

}  // namespace sluice::kernels::ref
