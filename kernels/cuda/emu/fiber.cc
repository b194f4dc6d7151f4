#include "kernels/cuda/emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Sanitizer entry points, resolved only when that sanitizer's runtime is linked in.
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old) __attribute__((weak));
void __asan_poison_memory_region(const volatile void* addr, size_t size) __attribute__((weak));
void __asan_unpoison_memory_region(const volatile void* addr, size_t size) __attribute__((weak));
void* __tsan_get_current_fiber() __attribute__((weak));
void* __tsan_create_fiber(unsigned flags) __attribute__((weak));
void __tsan_destroy_fiber(void* fiber) __attribute__((weak));
void __tsan_switch_to_fiber(void* fiber, unsigned flags) __attribute__((weak));
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
void AnnotateIgnoreReadsBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char* file, int line) __attribute__((weak));

// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *save_sp, loads load_sp and restores the same from there.
void sluice_emu_switch(void** save_sp, void* load_sp);
// First code a fresh fiber runs: calls r13(r12) and never returns.
void sluice_emu_fiber_trampoline();
}

asm(R"(
  .text
  .globl sluice_emu_switch
  .type sluice_emu_switch, @function
sluice_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sluice_emu_switch, .-sluice_emu_switch

  .globl sluice_emu_fiber_trampoline
  .type sluice_emu_fiber_trampoline, @function
sluice_emu_fiber_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size sluice_emu_fiber_trampoline, .-sluice_emu_fiber_trampoline
  .section .note.GNU-stack,"",@progbits
)");

namespace sluice::emu {
namespace {

constexpr unsigned kTsanNoSync = 1;  // __tsan_switch_to_fiber_no_sync

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

Fiber::Fiber(Entry entry, void* arg, size_t stack_bytes) {
  const size_t page = PageBytes();
  stack_bytes_ = (stack_bytes + page - 1) / page * page;
  mapping_bytes_ = stack_bytes_ + page;
  Map();
  Prepare(entry, arg);
}

void Fiber::Map() {
  void* m =
      mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "sluice emu: cannot map a %zu-byte fiber stack\n", mapping_bytes_);
    std::abort();
  }
  mapping_ = static_cast<char*>(m);
  mprotect(mapping_, PageBytes(), PROT_NONE);  // a stack overflow faults instead of corrupting
  stack_lo_ = mapping_ + PageBytes();
}

Fiber::~Fiber() {
  if (tsan_fiber_ != nullptr && __tsan_destroy_fiber) __tsan_destroy_fiber(tsan_fiber_);
  if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(stack_lo_, stack_bytes_);
  munmap(mapping_, mapping_bytes_);
}

void Fiber::Restart(Entry entry, void* arg) { Prepare(entry, arg); }

void Fiber::Prepare(Entry entry, void* arg) {
  entry_ = entry;
  arg_ = arg;
  finished_ = false;
  asan_fake_stack_ = nullptr;
  // A finished fiber's frames may still be poisoned by ASan; the stack starts clean.
  if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(stack_lo_, stack_bytes_);
  // One TSan thread per fiber for its whole life: the CUDA thread of the same index in every
  // block. Creating one per block and thread costs a TSan thread state each time (minutes for a
  // test); the price is that two blocks' threads of the same index are ordered for TSan.
  if (__tsan_create_fiber && tsan_fiber_ == nullptr) tsan_fiber_ = __tsan_create_fiber(0);
  // The frame sluice_emu_switch pops: control words, r15, r14, r13, r12, rbx, rbp, return
  // address. After its `ret` the stack pointer is the 16-byte aligned top, as a call expects.
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack_lo_ + stack_bytes_) &
                                          ~uintptr_t{15});
  uint64_t* frame = top - 8;
  uint32_t mxcsr = 0;
  uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  frame[0] = uint64_t{mxcsr} | (uint64_t{fpcw} << 32);
  frame[1] = 0;                                          // r15
  frame[2] = 0;                                          // r14
  frame[3] = reinterpret_cast<uint64_t>(&Fiber::Start);  // r13: the function
  frame[4] = reinterpret_cast<uint64_t>(this);           // r12: its argument
  frame[5] = 0;                                          // rbx
  frame[6] = 0;                                          // rbp
  frame[7] = reinterpret_cast<uint64_t>(&sluice_emu_fiber_trampoline);
  sp_ = frame;
}

void Fiber::Start(Fiber* self) {
  if (__sanitizer_finish_switch_fiber) {
    __sanitizer_finish_switch_fiber(nullptr, &self->scheduler_stack_lo_,
                                    &self->scheduler_stack_bytes_);
  }
  self->entry_(self->arg_);
  std::fprintf(stderr, "sluice emu: a fiber's entry returned instead of calling Finish()\n");
  std::abort();
}

void Fiber::Resume() {
  void* fake = nullptr;
  if (__sanitizer_start_switch_fiber) {
    __sanitizer_start_switch_fiber(&fake, stack_lo_, stack_bytes_);
  }
  if (tsan_fiber_ != nullptr) {
    tsan_scheduler_ = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(tsan_fiber_, kTsanNoSync);
  }
  sluice_emu_switch(&scheduler_sp_, sp_);
  if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
}

void Fiber::Yield() {
  if (__sanitizer_start_switch_fiber) {
    __sanitizer_start_switch_fiber(&asan_fake_stack_, scheduler_stack_lo_, scheduler_stack_bytes_);
  }
  if (tsan_fiber_ != nullptr) __tsan_switch_to_fiber(tsan_scheduler_, kTsanNoSync);
  sluice_emu_switch(&sp_, scheduler_sp_);
  if (__sanitizer_finish_switch_fiber) {
    __sanitizer_finish_switch_fiber(asan_fake_stack_, &scheduler_stack_lo_,
                                    &scheduler_stack_bytes_);
  }
}

void Fiber::Finish() {
  finished_ = true;
  if (__sanitizer_start_switch_fiber) {
    __sanitizer_start_switch_fiber(nullptr, scheduler_stack_lo_, scheduler_stack_bytes_);
  }
  if (tsan_fiber_ != nullptr) __tsan_switch_to_fiber(tsan_scheduler_, kTsanNoSync);
  sluice_emu_switch(&sp_, scheduler_sp_);
  std::fprintf(stderr, "sluice emu: a finished fiber was resumed\n");
  std::abort();
}

void TsanAcquire(void* addr) {
  if (__tsan_acquire) __tsan_acquire(addr);
}
void TsanRelease(void* addr) {
  if (__tsan_release) __tsan_release(addr);
}
void TsanIgnoreBegin() {
  if (AnnotateIgnoreReadsBegin) {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
}
void TsanIgnoreEnd() {
  if (AnnotateIgnoreReadsEnd) {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
}
bool TsanActive() { return __tsan_create_fiber != nullptr; }
void AsanPoison(const void* addr, size_t bytes) {
  if (__asan_poison_memory_region) __asan_poison_memory_region(addr, bytes);
}
void AsanUnpoison(const void* addr, size_t bytes) {
  if (__asan_unpoison_memory_region) __asan_unpoison_memory_region(addr, bytes);
}

}  // namespace sluice::emu
