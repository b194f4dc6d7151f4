#include "router/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/process.h"
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
};

struct Router::Session {
  std::shared_ptr<Prepared> p;
  FlowRequest request;
  std::unique_ptr<RunningRequest> run;
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
  return r;
}

void Router::Install(httplib::Server& server) {
  server.set_payload_max_length(options_.max_body_bytes * 2);
  server.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) {
    HandleGenerate(Endpoint::kCompletions, q, s);
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) {
    HandleGenerate(Endpoint::kChatCompletions, q, s);
  });
  server.Get("/v1/models",
             [this](const httplib::Request& q, httplib::Response& s) { HandleModels(q, s); });
  server.Get("/health",
             [this](const httplib::Request& q, httplib::Response& s) { HandleHealth(q, s); });
  server.Get("/metrics",
             [this](const httplib::Request& q, httplib::Response& s) { HandleMetrics(q, s); });
  server.Get("/v1/workers",
             [this](const httplib::Request& q, httplib::Response& s) { HandleWorkers(q, s); });
}

void Router::InstallProbes(httplib::Server& server) {
  server.Get("/health",
             [this](const httplib::Request& q, httplib::Response& s) { HandleHealth(q, s); });
  server.Get("/metrics",
             [this](const httplib::Request& q, httplib::Response& s) { HandleMetrics(q, s); });
}

void Router::SendError(httplib::Response& res, const absl::Status& status) {
  const ApiError e = FromStatus(status);
  res.status = e.http_status;
  res.set_content(ErrorBody(e), "application/json");
}

