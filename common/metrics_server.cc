#include "common/metrics_server.h"

#include "absl/strings/str_format.h"
#include "prometheus/text_serializer.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->registry_ = std::move(registry);
  m->server_.Get("/metrics", [r = m->registry_](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(r->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  m->port_ = port == 0 ? m->server_.bind_to_any_port(host) : port;
  if (m->port_ <= 0 || (port != 0 && !m->server_.bind_to_port(host, port))) {
    return absl::UnavailableError(
        absl::StrFormat("cannot serve metrics on %s:%d (port in use?)", host, port));
  }
  m->thread_ = std::thread([s = &m->server_] { s->listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  server_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace sluice
