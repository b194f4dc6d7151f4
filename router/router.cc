#include "router/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/process.h"
#include "common/sampling.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "kvstore/kv_preset.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"
#include "router/text_assembler.h"

namespace sluice::router {
namespace {

const std::vector<double> kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
                                             1.0,   2.5,  5.0,   7.5,  10,    20,  40,   80,  160};
const std::vector<double> kTokenBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                           0.15,  0.2,   0.3,  0.4,  0.5,  0.75, 1.0,  2.5};
// A migration's phases take seconds: its detection up to the stall bound, its recovery a prefill.
const std::vector<double> kMigrationBuckets = {0.05, 0.1, 0.25, 0.5, 1,  1.5, 2,  3,  4,  5,  6,
                                               7.5,  10,  12.5, 15,  20, 25,  30, 40, 60, 90, 120};

const char* EndpointName(Endpoint e) {
  return e == Endpoint::kCompletions ? "completions" : "chat_completions";
}

}  // namespace

struct Router::Prepared {
  ApiRequest api;
  std::vector<int32_t> prompt;
  rpc::SamplingParams sampling;
  model::SamplingParams stops;  // stop strings only, for the text
  absl::Time arrived;
  int cached_tokens = 0;  // of the prompt, forked from the prefill worker's prefix cache
};

// The choices of one request with several (n > 1): one session each, running apart (each
// migrates alone), and what the last to end needs to finish the response.
struct Router::Choices {
  std::mutex mu;
  int left = 0;                        // choices still running
  std::vector<CompletionChoice> done;  // by index
  int completion_tokens = 0;           // of every choice
  absl::Status error;                  // the first choice that failed
  bool gone = false;                   // the client went away
};

// One request (or one choice of it) from its start to its last byte. Its steps run one after
// another: on a start thread, then in its decode stream's callbacks, on a start thread again
// for a migration.
struct Router::Session {
  Endpoint endpoint = Endpoint::kCompletions;
  std::shared_ptr<Prepared> p;
  int index = 0;                     // the choice
  std::shared_ptr<Choices> choices;  // null for a request of one choice
  FlowRequest request;
  Reply reply;
  std::unique_ptr<TextAssembler> text;
  StreamInfo info;
  int text_offset = 0;  // characters of text streamed (completions logprobs)
  // Every token the request generated, for a migration to carry over.
  std::vector<int32_t> generated;
  int migrations = 0;
  absl::Duration itl = absl::ZeroDuration();  // the stream's smoothed inter-token time
  absl::Time last;                            // when the last token came
  // When the router saw the run fail or stall, until the next worker's first token.
  absl::Time noticed = absl::InfinitePast();
  rpc::GenerateResponse message;  // the read in flight
  bool stop = false;              // a stop string matched
  uint64_t watch = 0;             // the stall timer of the run
  std::atomic<bool> stalled{false};
  std::atomic<bool> gone{false};  // the client went away

  // The run, shared with a Cancel from the client's or the timer's thread, which holds it
  // while it cancels: a cancelled stream's callbacks may run inside the Cancel, and may end
  // the request.
  std::mutex mu;
  std::shared_ptr<RunningRequest> run;

  void Cancel() {
    std::shared_ptr<RunningRequest> r;
    {
      std::lock_guard<std::mutex> lock(mu);
      r = run;
    }
    if (r != nullptr) r->stream->Cancel();
  }
};