bool Router::Authorized(const httplib::Request& req, httplib::Response& res) {
  if (options_.api_key.empty()) return true;
  if (ConstantTimeEquals(req.get_header_value("Authorization"), "Bearer " + options_.api_key)) {
    return true;
  }
  res.status = 401;
  res.set_content(ErrorBody({.http_status = 401,
                             .type = "invalid_request_error",
                             .message = "Incorrect or missing API key (Authorization: Bearer).",
                             .code = "invalid_api_key"}),
                  "application/json");
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

absl::StatusOr<std::shared_ptr<Router::Session>> Router::Start(const std::shared_ptr<Prepared>& p) {
  FlowRequest request{.request_id = std::random_device{}() * uint64_t{0x100000001B3} ^
                                    absl::ToUnixNanos(p->arrived),
                      .prompt = p->prompt,
                      .sampling = p->sampling,
                      .preset = p->api.kv_compression,
                      .arrived = p->arrived};
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RunningRequest> run, flow_->Start(request));
  const rpc::PrefillResponse& prefilled = run->prefilled;
  transfer_bytes_->Increment(static_cast<double>(prefilled.transfer_bytes()));
  transfer_seconds_->Increment(prefilled.transfer_seconds());
  kv_bytes_->Increment(static_cast<double>(prefilled.kv_bytes()));
  kv_fp16_bytes_->Increment(static_cast<double>(prefilled.kv_fp16_bytes()));
  auto session = std::make_shared<Session>();
  session->p = p;
  session->request = std::move(request);
  session->run = std::move(run);
  return session;
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

void Router::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                            httplib::Response& res) {
  if (!Authorized(req, res)) return;
  if (req.body.size() > options_.max_body_bytes) {
    const ApiError e = RequestTooLargeError(req.body.size(), options_.max_body_bytes);
    res.status = e.http_status;
    res.set_content(ErrorBody(e), "application/json");
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", "error"}}).Increment();
    return;
  }
  running_->Increment();
  auto prepared = Prepare(endpoint, req.body);
  absl::StatusOr<std::shared_ptr<Session>> session =
      prepared.ok() ? Start(*prepared) : prepared.status();
  if (!session.ok()) {
    running_->Decrement();
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", "error"}}).Increment();
    SendError(res, session.status());
    return;
  }
  std::shared_ptr<Session> s = *session;
  const std::shared_ptr<Prepared>& p = s->p;
  ttft_->Observe(absl::ToDoubleSeconds(s->run->first_token_time - p->arrived));
  prompt_tokens_->Increment(static_cast<double>(p->prompt.size()));

  auto a = std::make_shared<TextAssembler>(*tokenizer_, p->stops, p->sampling);
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const bool logprobs = p->sampling.logprobs();
  // Records how the request ended, once.
  auto done = [this, s, a, endpoint](bool client_gone) {
    running_->Decrement();
    e2e_->Observe(absl::ToDoubleSeconds(absl::Now() - s->p->arrived));
    const std::string reason = client_gone ? "abort" : std::string(FinishReasonName(a->finish()));
    requests_->Add({{"endpoint", EndpointName(endpoint)}, {"finish_reason", reason}}).Increment();
  };

  if (!p->api.stream) {
    const absl::Status st = Drive(*s, *a, [] { return true; });
    done(false);
    if (!st.ok()) {
      SendError(res, st);
      return;
    }
    Completion c{.id = NewRequestId(endpoint),
                 .created = absl::ToUnixSeconds(p->arrived),
                 .model = options_.served_model_name,
                 .text = a->Ready(true),
                 .finish_reason = a->finish(),
                 .stop_reason = a->stop_reason(),
                 .usage = {.prompt_tokens = static_cast<int>(p->prompt.size()),
                           .completion_tokens = a->tokens()}};
    if (logprobs) c.logprobs = a->TakeLogprobs();
    res.set_content(CompletionBody(endpoint, c), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, s, a, endpoint, chat, logprobs,
                                                         done](size_t, httplib::DataSink& sink) {
    const StreamInfo info{.id = NewRequestId(endpoint),
                          .created = absl::ToUnixSeconds(s->p->arrived),
                          .model = options_.served_model_name,
                          .include_usage = s->p->api.include_usage_in_stream};
    auto write = [&](const std::string& event) {
      return sink.is_writable() && sink.write(event.data(), event.size());
    };
    int text_offset = 0;
    auto chunk = [&](bool ended) {
      Chunk c{.text = a->Ready(ended), .text_offset = text_offset};
      if (logprobs) c.logprobs = a->TakeLogprobs();
      text_offset += Characters(c.text);
      if (ended) {
        c.finish_reason = a->finish();
        c.stop_reason = a->stop_reason();
      } else if (c.text.empty() && (!c.logprobs || c.logprobs->empty())) {
        return sink.is_writable();
      }
      return write(ChunkEvent(endpoint, info, c));
    };
    bool gone = chat && !write(ChunkEvent(endpoint, info, {.first = true}));
    absl::Status st = absl::OkStatus();
    if (!gone) {
      st = Drive(*s, *a, [&] { return chunk(false); });
      gone = absl::IsCancelled(st);
    }
    if (!gone) gone = !chunk(true);
    if (!gone && !st.ok()) gone = !write(ErrorEvent(FromStatus(st)));
    if (!gone && info.include_usage) {
      gone = !write(UsageEvent(endpoint, info,
                               {.prompt_tokens = static_cast<int>(s->p->prompt.size()),
                                .completion_tokens = a->tokens()}));
    }
    if (!gone) gone = !write(DoneEvent());
    done(gone);
    if (gone) return false;
    sink.done();
    return true;
  });
}

