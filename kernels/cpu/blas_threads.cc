#include "kernels/cpu/blas_threads.h"

#include <cblas.h>

namespace sluice::kernels::cpu {

void UseSingleThreadedBlas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

}  // namespace sluice::kernels::cpu
