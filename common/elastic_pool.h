// A pool of threads that grows with its queue up to a bound and shrinks when idle.
#ifndef SLUICE_COMMON_ELASTIC_POOL_H_
#define SLUICE_COMMON_ELASTIC_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace sluice {

// Runs posted tasks on up to `max_threads` threads, starting one only when a task finds none
// idle; a thread idle for `keep_alive` ends. A thread that served a load keeps what it freed in
// its allocator's per-thread cache (glibc's tcache: up to 7 blocks of each size to 1 KiB) where
// no malloc_trim reaches, so a fixed pool's memory grows with every size its threads have seen;
// a thread that ends hands its cache back. Tasks past the bound wait in order, holding no
// thread. Like a java.util.concurrent.ThreadPoolExecutor with no core threads.
class ElasticPool {
 public:
  ElasticPool(int max_threads, absl::Duration keep_alive);
  // Join().
  ~ElasticPool();
  ElasticPool(const ElasticPool&) = delete;
  ElasticPool& operator=(const ElasticPool&) = delete;

  // Queues `task`; after Join() it runs on the caller's thread.
  void Post(std::function<void()> task);
  // Runs every task queued, then ends the threads and waits for them.
  void Join();

  // Threads running now (busy or idle).
  int threads() const;
  // Threads started since the pool was made.
  int started() const;
  // Threads that ended and are not joined yet (each holds its stack): at most one.
  int unjoined() const;

 private:
  void Work(std::list<std::thread>::iterator self);
  // Joins the threads that have ended; mu_ held.
  void ReapLocked();

  const int max_threads_;
  const absl::Duration keep_alive_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // a task queued, or the pool joining
  std::condition_variable ended_cv_;  // a thread ended
  std::deque<std::function<void()>> queue_;
  std::list<std::thread> running_;  // handles of the threads that have not ended
  std::list<std::thread> ended_;    // handles of ended threads, not yet joined
  int idle_ = 0;
  int started_ = 0;
  bool joining_ = false;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_ELASTIC_POOL_H_