absl::Status Router::Drive(Session& s, TextAssembler& a, const std::function<bool()>& progress) {
  // Every token the request generated, for a migration to carry over.
  std::vector<int32_t> generated;
  int migrations = 0;
  absl::Duration itl = absl::ZeroDuration();  // the stream's smoothed inter-token time
  auto stall_bound = [&] { return std::max(options_.stall_timeout, 50 * itl); };
  for (;;) {
    RunningRequest& run = *s.run;
    absl::Time last = run.first_token_time;
    generation_tokens_->Increment();
    generated.push_back(run.prefilled.first().token());
    bool stop = a.Add(run.prefilled.first());
    FinishReason finish = FinishReason::kNone;
    bool gone = false;
    // The timer cancels a stream that sends nothing for its bound: Read then returns false.
    std::atomic<bool> stalled{false};
    GenerationStream* stream = run.stream.get();
    const uint64_t watch = flow_->timers().Add(stall_bound(), /*repeat=*/false, [&stalled, stream] {
      stalled = true;
      stream->Cancel();
    });
    if (!progress()) {
      gone = true;
    } else if (!stop) {
      rpc::GenerateResponse msg;
      while (run.stream->Read(&msg)) {
        const absl::Time now = absl::Now();
        const int n = msg.tokens_size();
        for (int i = 0; i < n && !stop; ++i) {
          itl_->Observe(absl::ToDoubleSeconds(now - last) / n);
          generation_tokens_->Increment();
          generated.push_back(msg.tokens(i).token());
          stop = a.Add(msg.tokens(i));
        }
        if (n > 0) {
          itl = itl == absl::ZeroDuration() ? (now - last) / n : (itl * 7 + (now - last) / n) / 8;
          last = now;
          flow_->timers().Reset(watch, stall_bound());
        }
        if (!msg.finish_reason().empty()) finish = ParseFinish(msg.finish_reason());
        if (stop || finish != FinishReason::kNone) break;
        if (!progress()) {
          gone = true;
          break;
        }
      }
    }
    flow_->timers().Remove(watch);
    if (gone || stop || finish == FinishReason::kNone) run.stream->Cancel();
    const absl::Status st = run.stream->Finish();
    if (gone) {
      a.End(FinishReason::kAbort);
      return absl::CancelledError("the client went away");
    }
    if (stop || finish != FinishReason::kNone) {
      a.End(finish == FinishReason::kNone ? FinishReason::kStop : finish);
      return absl::OkStatus();
    }
    // The decode worker failed or stalled mid-stream: the generation goes on elsewhere.
    const char* why = stalled ? "stalled" : "failed";
    const std::string what =
        stalled ? absl::StrFormat("the decode worker %s sent nothing for %s", run.decode->address,
                                  absl::FormatDuration(stall_bound()))
                : absl::StrFormat("the decode worker %s failed mid-generation: %s",
                                  run.decode->address, st.message());
    if (migrations >= options_.max_migrations) {
      a.End(FinishReason::kAbort);
      return absl::UnavailableError(
          absl::StrFormat("%s (after %d migrations, the most allowed)", what, migrations));
    }
    absl::StatusOr<std::unique_ptr<RunningRequest>> next =
        flow_->Continue(s.request, generated, run.decode, what);
    if (absl::IsOutOfRange(next.status())) {  // it had generated every token it may
      a.End(FinishReason::kLength);
      return absl::OkStatus();
    }
    if (!next.ok()) {
      a.End(FinishReason::kAbort);
      return absl::UnavailableError(absl::StrFormat(
          "%s; moving the generation to another worker failed: %s", what, next.status().message()));
    }
    ++migrations;
    migrations_->Add({{"reason", why}}).Increment();
    std::fprintf(stderr,
                 "router: %s; the generation continues on %s after %zu tokens (migration %d)\n",
                 what.c_str(), (*next)->decode->address.c_str(), generated.size(), migrations);
    s.run = *std::move(next);
  }
}

void Router::HandleModels(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  res.set_content(ModelsBody({options_.served_model_name}, created_), "application/json");
}

void Router::HandleHealth(const httplib::Request&, httplib::Response& res) {
  const int prefill = registry_->Healthy("prefill"), decode = registry_->Healthy("decode");
  nlohmann::json j = {{"status", prefill > 0 && decode > 0 ? "ok" : "unavailable"},
                      {"prefill_workers_up", prefill},
                      {"decode_workers_up", decode}};
  res.status = prefill > 0 && decode > 0 ? 200 : 503;
  res.set_content(j.dump(), "application/json");
}

void Router::HandleMetrics(const httplib::Request&, httplib::Response& res) {
  workers_up_->Add({{"role", "prefill"}}).Set(registry_->Healthy("prefill"));
  workers_up_->Add({{"role", "decode"}}).Set(registry_->Healthy("decode"));
  res.set_content(prometheus::TextSerializer().Serialize(metrics_->Collect()),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void Router::HandleWorkers(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerRegistry::View& v : registry_->Snapshot()) {
    workers.push_back({{"name", v.stats.name().empty() ? v.address : v.stats.name()},
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
                       {"error", v.last_error}});
  }
  res.set_content(
      nlohmann::json{{"model", options_.served_model_name}, {"workers", workers}}.dump(),
      "application/json");
}

}  // namespace sluice::router