Router::Router(RouterOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if (options.prefill.empty() || options.decode.empty()) {
    return absl::InvalidArgumentError(
        "the router needs at least one prefill and one decode worker");
  }
  SLUICE_ASSIGN_OR_RETURN(Placement placement, ParsePlacement(options.placement));
  std::unique_ptr<Router> r(new Router(options));
  if (r->options_.served_model_name.empty()) {
    r->options_.served_model_name = ServedModelName(options.model_path);
  }
  SLUICE_ASSIGN_OR_RETURN(r->gguf_, model::GgufFile::Open(options.model_path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*r->gguf_));
  SLUICE_ASSIGN_OR_RETURN(r->tokenizer_, model::Tokenizer::Create(std::move(vocab)));
  SLUICE_ASSIGN_OR_RETURN(std::string jinja, r->gguf_->GetString("tokenizer.chat_template"));
  SLUICE_ASSIGN_OR_RETURN(model::ChatTemplate chat, model::ChatTemplate::FromGgufTemplate(jinja));
  r->chat_ = std::make_unique<model::ChatTemplate>(std::move(chat));
  SLUICE_ASSIGN_OR_RETURN(model::LlamaConfig config, model::LlamaConfig::FromGguf(*r->gguf_));
  r->context_length_ = config.context_length;
  r->head_dim_ = static_cast<int32_t>(config.head_dim);
  r->stop_tokens_ = {r->tokenizer_->eos_id()};
  const int32_t unk = r->tokenizer_->unk_id();
  if (unk >= 0 && r->tokenizer_->IsSpecial(unk) && unk != r->tokenizer_->eos_id()) {
    r->stop_tokens_.push_back(unk);
  }
  r->created_ = absl::ToUnixSeconds(absl::Now());

  auto& m = r->metrics_;
  m = std::make_shared<prometheus::Registry>();
  r->requests_ = &prometheus::BuildCounter()
                      .Name("sluice_requests_total")
                      .Help("Requests finished, by endpoint and finish reason (error: failed).")
                      .Register(*m);
  r->retries_ = &prometheus::BuildCounter()
                     .Name("sluice_request_retries_total")
                     .Help("Requests placed again after a worker failed, by the failed role.")
                     .Register(*m);
  r->migrations_ = &prometheus::BuildCounter()
                        .Name("sluice_request_migrations_total")
                        .Help(
                            "Generations moved to other workers mid-stream, by why (failed, "
                            "stalled).")
                        .Register(*m);
  auto& migration_seconds =
      prometheus::BuildHistogram()
          .Name("sluice_migration_seconds")
          .Help(
              "A migration's phases: detect, from the stream's last token to its failure or stall "
              "noticed; recover, from then to the first token from the next decode worker.")
          .Register(*m);
  r->migration_detect_ = &migration_seconds.Add({{"phase", "detect"}}, kMigrationBuckets);
  r->migration_recover_ = &migration_seconds.Add({{"phase", "recover"}}, kMigrationBuckets);
  r->ttft_ = &prometheus::BuildHistogram()
                  .Name("sluice_time_to_first_token_seconds")
                  .Help("From the request's arrival to its first token.")
                  .Register(*m)
                  .Add({}, kLatencyBuckets);
  r->itl_ = &prometheus::BuildHistogram()
                 .Name("sluice_inter_token_latency_seconds")
                 .Help("Time between consecutive tokens of a request.")
                 .Register(*m)
                 .Add({}, kTokenBuckets);
  r->e2e_ = &prometheus::BuildHistogram()
                 .Name("sluice_e2e_request_latency_seconds")
                 .Help("From the request's arrival to its last token.")
                 .Register(*m)
                 .Add({}, kLatencyBuckets);
  r->queue_ = &prometheus::BuildHistogram()
                   .Name("sluice_request_queue_seconds")
                   .Help("From arrival until a decode worker reserved the request's KV pages.")
                   .Register(*m)
                   .Add({}, kLatencyBuckets);
  r->prompt_tokens_ = &prometheus::BuildCounter()
                           .Name("sluice_prompt_tokens_total")
                           .Help("Prompt tokens of the requests served.")
                           .Register(*m)
                           .Add({});
  r->generation_tokens_ = &prometheus::BuildCounter()
                               .Name("sluice_generation_tokens_total")
                               .Help("Tokens generated for the requests served.")
                               .Register(*m)
                               .Add({});
  r->transfer_bytes_ = &prometheus::BuildCounter()
                            .Name("sluice_request_kv_transfer_bytes_total")
                            .Help("Compressed KV page bytes moved from prefill to decode.")
                            .Register(*m)
                            .Add({});
  r->transfer_seconds_ = &prometheus::BuildCounter()
                              .Name("sluice_request_kv_transfer_seconds_total")
                              .Help("Time spent moving KV pages from prefill to decode.")
                              .Register(*m)
                              .Add({});
  r->kv_bytes_ = &prometheus::BuildCounter()
                      .Name("sluice_request_kv_bytes_total")
                      .Help("Compressed KV bytes of the prompts served.")
                      .Register(*m)
                      .Add({});
  r->kv_fp16_bytes_ = &prometheus::BuildCounter()
                           .Name("sluice_request_kv_fp16_bytes_total")
                           .Help("What the prompts' KV would take as FP16.")
                           .Register(*m)
                           .Add({});
  r->running_ = &prometheus::BuildGauge()
                     .Name("sluice_requests_running")
                     .Help("Requests the router is serving.")
                     .Register(*m)
                     .Add({{"role", "router"}});
  r->waiting_ = &prometheus::BuildGauge()
                     .Name("sluice_requests_waiting")
                     .Help("Requests waiting for KV pages on a decode worker.")
                     .Register(*m)
                     .Add({{"role", "router"}});
  r->workers_up_ = &prometheus::BuildGauge()
                        .Name("sluice_workers_up")
                        .Help("Workers answering health checks, by role.")
                        .Register(*m);
  SLUICE_ASSIGN_OR_RETURN(GrpcAuth auth, GrpcAuth::FromFile(options.auth_token_file));
  r->registry_ = std::make_unique<WorkerRegistry>(options.prefill, options.decode, placement,
                                                  options.poll, auth);
  Router* raw = r.get();
  r->flow_ = std::make_unique<RequestFlow>(
      *r->registry_, RequestFlowOptions{.max_attempts = options.max_attempts,
                                        .queue_timeout = options.queue_timeout,
                                        .open_timeout = options.stall_timeout,
                                        .replay_migrations = options.replay_migrations,
                                        .on_retry =
                                            [raw](const char* role) {
                                              raw->retries_->Add({{"role", role}}).Increment();
                                            },
                                        .on_waiting =
                                            [raw](int delta) {
                                              delta > 0 ? raw->waiting_->Increment()
                                                        : raw->waiting_->Decrement();
                                            },
                                        .on_reserved =
                                            [raw](absl::Duration queued) {
                                              raw->queue_->Observe(absl::ToDoubleSeconds(queued));
                                            }});
  r->starts_ =
      std::make_unique<ElasticPool>(options.start_threads, options.start_thread_keep_alive);
  return r;
}

