// Scalar reference embedding lookup (dequantizing rows of a table).
#ifndef SLUICE_KERNELS_REF_GET_ROWS_H_
#define SLUICE_KERNELS_REF_GET_ROWS_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void GetRows(const GetRowsParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_GET_ROWS_H_
