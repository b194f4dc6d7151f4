#include "common/process.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"

ABSL_FLAG(int, malloc_arenas, 2,
          "malloc arenas this process may use (glibc's default, 0 here, is 8 per core): each "
          "arena keeps its own free memory and fragments on its own, so a server whose threads "
          "each had one grows with every thread a load wakes");

namespace sluice {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

constexpr int kMmapThresholdBytes = 1 << 20;

}  // namespace

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  const sigset_t set = ShutdownSignals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

void AwaitShutdown(const std::string& name) {
  const int sig = WaitForShutdownSignal();
  std::cerr << name << ": signal " << sig << ", stopping\n";
}

int ServerMain(int argc, char** argv, const char* program,
               const std::function<absl::Status()>& run) {
  BlockShutdownSignals();
  // glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so
  // after the first request a request's transient buffers (prompt activations, attention
  // scores, coded pages, messages) are cut from the malloc arenas, among small blocks that
  // outlive them; what stays resident after a load then depends on the order requests came
  // in (two prefill workers warmed up alike differed by 37 MiB). A fixed threshold (which also
  // stops the adjustment) maps every block of 1 MiB or more on its own and unmaps it on free.
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  absl::ParseCommandLine(argc, argv);
  // Before `run` starts threads: glibc gives a thread's first allocation an arena of its own
  // until the bound is reached, then shares; each arena keeps its own free memory and
  // fragments apart (a router had 16 on 2 cores, a decode worker's 100-request run grew 6.9%
  // with glibc's bound and 1.1% with 2).
  if (absl::GetFlag(FLAGS_malloc_arenas) > 0)
    mallopt(M_ARENA_MAX, absl::GetFlag(FLAGS_malloc_arenas));
  const absl::Status st = run();
  if (!st.ok()) {
    std::cerr << program << ": " << st << "\n";
    return 1;
  }
  return 0;
}

std::string ServedModelName(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  const std::string ext = ".gguf";
  if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
    name.resize(name.size() - ext.size());
  }
  return name;
}

int64_t ResidentSetBytes() {
  // statm: program size, then resident pages.
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  const int n = fscanf(f, "%ld %ld", &size, &resident);
  fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : 0;
}

int64_t ResidentBytes(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return 0;
  int64_t resident = 0;
  for (unsigned char v : in) resident += v & 1;
  return resident * static_cast<int64_t>(page);
}

IdleTrimmer::IdleTrimmer(std::function<bool()> idle, absl::Duration period)
    : idle_(std::move(idle)), period_(period) {
  thread_ = std::thread([this] {
    // Free bytes in the arenas (trimmed or not: malloc_trim hands pages back but the chunks
    // stay free) and the RSS, each at its lowest since the last trim. Free bytes beyond theirs
    // are memory freed since; an RSS beyond its own is memory touched since, which free chunks
    // taken again and freed between two looks leave resident without freeing more bytes.
    constexpr size_t kSlackBytes = size_t{4} << 20;
    size_t low = mallinfo2().fordblks;
    int64_t low_rss = ResidentSetBytes();
    bool busy = false;
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, absl::ToChronoMilliseconds(period_), [&] { return stop_; })) {
      const size_t free_bytes = mallinfo2().fordblks;
      const int64_t rss = ResidentSetBytes();
      low = std::min(low, free_bytes);
      low_rss = std::min(low_rss, rss);
      if (!idle_()) {
        busy = true;
      } else if (busy || free_bytes > low + kSlackBytes ||
                 rss > low_rss + static_cast<int64_t>(kSlackBytes)) {
        malloc_trim(0);
        ++trims_;
        busy = false;
        low = mallinfo2().fordblks;
        low_rss = ResidentSetBytes();
      }
    }
  });
}

IdleTrimmer::~IdleTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace sluice