Router::~Router() {
  std::vector<std::weak_ptr<Session>> running;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    closing_ = true;
    for (const auto& [raw, weak] : live_) running.push_back(weak);
  }
  // Outside the lock: a cancelled stream may end its request inside the Cancel.
  for (const std::weak_ptr<Session>& weak : running) {
    if (std::shared_ptr<Session> s = weak.lock()) {
      s->gone = true;
      s->Cancel();
    }
  }
  {
    // A request starting (in its prefill) ends when its call returns.
    std::unique_lock<std::mutex> lock(live_mu_);
    live_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return live_.empty(); });
  }
  if (starts_ != nullptr) starts_->Join();  // null when Create failed before it
}

std::map<std::string, http::Handler> Router::Routes() {
  std::map<std::string, http::Handler> routes = ProbeRoutes();
  routes["POST /v1/completions"] = [this](http::Request q, Reply r) {
    HandleGenerate(Endpoint::kCompletions, std::move(q), std::move(r));
  };
  routes["POST /v1/chat/completions"] = [this](http::Request q, Reply r) {
    HandleGenerate(Endpoint::kChatCompletions, std::move(q), std::move(r));
  };
  routes["GET /v1/models"] = [this](http::Request q, Reply r) { HandleModels(q, r); };
  routes["GET /v1/workers"] = [this](http::Request q, Reply r) { HandleWorkers(q, r); };
  routes["POST /reset_prefix_cache"] = [this](http::Request q, Reply r) {
    HandleResetPrefixCache(q, std::move(r));
  };
  return routes;
}

std::map<std::string, http::Handler> Router::ProbeRoutes() {
  return {{"GET /health", [this](http::Request, Reply r) { HandleHealth(r); }},
          {"GET /metrics", [this](http::Request, Reply r) { HandleMetrics(r); }}};
}

std::pair<std::string, std::string> Router::ErrorBodyFor(int status, const std::string& message) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  return {"application/json", ErrorBody({.http_status = status, .type = type, .message = message})};
}

void Router::SendError(const Reply& reply, const absl::Status& status) {
  const ApiError e = FromStatus(status);
  reply->Send(e.http_status, "application/json", ErrorBody(e));
}

bool Router::Authorized(const http::Request& req, const Reply& reply) {
  if (options_.api_key.empty()) return true;
  if (ConstantTimeEquals(req.Header("Authorization"), "Bearer " + options_.api_key)) {
    return true;
  }
  reply->Send(401, "application/json",
              ErrorBody({.http_status = 401,
                         .type = "invalid_request_error",
                         .message = "Incorrect or missing API key (Authorization: Bearer).",
                         .code = "invalid_api_key"}));
  return false;
}

