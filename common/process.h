// Process-level helpers of sluice's servers.
#ifndef SLUICE_COMMON_PROCESS_H_
#define SLUICE_COMMON_PROCESS_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sluice {

// Blocks SIGINT and SIGTERM in this thread and every thread it starts later; call first thing
// in main, then WaitForShutdownSignal() once the servers run.
void BlockShutdownSignals();
// Waits for SIGINT or SIGTERM; returns the signal.
int WaitForShutdownSignal();
// WaitForShutdownSignal, then says "<name>: signal N, stopping" on stderr.
void AwaitShutdown(const std::string& name);

// main() of a sluice server: blocks the shutdown signals, fixes malloc's mmap threshold at 1 MiB
// (large transient buffers mapped on their own, so that a load leaves no residue in the heap),
// parses flags, bounds malloc's arenas at --malloc_arenas, runs `run` and turns its status into
// the exit code, printing "<program>: <error>" on failure.
int ServerMain(int argc, char** argv, const char* program,
               const std::function<absl::Status()>& run);

// The name a model is served under: its file name without directory and ".gguf".
std::string ServedModelName(const std::string& path);

// This process's resident set (/proc/self/statm), in bytes; 0 where it cannot be read.
int64_t ResidentSetBytes();

// Bytes of host memory [p, p + bytes) backed by physical memory now (mincore): how much of a
// buffer allocated whole and touched as it is used, like a KV page pool, the process's RSS
// holds. 0 for memory the kernel does not map for this process (device memory).
int64_t ResidentBytes(const void* p, size_t bytes);

// Gives the heap's free memory back to the system (glibc's malloc_trim) when a process is idle
// and either was busy at a look since the last trim, or holds more free memory, or has a
// larger RSS, than at its last trim or since (by 4 MiB): what a load's peak left in the
// allocator's arenas (one per thread that served a stream), what a dropped cache freed while
// nothing ran, or what a burst between two looks touched and freed again, does not stay in
// its RSS. Looks every `period` on a thread of its own.
class IdleTrimmer {
 public:
  explicit IdleTrimmer(std::function<bool()> idle, absl::Duration period = absl::Seconds(2));
  ~IdleTrimmer();
  // Trims done (for tests and logs).
  int trims() const { return trims_.load(); }

 private:
  std::function<bool()> idle_;
  absl::Duration period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> trims_{0};
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_PROCESS_H_
