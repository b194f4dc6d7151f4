// The router: sluice's OpenAI-compatible HTTP front (cpp-httplib). For each request it
// tokenizes (chat template from the GGUF), picks a decode worker and reserves KV pages there,
// picks a prefill worker that computes the prompt and writes its compressed KV into those
// pages, then streams the decode worker's tokens back as JSON or Server-Sent Events.
//
// A request whose reservation, prefill or decode admission fails on a worker that is down is
// tried again on another worker, as long as nothing has reached the client. A client that goes
// away mid-stream cancels the decode call, which frees the sequence's pages at once.
//
//   POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
//   GET /metrics (Prometheus text), GET /v1/workers (the workers' state, for `sluice status`)
#ifndef SLUICE_ROUTER_ROUTER_H_
#define SLUICE_ROUTER_ROUTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "httplib.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "router/openai_api.h"
#include "router/request_flow.h"
#include "router/worker_registry.h"

namespace sluice::router {

class TextAssembler;

struct RouterOptions {
  std::string model_path;
  std::string served_model_name;     // empty: the file's name without ".gguf"
  std::vector<std::string> prefill;  // host:port of each prefill worker
  std::vector<std::string> decode;   // host:port of each decode worker
  std::string placement = "least_loaded";
  std::string default_preset;  // what the workers use for requests naming none
  std::string api_key;         // empty: no authentication
  // The cluster token its gRPC calls to the workers carry (grpc_auth.h); empty: none.
  std::string auth_token_file;
  size_t max_body_bytes = 8 << 20;
  int max_attempts = 3;                              // workers tried per request
  absl::Duration queue_timeout = absl::Seconds(60);  // waiting for KV pages on every decoder
  absl::Duration poll = absl::Seconds(1);
  // A generation whose decode worker fails or stalls mid-stream continues on other workers
  // (RequestFlow::Continue) at most this many times.
  int max_migrations = 3;
  // Stalled: nothing from the decode worker for this long, or 50 inter-token times if longer.
  absl::Duration stall_timeout = absl::Seconds(10);
};

class Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);

  // Installs the routes on `server`.
  void Install(httplib::Server& server);
  // Installs /health and /metrics alone: a listener of their own, so that probes and scrapes
  // are answered however many streams hold the API's threads.
  void InstallProbes(httplib::Server& server);

 private:
  explicit Router(RouterOptions options);

  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleHealth(const httplib::Request& req, httplib::Response& res);
  void HandleMetrics(const httplib::Request& req, httplib::Response& res);
  void HandleWorkers(const httplib::Request& req, httplib::Response& res);
  bool Authorized(const httplib::Request& req, httplib::Response& res);
  void SendError(httplib::Response& res, const absl::Status& status);

  struct Prepared;  // a validated request with its prompt ids and sampling
  absl::StatusOr<std::shared_ptr<Prepared>> Prepare(Endpoint endpoint, const std::string& body);
  struct Session;  // a running request: its generation and what was sent
  // Reserve, prefill and open the decode stream, retrying on other workers (RequestFlow).
  absl::StatusOr<std::shared_ptr<Session>> Start(const std::shared_ptr<Prepared>& p);
  // Feeds the session's tokens to `text` (the first from prefill, then the decode stream),
  // calling `progress` after each message; ends when the generation does, a stop string
  // matches, or `progress` returns false (the client went away: Cancelled). Unavailable when
  // the decode worker fails mid-stream. The decode call is cancelled whenever it ends early.
  absl::Status Drive(Session& s, TextAssembler& text, const std::function<bool()>& progress);

  RouterOptions options_;
  std::unique_ptr<model::GgufFile> gguf_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::ChatTemplate> chat_;
  int64_t context_length_ = 0;
  int32_t head_dim_ = 0;
  std::vector<int32_t> stop_tokens_;
  int64_t created_ = 0;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RequestFlow> flow_;  // after registry_: it calls the registry's workers

  std::shared_ptr<prometheus::Registry> metrics_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* retries_ = nullptr;
  prometheus::Family<prometheus::Counter>* migrations_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Counter* transfer_bytes_ = nullptr;
  prometheus::Counter* transfer_seconds_ = nullptr;
  prometheus::Counter* kv_bytes_ = nullptr;
  prometheus::Counter* kv_fp16_bytes_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Family<prometheus::Gauge>* workers_up_ = nullptr;
};

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_ROUTER_H_
