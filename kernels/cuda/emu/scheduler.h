// Runs a kernel launch on the CPU: every block in turn, every thread of a block as a fiber,
// switched at barriers and warp collectives (device.h has the semantics). Internal to the
// emulation: the runtime (runtime.cc) calls RunGrid when a launch reaches the head of the
// device queue.
#ifndef SLUICE_KERNELS_CUDA_EMU_SCHEDULER_H_
#define SLUICE_KERNELS_CUDA_EMU_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cuda/emu/device.h"

namespace sluice::emu {

// The order a block's runnable threads are resumed in, each round between barriers.
enum class ThreadOrder { kForward, kReverse, kRandom, kMixed };

struct GridSpec {
  std::string kernel;  // the launch expression, for diagnostics
  dim3 grid;
  dim3 block;
  size_t dynamic_shared_bytes = 0;
  // Runs the kernel body for the current thread.
  std::function<void()> body;
};

// Runs every block of the grid. A bug the emulation detects (a divergent barrier, a deadlock,
// a bad asynchronous copy) prints a diagnostic naming the kernel, block, thread and source line,
// then aborts the process, as a device fault would end the context.
void RunGrid(const GridSpec& spec);

// The order (SLUICE_EMU_ORDER = forward | reverse | random | mixed; mixed, the default, cycles
// through the three by block) and the seed of the random order (SLUICE_EMU_SEED; printed in
// every diagnostic).
ThreadOrder ConfiguredOrder();
uint64_t ConfiguredSeed();

// Prints "sluice emu: <message>" with the running kernel, block and thread, and aborts.
[[noreturn]] void Fault(const std::string& message);

}  // namespace sluice::emu

#endif  // SLUICE_KERNELS_CUDA_EMU_SCHEDULER_H_
