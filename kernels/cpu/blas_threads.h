// OpenBLAS is called from inside the CPU backend's own OpenMP threads, one SGEMM per thread;
// its own thread pool would compete with them for the cores (and spin while idle), so it is
// kept to one thread.
#ifndef SLUICE_KERNELS_CPU_BLAS_THREADS_H_
#define SLUICE_KERNELS_CPU_BLAS_THREADS_H_

namespace sluice::kernels::cpu {

// Sets OpenBLAS to a single thread, once per process.
void UseSingleThreadedBlas();

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_BLAS_THREADS_H_