absl::StatusOr<std::shared_ptr<Router::Prepared>> Router::Prepare(Endpoint endpoint,
                                                                  const std::string& body) {
  auto p = std::make_shared<Prepared>();
  p->arrived = absl::Now();
  SLUICE_ASSIGN_OR_RETURN(p->api, ParseRequest(endpoint, body));
  if (p->api.model.empty()) p->api.model = options_.served_model_name;
  const ApiRequest& a = p->api;
  if (a.model != options_.served_model_name) return ModelNotFoundError(a.model);
  const char* field = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (endpoint == Endpoint::kChatCompletions) {
    SLUICE_ASSIGN_OR_RETURN(p->prompt, tokenizer_->Encode(chat_->Render(a.messages, true), true));
  } else if (!a.prompt_token_ids.empty()) {
    p->prompt = a.prompt_token_ids;
    if (absl::Status st = tokenizer_->CheckIds(p->prompt); !st.ok()) {
      return InvalidParamError("prompt", std::string(st.message()));
    }
  } else {
    SLUICE_ASSIGN_OR_RETURN(p->prompt, tokenizer_->Encode(a.prompt, false));
  }
  if (p->prompt.empty()) return InvalidParamError(field, "the prompt encodes to no tokens");
  const int64_t prompt = static_cast<int64_t>(p->prompt.size());
  const int64_t max_tokens = a.max_tokens > 0 ? a.max_tokens : context_length_ - prompt;
  if (prompt + std::max<int64_t>(max_tokens, 1) > context_length_) {
    return InvalidParamError(
        field,
        absl::StrFormat("This model's maximum context length is %d tokens. However, you "
                        "requested %d tokens (%d in the %s, %d in the completion).",
                        context_length_, prompt + max_tokens, prompt, field, max_tokens),
        "context_length_exceeded");
  }
  if (!a.kv_compression.empty()) {
    if (absl::Status st = kvstore::FindKvPreset(a.kv_compression, head_dim_).status(); !st.ok()) {
      return InvalidParamError("kv_compression", std::string(st.message()));
    }
  }
  rpc::SamplingParams& s = p->sampling;
  s.set_temperature(a.temperature);
  s.set_top_k(a.top_k);
  s.set_top_p(a.top_p);
  s.set_min_p(a.min_p);
  s.set_repetition_penalty(a.repetition_penalty);
  s.set_seed(a.seed ? *a.seed : std::random_device{}() * uint64_t{0x9E3779B97F4A7C15});
  s.set_max_tokens(static_cast<int32_t>(max_tokens));
  if (!a.ignore_eos) s.mutable_stop_token_ids()->Add(stop_tokens_.begin(), stop_tokens_.end());
  s.mutable_stop_token_ids()->Add(a.stop_token_ids.begin(), a.stop_token_ids.end());
  s.set_logprobs(a.logprobs);
  s.set_top_logprobs(a.top_logprobs);
  p->stops.stop_strings = a.stop;
  p->stops.max_tokens = 1 << 30;
  return p;
}

