#include "common/worker_server.h"

#include <chrono>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/metrics_server.h"
#include "common/process.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace sluice {

absl::Status ServeWorker(const WorkerServeOptions& options,
                         std::shared_ptr<prometheus::Registry> registry,
                         const std::vector<grpc::Service*>& services,
                         std::function<rpc::StatsResponse()> stats,
                         const std::function<void()>& drain) {
  std::unique_ptr<MetricsServer> metrics;
  if (options.metrics_port > 0) {
    auto m = MetricsServer::Start(options.host, options.metrics_port, std::move(registry));
    if (!m.ok()) return m.status();
    metrics = *std::move(m);
  }
  const std::string address = absl::StrFormat("%s:%d", options.host, options.port);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  // A port another process holds is an error, not a port shared with it (gRPC's default on
  // Linux is SO_REUSEPORT: two workers on one port would split its requests between them).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A sequence's KV state (its full-precision window included) travels in one message.
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError("cannot serve gRPC on " + address + " (port in use?)");
  IdleTrimmer trimmer([stats] {
    const rpc::StatsResponse s = stats();
    return s.running() == 0 && s.waiting() == 0 && s.queued_prompt_tokens() == 0;
  });
  auto reporter = std::make_unique<WorkerHealthReporter>(
      server->GetHealthCheckService(),
      [stats = std::move(stats)] { return HealthOf(stats(), absl::Now()); }, absl::Seconds(1));
  std::cerr << absl::StrFormat("%s: %s on %s\n", options.name, options.banner, address);
  AwaitShutdown(options.name);
  drain();
  reporter.reset();  // NOT_SERVING from here on
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace sluice
