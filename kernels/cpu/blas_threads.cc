#include "kernels/cpu/blas_threads.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

extern "C" {
// OpenBLAS's dynamic-architecture entry points (exported by libopenblas): forget the chosen
// core, and choose again (OPENBLAS_CORETYPE first, then its own detection).
void gotoblas_dynamic_init(void);
void gotoblas_dynamic_quit(void);
}

namespace sluice::kernels::cpu {
namespace {

// The core this CPU's features call for, or null when OpenBLAS's own choice stands.
const char* CoreByFeatures() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    return __builtin_cpu_supports("avx512bf16") ? "COOPERLAKE" : "SKYLAKEX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
  return nullptr;
}

void ChooseBlasCore() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set != nullptr && *set != '\0') return;  // the operator's choice
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
  const char* core = CoreByFeatures();
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
}

}  // namespace

void UseSingleThreadedBlas() {
  static const bool once = [] {
    ChooseBlasCore();
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

std::string BlasCore() {
  UseSingleThreadedBlas();
  return openblas_get_corename();
}

}  // namespace sluice::kernels::cpu