namespace {

FinishReason ParseFinish(const std::string& s) {
  if (s == "stop") return FinishReason::kStop;
  if (s == "length") return FinishReason::kLength;
  return FinishReason::kAbort;
}

// UTF-8 characters in s (lead bytes).
int Characters(const std::string& s) {
  int n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace

void Router::HandleGenerate(Endpoint endpoint, http::Request req, Reply reply) {
  if (!Authorized(req, reply)) return;
  if (req.body.size() > options_.max_body_bytes) {
    const ApiError e = RequestTooLargeError(req.body.size(), options_.max_body_bytes);
    reply->Send(e.http_status, "application/json", ErrorBody(e));
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", "error"}}).Increment();
    return;
  }
  running_->Increment();
  starts_->Post([this, endpoint, body = std::move(req.body), reply]() mutable {
    StartRequest(endpoint, std::move(body), std::move(reply));
  });
}

void Router::StartRequest(Endpoint endpoint, std::string body, Reply reply) {
  auto fail = [&](const absl::Status& st) {
    running_->Decrement();
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", "error"}}).Increment();
    SendError(reply, st);
  };
  if (reply->gone()) {  // it went away while it waited for a start thread
    running_->Decrement();
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", "abort"}}).Increment();
    reply->End();
    return;
  }
  absl::StatusOr<std::shared_ptr<Prepared>> prepared = Prepare(endpoint, body);
  if (!prepared.ok()) return fail(prepared.status());
  const std::shared_ptr<Prepared> p = *std::move(prepared);
  const int n = p->api.n;
  const FlowRequest request{.request_id = std::random_device{}() * uint64_t{0x100000001B3} ^
                                          absl::ToUnixNanos(p->arrived),
                            .prompt = p->prompt,
                            .sampling = p->sampling,
                            .preset = p->api.kv_compression,
                            .arrived = p->arrived,
                            .choices = n};
  // A session per choice; choice i goes on as a request of its own sampling (seed + i), so
  // that a migration moves it alone.
  std::shared_ptr<Choices> group;
  if (n > 1) {
    group = std::make_shared<Choices>();
    group->left = n;
    group->done.resize(static_cast<size_t>(n));
  }
  std::vector<std::shared_ptr<Session>> sessions;
  for (int i = 0; i < n; ++i) {
    auto s = std::make_shared<Session>();
    s->endpoint = endpoint;
    s->p = p;
    s->reply = reply;
    s->index = i;
    s->choices = group;
    s->request = request;
    s->request.choices = 1;
    s->request.sampling = ChoiceSampling(p->sampling, i);
    sessions.push_back(std::move(s));
  }
  auto unlist = [&] {
    std::lock_guard<std::mutex> lock(live_mu_);
    for (const std::shared_ptr<Session>& s : sessions) live_.erase(s.get());
    live_cv_.notify_all();
  };
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    if (closing_) return fail(absl::UnavailableError("the router is stopping"));
    for (const std::shared_ptr<Session>& s : sessions) live_.emplace(s.get(), s);
  }
  // The client going away cancels whichever run each choice is in.
  std::vector<std::weak_ptr<Session>> weak(sessions.begin(), sessions.end());
  reply->OnGone([weak] {
    for (const std::weak_ptr<Session>& w : weak) {
      if (std::shared_ptr<Session> s = w.lock()) {
        s->gone = true;
        s->Cancel();
      }
    }
  });
  absl::StatusOr<std::vector<std::unique_ptr<RunningRequest>>> runs = flow_->StartChoices(request);
  if (!runs.ok()) {
    unlist();
    return fail(runs.status());
  }
  // One prefill for every choice: counted once.
  const rpc::PrefillResponse& prefilled = (*runs)[0]->prefilled;
  p->cached_tokens = static_cast<int>(prefilled.cached_tokens());
  transfer_bytes_->Increment(static_cast<double>(prefilled.transfer_bytes()));
  transfer_seconds_->Increment(prefilled.transfer_seconds());
  kv_bytes_->Increment(static_cast<double>(prefilled.kv_bytes()));
  kv_fp16_bytes_->Increment(static_cast<double>(prefilled.kv_fp16_bytes()));
  ttft_->Observe(absl::ToDoubleSeconds((*runs)[0]->first_token_time - p->arrived));
  prompt_tokens_->Increment(static_cast<double>(p->prompt.size()));
  const StreamInfo info{.id = NewRequestId(endpoint),
                        .created = absl::ToUnixSeconds(p->arrived),
                        .model = options_.served_model_name,
                        .include_usage = p->api.include_usage_in_stream};
  if (p->api.stream) {
    reply->Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  }
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[static_cast<size_t>(i)];
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.run = std::move((*runs)[static_cast<size_t>(i)]);
    }
    s.text = std::make_unique<TextAssembler>(*tokenizer_, p->stops, p->sampling);
    s.info = info;
    if (p->api.stream && endpoint == Endpoint::kChatCompletions) {
      reply->Write(ChunkEvent(endpoint, info, {.first = true, .index = i}));
    }
  }
  for (const std::shared_ptr<Session>& s : sessions) {
    if (s->gone) s->Cancel();  // it went away during the prefill
    Run(s);
  }
}

bool Router::Emit(Session& s, bool ended) {
  if (!s.p->api.stream) return !s.gone && !s.reply->gone();
  Chunk c{.text = s.text->Ready(ended), .text_offset = s.text_offset, .index = s.index};
  if (s.p->sampling.logprobs()) c.logprobs = s.text->TakeLogprobs();
  s.text_offset += Characters(c.text);
  if (ended) {
    c.finish_reason = s.text->finish();
    c.stop_reason = s.text->stop_reason();
  }
  if (ended || !c.text.empty() || (c.logprobs && !c.logprobs->empty())) {
    s.reply->Write(ChunkEvent(s.endpoint, s.info, c));
  }
  return !s.gone && !s.reply->gone();
}

