#include "common/metrics_server.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "prometheus/text_serializer.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  auto server = http::Server::Start(
      {.host = host, .port = port, .read_deadline = absl::Seconds(5)},
      {{"GET /metrics", [registry](http::Request, std::shared_ptr<http::Responder> reply) {
          reply->Send(200, "text/plain; version=0.0.4; charset=utf-8",
                      prometheus::TextSerializer().Serialize(registry->Collect()));
        }}});
  if (!server.ok()) {
    return absl::UnavailableError(absl::StrFormat("cannot serve metrics on %s:%d (%s)", host, port,
                                                  server.status().message()));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(*std::move(server)));
}

}  // namespace sluice
