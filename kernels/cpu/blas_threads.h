// OpenBLAS as the CPU backend uses it.
//
// Threads: OpenBLAS is called from inside the CPU backend's own OpenMP threads, one SGEMM per
// thread; its own thread pool would compete with them for the cores (and spin while idle), so it
// is kept to one thread.
//
// Kernels: Debian 12's OpenBLAS (0.3.21, built for every x86-64 core and choosing one at load)
// takes a CPU whose model number it does not know for a Prescott and runs its SSE3 kernels on
// it. On this project's CI machines (Xeons that report AVX-512 and AVX-512 BF16) that made a
// 1,024-token prefill of SmolLM2 3-4x slower (`./sluice bench model`: 121 against 400-500
// tokens/s with the right core). Where OpenBLAS chose Prescott on a CPU with AVX2 or AVX-512 and
// OPENBLAS_CORETYPE does not name a core, the core is chosen again by the CPU's features
// (Cooperlake, SkylakeX or Haswell).
#ifndef SLUICE_KERNELS_CPU_BLAS_THREADS_H_
#define SLUICE_KERNELS_CPU_BLAS_THREADS_H_

#include <string>

namespace sluice::kernels::cpu {

// Chooses OpenBLAS's kernels as above and sets it to a single thread, once per process, before
// the first BLAS call of the CPU backend (and of anything else that calls it first).
void UseSingleThreadedBlas();

// The OpenBLAS core in use ("Cooperlake", "Haswell", ...), after the choice above.
std::string BlasCore();

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_BLAS_THREADS_H_
