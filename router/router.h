// The router: sluice's OpenAI-compatible HTTP front (common/http_server.h). For each request it
// tokenizes (chat template from the GGUF), picks a decode worker and reserves KV pages there,
// picks a prefill worker that computes the prompt and writes its compressed KV into those
// pages, then streams the decode worker's tokens back as JSON or Server-Sent Events.
//
// A request whose reservation, prefill or decode admission fails on a worker that is down is
// tried again on another worker, as long as nothing has reached the client. A client that goes
// away mid-stream cancels the decode call, which frees the sequence's pages at once.
//
// Threads: the HTTP server's I/O thread answers probes, metrics and the model list, and hands
// each generation to a pool of start threads (tokenize, reserve, prefill, open the decode
// stream: calls that wait). From its first token on, a request holds no thread: its decode
// stream's callbacks (gRPC's callback API) feed its text to the client; a migration goes back
// to a start thread.
//
//   POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
//   GET /metrics (Prometheus text), GET /v1/workers (the workers' state, for `sluice status`)
#ifndef SLUICE_ROUTER_ROUTER_H_
#define SLUICE_ROUTER_ROUTER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/elastic_pool.h"
#include "common/http_server.h"
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
  // Migrations replay the generated tokens (exact) rather than prefill them (one step).
  bool replay_migrations = true;
  // Threads that start requests (each waits through its request's reservation and prefill);
  // requests past them wait in a queue, holding no thread. A start thread idle for
  // start_thread_keep_alive ends (what its allocator cached goes with it).
  int start_threads = 64;
  absl::Duration start_thread_keep_alive = absl::Seconds(5);
};

class Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);

  // Cancels every running request and waits for each to end.
  ~Router();

  // No request is running and no start thread is left: the moment to give memory back.
  bool Idle() const { return running_->Value() == 0 && starts_->threads() == 0; }

  // The API's routes, for an http::Server.
  std::map<std::string, http::Handler> Routes();
  // /health and /metrics alone: a listener of their own for probes and scrapes.
  std::map<std::string, http::Handler> ProbeRoutes();
  // The body of the errors the HTTP server answers itself (OpenAI's error object).
  static std::pair<std::string, std::string> ErrorBodyFor(int status, const std::string& message);

 private:
  explicit Router(RouterOptions options);

  using Reply = std::shared_ptr<http::Responder>;
  void HandleGenerate(Endpoint endpoint, http::Request req, Reply reply);
  void HandleModels(const http::Request& req, const Reply& reply);
  void HandleHealth(const Reply& reply);
  void HandleMetrics(const Reply& reply);
  void HandleWorkers(const http::Request& req, const Reply& reply);
  // POST /reset_prefix_cache (as vLLM's): every worker drops its reusable prefixes; 200 with
  // what each dropped, 503 when one did not answer.
  void HandleResetPrefixCache(const http::Request& req, Reply reply);
  bool Authorized(const http::Request& req, const Reply& reply);
  static void SendError(const Reply& reply, const absl::Status& status);

  struct Prepared;  // a validated request with its prompt ids and sampling
  absl::StatusOr<std::shared_ptr<Prepared>> Prepare(Endpoint endpoint, const std::string& body);
  struct Session;  // a running request (one choice of it): its generation and what was sent
  struct Choices;  // what the choices of a request with several share until the last ends
  // On a start thread: prepare, then reserve, prefill and open the decode stream, retrying on
  // other workers (RequestFlow); answers the error when that fails.
  void StartRequest(Endpoint endpoint, std::string body, Reply reply);
  // The session's run from its first token (the prefill's): feeds tokens to its text and the
  // text to the client, as the decode stream's messages come. Ends the request when the
  // generation does, a stop string matches or the client goes (the decode call cancelled
  // whenever it ends early); a decode worker that fails or stalls mid-stream has the
  // generation continue elsewhere (Migrate).
  void Run(const std::shared_ptr<Session>& s);
  void ReadNext(const std::shared_ptr<Session>& s);
  void OnMessage(const std::shared_ptr<Session>& s, bool ok);
  // The run is over, for the reason given (kNone: it broke off): finishes its stream and ends
  // the request or moves it.
  void EndRun(const std::shared_ptr<Session>& s, FinishReason finish);
  // On a start thread: continues the generation on other workers (RequestFlow::Continue).
  void Migrate(const std::shared_ptr<Session>& s, absl::Status failure);
  // Sends what is left, the last events or the whole completion, and counts the request. A
  // choice of several sends its last chunk; the choice that ends last sends the rest.
  void Complete(const std::shared_ptr<Session>& s, absl::Status status);
  void CompleteChoice(const std::shared_ptr<Session>& s, absl::Status status);
  // Every choice has ended: sends the response's end (`choices` for a response not streamed),
  // counts the request under `reason` and releases the session.
  void EndResponse(const std::shared_ptr<Session>& s, bool gone, const absl::Status& error,
                   int completion_tokens, std::vector<CompletionChoice> choices,
                   const std::string& reason);
  // The session no longer runs: its run goes, and it leaves live_.
  void Release(const std::shared_ptr<Session>& s);
  // Streams the text ready so far (the last chunk when `ended`); false once the client has gone.
  bool Emit(Session& s, bool ended);

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
  std::unique_ptr<ElasticPool> starts_;

  // Requests between their start and their end, for the destructor to cancel and await.
  std::mutex live_mu_;
  std::condition_variable live_cv_;
  std::map<Session*, std::weak_ptr<Session>> live_;
  bool closing_ = false;

  std::shared_ptr<prometheus::Registry> metrics_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* retries_ = nullptr;
  prometheus::Family<prometheus::Counter>* migrations_ = nullptr;
  prometheus::Histogram* migration_detect_ = nullptr;
  prometheus::Histogram* migration_recover_ = nullptr;
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
