// sluice-router: the OpenAI-compatible HTTP front of a sluice cluster.
//
//   sluice-router --port 8000 --prefill 127.0.0.1:50100 --decode 127.0.0.1:50200
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/grpc_auth.h"
#include "common/http_server.h"
#include "common/process.h"
#include "model/model_path.h"
#include "router/router.h"

ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, served_model_name, "", "Model id clients send; default: the file name.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind.");
ABSL_FLAG(int, port, 8000, "HTTP port.");
ABSL_FLAG(std::string, prefill, "127.0.0.1:50100",
          "Prefill workers, comma-separated: host:port, dns:NAME:PORT or file:PATH (looked at "
          "again every second).");
ABSL_FLAG(std::string, decode, "127.0.0.1:50200", "Decode workers, as --prefill.");
ABSL_FLAG(std::string, placement, "prefix_affinity",
          "round_robin, least_loaded or prefix_affinity (prefill: where the fewest prompt tokens "
          "would be computed, given the prefixes each worker caches).");
ABSL_FLAG(std::string, api_key, "", "Require 'Authorization: Bearer KEY'; empty: no key.");
ABSL_FLAG(std::string, api_key_file, "",
          "As --api_key, the key read from this file (a Kubernetes Secret); at least 16 "
          "characters.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the cluster token the workers require of gRPC calls (./sluice up writes "
          "one); empty: send none.");
ABSL_FLAG(int, max_migrations, 3,
          "Times a generation moves to other workers when its decode worker fails or stalls "
          "mid-stream (0: the stream ends with an error instead).");
ABSL_FLAG(double, stall_timeout, 10,
          "Seconds a generation may send nothing before it counts as stalled and migrates (at "
          "least; 50 times the stream's inter-token time when that is longer).");
ABSL_FLAG(std::string, migration, "replay",
          "How a generation moves off a failed decode worker: replay (the prompt prefilled, the "
          "generated tokens fed by decode steps: the text goes on exactly as it would have) or "
          "prefill (prompt and generated tokens in one prefill: faster, but with a lossy KV "
          "preset the text may part from what it would have been).");
ABSL_FLAG(int, start_threads, 64,
          "Threads that start requests (tokenize, reserve, wait for the prefill), at most; "
          "requests past them queue holding no thread, a streaming request holds none, and a "
          "start thread idle for 5 s ends.");
ABSL_FLAG(int, metrics_port, 0,
          "A listener of its own for /health and /metrics (4 threads, 5 s to read a request), so "
          "that probes and scrapes are answered while streams hold the API's threads; 0: none "
          "(both stay on --port either way).");

namespace sluice {
namespace {

std::vector<std::string> List(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    out.emplace_back(part);
  }
  return out;
}

absl::Status Run() {
  std::string api_key = absl::GetFlag(FLAGS_api_key);
  if (const std::string file = absl::GetFlag(FLAGS_api_key_file); !file.empty()) {
    if (!api_key.empty()) {
      return absl::InvalidArgumentError("give --api_key or --api_key_file, not both");
    }
    absl::StatusOr<std::string> key = ReadSecretFile(file, "API key");
    if (!key.ok()) return key.status();
    api_key = *std::move(key);
  }
  const std::string migration = absl::GetFlag(FLAGS_migration);
  if (migration != "replay" && migration != "prefill") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--migration=%s: must be replay or prefill", migration));
  }
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  auto router =
      router::Router::Create({.model_path = path,
                              .served_model_name = absl::GetFlag(FLAGS_served_model_name),
                              .prefill = List(absl::GetFlag(FLAGS_prefill)),
                              .decode = List(absl::GetFlag(FLAGS_decode)),
                              .placement = absl::GetFlag(FLAGS_placement),
                              .api_key = api_key,
                              .auth_token_file = absl::GetFlag(FLAGS_auth_token_file),
                              .max_migrations = absl::GetFlag(FLAGS_max_migrations),
                              .stall_timeout = absl::Seconds(absl::GetFlag(FLAGS_stall_timeout)),
                              .replay_migrations = migration == "replay",
                              .start_threads = absl::GetFlag(FLAGS_start_threads)});
  if (!router.ok()) return router.status();
  const std::string host = absl::GetFlag(FLAGS_host);
  http::ServerOptions api{.host = host,
                          .port = absl::GetFlag(FLAGS_port),
                          // The router answers a body past its max_body_bytes itself (413, as
                          // OpenAI words it); the server stops reading at twice that.
                          .max_body_bytes = 2 * router::RouterOptions{}.max_body_bytes,
                          .error_body = router::Router::ErrorBodyFor};
  absl::StatusOr<std::unique_ptr<http::Server>> server =
      http::Server::Start(api, (*router)->Routes());
  if (!server.ok()) return server.status();
  std::unique_ptr<http::Server> probes;
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port > 0) {
    absl::StatusOr<std::unique_ptr<http::Server>> p =
        http::Server::Start({.host = host, .port = metrics_port, .read_deadline = absl::Seconds(5)},
                            (*router)->ProbeRoutes());
    if (!p.ok()) return p.status();
    probes = *std::move(p);
  }
  std::cerr << absl::StrFormat("router: serving the OpenAI API on http://%s:%d\n", host,
                               (*server)->port());
  if (metrics_port > 0) {
    std::cerr << absl::StrFormat("router: /health and /metrics also on http://%s:%d\n", host,
                                 metrics_port);
  }
  IdleTrimmer trimmer([r = router->get()] { return r->Idle(); });
  AwaitShutdown("router");
  // Listeners first, then the router: it cancels the requests still running and awaits them.
  server->reset();
  probes.reset();
  router->reset();
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::ServerMain(argc, argv, "sluice-router", sluice::Run);
}
