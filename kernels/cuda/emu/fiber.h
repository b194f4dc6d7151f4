// Fibers for the CUDA emulation: one per CUDA thread of a block, each on its own stack,
// switched by a few instructions of assembly (saving the callee-saved registers), so that a
// block of 1024 threads can meet at a barrier thousands of times a second.
//
// Switches are announced to AddressSanitizer and ThreadSanitizer when they are linked in (weak
// symbols: one build of this library serves plain, ASan and TSan binaries). Under TSan each
// fiber is its own TSan thread and switching implies no synchronization: the emulation adds
// happens-before edges only where CUDA guarantees them (barriers, warp syncs, kernel start/end).
#ifndef SLUICE_KERNELS_CUDA_EMU_FIBER_H_
#define SLUICE_KERNELS_CUDA_EMU_FIBER_H_

#include <cstddef>

namespace sluice::emu {

class Fiber {
 public:
  using Entry = void (*)(void* arg);

  // A fiber that will run entry(arg) on a fresh stack of `stack_bytes` (a guard page below).
  // `entry` must never return: it ends with Finish().
  Fiber(Entry entry, void* arg, size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Re-arms a finished fiber to run entry(arg) again from the top of its stack.
  void Restart(Entry entry, void* arg);

  // From the scheduler (the thread's own stack): runs this fiber until it yields or finishes.
  void Resume();
  // From inside this fiber: back to the scheduler; returns when resumed.
  void Yield();
  // From inside this fiber, as its last act: back to the scheduler for good.
  [[noreturn]] void Finish();

  bool finished() const { return finished_; }

 private:
  void Map();
  void Prepare(Entry entry, void* arg);
  static void Start(Fiber* self);

  Entry entry_ = nullptr;
  void* arg_ = nullptr;
  char* mapping_ = nullptr;  // guard page + stack
  size_t mapping_bytes_ = 0;
  char* stack_lo_ = nullptr;
  size_t stack_bytes_ = 0;
  void* sp_ = nullptr;            // saved stack pointer of this fiber while it is switched out
  void* scheduler_sp_ = nullptr;  // saved stack pointer of the scheduler while this one runs
  const void* scheduler_stack_lo_ = nullptr;  // for ASan
  size_t scheduler_stack_bytes_ = 0;
  void* asan_fake_stack_ = nullptr;
  void* tsan_fiber_ = nullptr;
  void* tsan_scheduler_ = nullptr;
  bool finished_ = false;
};

// Sanitizer hooks, no-ops when the sanitizer is not linked in.
void TsanAcquire(void* addr);
void TsanRelease(void* addr);
// Accesses between Begin and End are not checked by TSan (the emulation's own bookkeeping and
// the poisoning of fresh shared memory).
void TsanIgnoreBegin();
void TsanIgnoreEnd();
bool TsanActive();
// Marks [addr, addr + bytes) inaccessible or accessible again for ASan.
void AsanPoison(const void* addr, size_t bytes);
void AsanUnpoison(const void* addr, size_t bytes);

}  // namespace sluice::emu

#endif  // SLUICE_KERNELS_CUDA_EMU_FIBER_H_