void Router::Run(const std::shared_ptr<Session>& s) {
  RunningRequest& run = *s->run;
  s->last = run.first_token_time;
  if (run.replayed == 0) {  // a replay's first token was the request's first, sent long ago
    if (s->noticed != absl::InfinitePast()) {  // a migration by prefill: its first new token
      migration_recover_->Observe(absl::ToDoubleSeconds(run.first_token_time - s->noticed));
      s->noticed = absl::InfinitePast();
    }
    generation_tokens_->Increment();
    s->generated.push_back(run.prefilled.first().token());
    s->stop = s->text->Add(run.prefilled.first());
  }
  // The timer cancels a stream that sends nothing for its bound: its read then fails. A replay
  // sends nothing while its decode steps feed the old tokens: the bound allows two inter-token
  // times (or 50 ms) a token more.
  s->stalled = false;
  const absl::Duration replay = run.replayed * 2 * std::max(s->itl, absl::Milliseconds(50));
  s->watch = flow_->timers().Add(std::max(options_.stall_timeout, 50 * s->itl) + replay,
                                 /*repeat=*/false, [s] {
                                   s->stalled = true;
                                   s->Cancel();
                                 });
  if (!Emit(*s, false)) {
    s->gone = true;
    EndRun(s, FinishReason::kAbort);
  } else if (s->stop) {
    EndRun(s, FinishReason::kStop);
  } else {
    ReadNext(s);
  }
}

void Router::ReadNext(const std::shared_ptr<Session>& s) {
  s->run->stream->ReadAsync(&s->message, [this, s](bool ok) { OnMessage(s, ok); });
}

void Router::OnMessage(const std::shared_ptr<Session>& s, bool ok) {
  if (!ok) {  // the stream broke off: failed, stalled, or cancelled for a client gone
    EndRun(s, s->gone ? FinishReason::kAbort : FinishReason::kNone);
    return;
  }
  const rpc::GenerateResponse& msg = s->message;
  const absl::Time now = absl::Now();
  const int n = msg.tokens_size();
  for (int i = 0; i < n && !s->stop; ++i) {
    itl_->Observe(absl::ToDoubleSeconds(now - s->last) / n);
    generation_tokens_->Increment();
    s->generated.push_back(msg.tokens(i).token());
    s->stop = s->text->Add(msg.tokens(i));
  }
  if (n > 0 && s->noticed != absl::InfinitePast()) {
    migration_recover_->Observe(absl::ToDoubleSeconds(now - s->noticed));
    s->noticed = absl::InfinitePast();
  }
  if (n > 0) {
    const absl::Duration per = (now - s->last) / n;
    s->itl = s->itl == absl::ZeroDuration() ? per : (s->itl * 7 + per) / 8;
    s->last = now;
    flow_->timers().Reset(s->watch, std::max(options_.stall_timeout, 50 * s->itl));
  }
  const FinishReason finish =
      msg.finish_reason().empty() ? FinishReason::kNone : ParseFinish(msg.finish_reason());
  if (s->stop || finish != FinishReason::kNone) {
    EndRun(s, s->stop ? FinishReason::kStop : finish);
  } else if (!Emit(*s, false)) {
    s->gone = true;
    EndRun(s, FinishReason::kAbort);
  } else {
    ReadNext(s);
  }
}

void Router::EndRun(const std::shared_ptr<Session>& s, FinishReason finish) {
  flow_->timers().Remove(s->watch);
  // A generation that ends early (a stop string, the client gone, a failure) is cancelled,
  // which frees its pages on the decode worker at once.
  if (s->stop || s->gone || finish == FinishReason::kNone) s->run->stream->Cancel();
  s->run->stream->FinishAsync([this, s, finish](absl::Status st) {
    if (s->gone) {
      s->text->End(FinishReason::kAbort);
      return Complete(s, absl::CancelledError("the client went away"));
    }
    if (finish != FinishReason::kNone) {
      s->text->End(finish);
      return Complete(s, absl::OkStatus());
    }
    // The decode worker failed or stalled mid-stream: the generation goes on elsewhere, from a
    // start thread (the calls wait).
    s->noticed = absl::Now();
    migration_detect_->Observe(absl::ToDoubleSeconds(s->noticed - s->last));
    const std::string address = s->run->decode->address;
    const std::string what =
        s->stalled
            ? absl::StrFormat("the decode worker %s sent nothing for %s", address,
                              absl::FormatDuration(std::max(options_.stall_timeout, 50 * s->itl)))
            : absl::StrFormat("the decode worker %s failed mid-generation: %s", address,
                              st.message());
    starts_->Post([this, s, what] { Migrate(s, absl::UnavailableError(what)); });
  });
}

