// A worker's health as gRPC's standard health service (grpc.health.v1) reports it, for
// Kubernetes' gRPC probes, grpc_health_probe and the router:
//   "liveness": SERVING while the worker's scheduler loop comes round (a loop stuck for
//     kLoopStallBound is NOT_SERVING: restart it);
//   "readiness", and "" (what a client that names no service asks): SERVING while the worker can
//     take a request now: its loop turns, it is not draining, and its page pools (if it has made
//     any yet) have a free page. The model is loaded and the transport up before the server
//     starts at all.
#ifndef SLUICE_COMMON_WORKER_HEALTH_H_
#define SLUICE_COMMON_WORKER_HEALTH_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/sluice.pb.h"

namespace sluice {

inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "readiness";
// Longer than any one step should hold the loop (a 32k-token prompt's prefill on a CPU).
inline constexpr absl::Duration kLoopStallBound = absl::Minutes(5);

struct WorkerHealth {
  bool live = false;
  bool ready = false;
};

// From a worker's own stats at `now`.
WorkerHealth HealthOf(const rpc::StatsResponse& stats, absl::Time now);

// Keeps a server's built-in health service (grpc::EnableDefaultHealthCheckService) at what
// `health` says, asking every `period` on a thread of its own; on destruction every service
// goes NOT_SERVING for good.
class WorkerHealthReporter {
 public:
  WorkerHealthReporter(grpc::HealthCheckServiceInterface* service,
                       std::function<WorkerHealth()> health, absl::Duration period);
  ~WorkerHealthReporter();
  WorkerHealthReporter(const WorkerHealthReporter&) = delete;
  WorkerHealthReporter& operator=(const WorkerHealthReporter&) = delete;

 private:
  void Report();

  grpc::HealthCheckServiceInterface* const service_;
  const std::function<WorkerHealth()> health_;
  const absl::Duration period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_WORKER_HEALTH_H_
