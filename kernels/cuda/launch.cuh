// How the project's kernels are launched and declare shared memory: plain CUDA under nvcc, and
// calls into the CPU emulation (kernels/cuda/emu) when g++ compiles the same .cu for it.
//
//   SLUICE_LAUNCH(grid, block, shared_bytes, stream, MyKernel<4>)(args...);
//   SLUICE_SHARED(partial, float[32]);           // __shared__ float partial[32];
//   SLUICE_DYNAMIC_SHARED(smem, uint8_t);        // extern __shared__ uint8_t smem[];
#ifndef SLUICE_KERNELS_CUDA_LAUNCH_CUH_
#define SLUICE_KERNELS_CUDA_LAUNCH_CUH_

namespace sluice::kernels::cuda {
// Spells a declared type (an array type included) as one template argument.
template <typename T>
using SharedType = T;
}  // namespace sluice::kernels::cuda

#ifdef SLUICE_CUDA_EMU
#include "kernels/cuda/emu/runtime.h"

#define SLUICE_LAUNCH(grid, block, shared, stream, ...) \
  ::sluice::emu::Launch(__VA_ARGS__, grid, block, shared, stream, #__VA_ARGS__)
// Each block gets its own copy, keyed by the declaration (the address of a static tag).
#define SLUICE_SHARED(name, ...)                                                    \
  static char sluice_shared_tag_##name;                                             \
  ::sluice::kernels::cuda::SharedType<__VA_ARGS__>& name =                          \
      ::sluice::emu::BlockShared<::sluice::kernels::cuda::SharedType<__VA_ARGS__>>( \
          &sluice_shared_tag_##name)
#define SLUICE_DYNAMIC_SHARED(name, type) type* const name = ::sluice::emu::DynamicShared<type>()

#else

#define SLUICE_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#define SLUICE_SHARED(name, ...) __shared__ ::sluice::kernels::cuda::SharedType<__VA_ARGS__> name
#define SLUICE_DYNAMIC_SHARED(name, type) extern __shared__ __align__(16) type name[]

#endif  // SLUICE_CUDA_EMU

#endif  // SLUICE_KERNELS_CUDA_LAUNCH_CUH_
