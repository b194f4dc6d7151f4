// The serving loop every worker process shares: its gRPC services on host:port with gRPC's
// standard health service beside them (liveness and readiness from the worker's `stats`,
// worker_health.h),
// its metrics on metrics_port (0: none), until SIGINT or SIGTERM; then it drains and stops.
#ifndef SLUICE_COMMON_WORKER_SERVER_H_
#define SLUICE_COMMON_WORKER_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/worker_health.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "prometheus/registry.h"

namespace sluice {

struct WorkerServeOptions {
  std::string name;    // in logs
  std::string banner;  // printed once serving, after "<name>: "
  std::string host;
  int port = 0;
  int metrics_port = 0;
};

// Blocks until a shutdown signal; Unavailable when a port cannot be bound.
absl::Status ServeWorker(const WorkerServeOptions& options,
                         std::shared_ptr<prometheus::Registry> registry,
                         const std::vector<grpc::Service*>& services,
                         std::function<rpc::StatsResponse()> stats,
                         const std::function<void()>& drain);

}  // namespace sluice

#endif  // SLUICE_COMMON_WORKER_SERVER_H_
