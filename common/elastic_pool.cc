#include "common/elastic_pool.h"

#include <algorithm>
#include <utility>

namespace sluice {

ElasticPool::ElasticPool(int max_threads, absl::Duration keep_alive)
    : max_threads_(std::max(1, max_threads)), keep_alive_(keep_alive) {}

ElasticPool::~ElasticPool() { Join(); }

void ElasticPool::Post(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mu_);
  if (joining_) {
    lock.unlock();
    task();
    return;
  }
  ReapLocked();
  queue_.push_back(std::move(task));
  // A thread idle but not yet woken by an earlier task counts as taken.
  if (idle_ >= static_cast<int>(queue_.size())) {
    cv_.notify_one();
    return;
  }
  if (static_cast<int>(running_.size()) >= max_threads_) return;  // waits for a thread
  ++started_;
  running_.emplace_back();
  auto self = std::prev(running_.end());
  *self = std::thread([this, self] { Work(self); });
}

void ElasticPool::Work(std::list<std::thread>::iterator self) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      ++idle_;
      const bool woken = cv_.wait_for(lock, absl::ToChronoNanoseconds(keep_alive_),
                                      [&] { return !queue_.empty() || joining_; });
      --idle_;
      if (!woken || queue_.empty()) break;  // idle for keep_alive, or joining with nothing left
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it holds goes before the lock is taken again
    lock.lock();
  }
  // The threads that ended before this one are past all use of the pool (they released the
  // lock): joined here, their stacks go now rather than with the next task, which after a
  // burst could be a long while. This one's handle moves to ended_ for the next to join.
  ReapLocked();
  ended_.splice(ended_.end(), running_, self);
  ended_cv_.notify_all();
}

int ElasticPool::unjoined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(ended_.size());
}

void ElasticPool::ReapLocked() {
  for (std::thread& t : ended_) t.join();
  ended_.clear();
}

void ElasticPool::Join() {
  std::unique_lock<std::mutex> lock(mu_);
  joining_ = true;
  cv_.notify_all();
  ended_cv_.wait(lock, [&] { return running_.empty(); });
  // Tasks queued with no thread left to take them (every thread ended between their posting
  // and the join): run here.
  while (!queue_.empty()) {
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
  ReapLocked();
}

int ElasticPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

int ElasticPool::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

}  // namespace sluice