void Router::Migrate(const std::shared_ptr<Session>& s, absl::Status failure) {
  const std::string what(failure.message());
  if (s->migrations >= options_.max_migrations) {
    s->text->End(FinishReason::kAbort);
    return Complete(s, absl::UnavailableError(absl::StrFormat(
                           "%s (after %d migrations, the most allowed)", what, s->migrations)));
  }
  if (s->gone) {
    s->text->End(FinishReason::kAbort);
    return Complete(s, absl::CancelledError("the client went away"));
  }
  absl::StatusOr<std::unique_ptr<RunningRequest>> next =
      flow_->Continue(s->request, s->generated, s->run->decode, what);
  if (absl::IsOutOfRange(next.status())) {  // it had generated every token it may
    s->text->End(FinishReason::kLength);
    return Complete(s, absl::OkStatus());
  }
  if (!next.ok()) {
    s->text->End(FinishReason::kAbort);
    return Complete(s, absl::UnavailableError(
                           absl::StrFormat("%s; moving the generation to another worker failed: %s",
                                           what, next.status().message())));
  }
  ++s->migrations;
  migrations_->Add({{"reason", s->stalled ? "stalled" : "failed"}}).Increment();
  std::fprintf(stderr,
               "router: %s; the generation continues on %s after %zu tokens (migration %d)\n",
               what.c_str(), (*next)->decode->address.c_str(), s->generated.size(), s->migrations);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->run = *std::move(next);
  }
  if (s->gone) s->Cancel();
  Run(s);
}

void Router::Complete(const std::shared_ptr<Session>& s, absl::Status st) {
  if (s->choices != nullptr) return CompleteChoice(s, std::move(st));
  const bool gone = absl::IsCancelled(st) || s->reply->gone();
  const Prepared& p = *s->p;
  if (!gone && p.api.stream) Emit(*s, true);
  std::vector<CompletionChoice> choices;
  if (!gone && !p.api.stream && st.ok()) {
    choices.push_back({.text = s->text->Ready(true),
                       .finish_reason = s->text->finish(),
                       .stop_reason = s->text->stop_reason()});
    if (p.sampling.logprobs()) choices[0].logprobs = s->text->TakeLogprobs();
  }
  EndResponse(s, gone, st, s->text->tokens(), std::move(choices),
              gone ? "abort" : std::string(FinishReasonName(s->text->finish())));
}

void Router::CompleteChoice(const std::shared_ptr<Session>& s, absl::Status st) {
  Choices& g = *s->choices;
  const Prepared& p = *s->p;
  const bool gone = absl::IsCancelled(st) || s->reply->gone();
  if (!gone && p.api.stream) Emit(*s, true);  // the choice's last chunk, its finish reason
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    CompletionChoice& c = g.done[static_cast<size_t>(s->index)];
    if (!p.api.stream) {
      c.text = s->text->Ready(true);
      if (p.sampling.logprobs()) c.logprobs = s->text->TakeLogprobs();
    }
    c.finish_reason = s->text->finish();
    c.stop_reason = s->text->stop_reason();
    g.completion_tokens += s->text->tokens();
    if (!st.ok() && !gone && g.error.ok()) g.error = st;
    g.gone = g.gone || gone;
    last = --g.left == 0;
  }
  if (!last) return Release(s);
  // The last choice to end: the response's end is its to send (the others no longer touch g).
  const std::string reason =
      g.gone || !g.error.ok() ? "abort" : std::string(FinishReasonName(g.done[0].finish_reason));
  EndResponse(s, g.gone, g.error, g.completion_tokens, g.done, reason);
}

