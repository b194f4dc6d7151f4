#include "common/worker_health.h"

#include <utility>

namespace sluice {

WorkerHealth HealthOf(const rpc::StatsResponse& stats, absl::Time now) {
  WorkerHealth h;
  h.live = now - absl::FromUnixMillis(stats.loop_turned_unix_ms()) < kLoopStallBound;
  const bool has_pools = stats.kv_pages_used() + stats.kv_pages_free() > 0;
  h.ready = h.live && stats.state() == "serving" && (!has_pools || stats.kv_pages_free() > 0);
  return h;
}

WorkerHealthReporter::WorkerHealthReporter(grpc::HealthCheckServiceInterface* service,
                                           std::function<WorkerHealth()> health,
                                           absl::Duration period)
    : service_(service), health_(std::move(health)), period_(period) {
  Report();
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, absl::ToChronoMilliseconds(period_), [&] { return stop_; })) {
      lock.unlock();
      Report();
      lock.lock();
    }
  });
}

WorkerHealthReporter::~WorkerHealthReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  service_->Shutdown();  // NOT_SERVING everywhere, and it stays so
}

void WorkerHealthReporter::Report() {
  const WorkerHealth h = health_();
  service_->SetServingStatus(kLivenessService, h.live);
  service_->SetServingStatus(kReadinessService, h.ready);
  service_->SetServingStatus("", h.ready);
}

}  // namespace sluice
