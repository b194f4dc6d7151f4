// A worker's Prometheus endpoint: GET /metrics on its own port, the registry in the text
// exposition format (cpp-httplib serving, prometheus-cpp serializing).
#ifndef SLUICE_COMMON_METRICS_SERVER_H_
#define SLUICE_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "httplib.h"
#include "prometheus/registry.h"

namespace sluice {

class MetricsServer {
 public:
  // Listens on host:port (port 0: any free port); Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();

  int port() const { return port_; }

 private:
  MetricsServer() = default;

  httplib::Server server_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_METRICS_SERVER_H_
