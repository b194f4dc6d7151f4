// A worker's Prometheus endpoint: GET /metrics on its own port, the registry in the text
// exposition format (common/http_server.h serving, prometheus-cpp serializing). Slow or idle
// scrapers hold a socket each, never a thread.
#ifndef SLUICE_COMMON_METRICS_SERVER_H_
#define SLUICE_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "prometheus/registry.h"

namespace sluice {

class MetricsServer {
 public:
  // Listens on host:port (port 0: any free port); Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);

  int port() const { return server_->port(); }

 private:
  explicit MetricsServer(std::unique_ptr<http::Server> server) : server_(std::move(server)) {}

  std::unique_ptr<http::Server> server_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_METRICS_SERVER_H_
