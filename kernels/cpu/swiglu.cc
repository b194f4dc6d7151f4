#include "kernels/cpu/swiglu.h"

#include <algorithm>

#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

void SwiGlu(const SwiGluParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (p.n + kChunk - 1) / kChunk;
  const bool parallel = threads > 1 && chunks > 1 && p.n >= (int64_t{1} << 15);
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i = c * kChunk;
    ops.swiglu(p.gate + i, p.up + i, p.out + i, std::min(kChunk, p.n - i));
  }
}

}  // namespace sluice::kernels::cpu