void Router::EndResponse(const std::shared_ptr<Session>& s, bool gone, const absl::Status& error,
                         int completion_tokens, std::vector<CompletionChoice> choices,
                         const std::string& reason) {
  const Prepared& p = *s->p;
  const Usage usage{.prompt_tokens = static_cast<int>(p.prompt.size()),
                    .completion_tokens = completion_tokens,
                    .cached_tokens = p.cached_tokens};
  if (gone) {
    s->reply->End();
  } else if (p.api.stream) {
    if (!error.ok()) s->reply->Write(ErrorEvent(FromStatus(error)));
    if (s->info.include_usage) s->reply->Write(UsageEvent(s->endpoint, s->info, usage));
    s->reply->Write(DoneEvent());
    s->reply->End();
  } else if (!error.ok()) {
    SendError(s->reply, error);
  } else {
    const Completion c{.id = NewRequestId(s->endpoint),
                       .created = absl::ToUnixSeconds(p.arrived),
                       .model = options_.served_model_name,
                       .choices = std::move(choices),
                       .usage = usage};
    s->reply->Send(200, "application/json", CompletionBody(s->endpoint, c));
  }
  running_->Decrement();
  e2e_->Observe(absl::ToDoubleSeconds(absl::Now() - p.arrived));
  requests_->Add({{"endpoint", EndpointName(s->endpoint)}, {"finish_reason", reason}}).Increment();
  Release(s);
}

void Router::Release(const std::shared_ptr<Session>& s) {
  // On its own stream's callback or a start thread: its stream has finished, so nothing waits.
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->run.reset();
  }
  std::lock_guard<std::mutex> lock(live_mu_);
  live_.erase(s.get());
  live_cv_.notify_all();
}

void Router::HandleModels(const http::Request& req, const Reply& reply) {
  if (!Authorized(req, reply)) return;
  reply->Send(200, "application/json", ModelsBody({options_.served_model_name}, created_));
}

void Router::HandleHealth(const Reply& reply) {
  const int prefill = registry_->Healthy("prefill"), decode = registry_->Healthy("decode");
  nlohmann::json j = {{"status", prefill > 0 && decode > 0 ? "ok" : "unavailable"},
                      {"prefill_workers_up", prefill},
                      {"decode_workers_up", decode}};
  reply->Send(prefill > 0 && decode > 0 ? 200 : 503, "application/json", j.dump());
}

void Router::HandleMetrics(const Reply& reply) {
  workers_up_->Add({{"role", "prefill"}}).Set(registry_->Healthy("prefill"));
  workers_up_->Add({{"role", "decode"}}).Set(registry_->Healthy("decode"));
  reply->Send(200, "text/plain; version=0.0.4; charset=utf-8",
              prometheus::TextSerializer().Serialize(metrics_->Collect()));
}

void Router::HandleWorkers(const http::Request& req, const Reply& reply) {
  if (!Authorized(req, reply)) return;
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerRegistry::View& v : registry_->Snapshot()) {
    workers.push_back(
        {{"name", v.stats.name().empty() ? v.address : v.stats.name()},
         {"address", v.address},
         {"role", v.role},
         {"backend", v.stats.backend()},
         {"state", v.up ? v.stats.state() : std::string("down")},
         {"ready", v.up && v.ready},
         {"running", v.stats.running()},
         {"waiting", v.stats.waiting()},
         {"kv_pages_used", v.stats.kv_pages_used()},
         {"kv_pages_free", v.stats.kv_pages_free()},
         {"kv_pages_reserved", v.stats.kv_pages_reserved()},
         {"queued_prompt_tokens", v.stats.queued_prompt_tokens()},
         {"kv_compression_ratio", v.stats.kv_compression_ratio()},
         // Prefill: prompt prefixes cached, one block each past its parent.
         {"prefix_cache_entries", v.stats.prefix_cache_entries()},
         {"prefix_cache_tokens", v.stats.prefix_cache_entries() * v.stats.prefix_block_tokens()},
         {"prefix_cache_pages", v.stats.prefix_cache_pages()},
         {"error", v.last_error}});
  }
  reply->Send(200, "application/json",
              nlohmann::json{{"model", options_.served_model_name}, {"workers", workers}}.dump());
}

void Router::HandleResetPrefixCache(const http::Request& req, Reply reply) {
  if (!Authorized(req, reply)) return;
  // The workers' answers are waited for on a start thread, not the HTTP loop.
  starts_->Post([this, reply = std::move(reply)] {
    nlohmann::json workers = nlohmann::json::array();
    bool all = true;
    for (const WorkerRegistry::Reset& r : registry_->ResetPrefixCaches(absl::Seconds(10))) {
      nlohmann::json w = {{"name", r.name},
                          {"address", r.address},
                          {"role", r.role},
                          {"entries_dropped", r.entries_dropped}};
      if (!r.error.empty()) w["error"] = r.error;
      all = all && r.error.empty();
      workers.push_back(std::move(w));
    }
    reply->Send(all ? 200 : 503, "application/json", nlohmann::json{{"workers", workers}}.dump());
  });
}

}  // namespace sluice::router
