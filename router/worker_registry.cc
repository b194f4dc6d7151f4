#include "router/worker_registry.h"

#include <algorithm>
#include <chrono>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"
#include "common/worker_health.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "router/grpc_worker_calls.h"

namespace sluice::router {

absl::StatusOr<Placement> ParsePlacement(const std::string& name) {
  if (name == "round_robin") return Placement::kRoundRobin;
  if (name == "least_loaded") return Placement::kLeastLoaded;
  if (name == "prefix_affinity") return Placement::kPrefixAffinity;
  return absl::InvalidArgumentError(absl::StrFormat(
      "placement '%s' is not one of round_robin, least_loaded, prefix_affinity", name));
}

WorkerRegistry::WorkerRegistry(const std::vector<std::string>& prefill,
                               const std::vector<std::string>& decode, Placement placement,
                               absl::Duration poll, const GrpcAuth& auth)
    : placement_(placement), poll_(poll) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A worker that was not listening yet (or restarted) is connected again within a second:
  // while a channel backs off, every call on it fails at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const auto& [role, list] : {std::pair{"prefill", &prefill}, std::pair{"decode", &decode}}) {
    for (const std::string& address : *list) {
      auto w = std::make_unique<Worker>();
      w->address = address;
      w->role = role;
      w->channel = auth.Channel(address, args);
      w->admin = rpc::Admin::NewStub(w->channel);
      w->health = grpc::health::v1::Health::NewStub(w->channel);
      if (w->role == "prefill") {
        w->prefill = GrpcPrefillCalls(w->channel);
      } else {
        w->decode = GrpcDecodeCalls(w->channel);
      }
      workers_.push_back(std::move(w));
    }
  }
  PollOnce();
  poller_ = std::thread([this] { PollLoop(); });
}

WorkerRegistry::~WorkerRegistry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  poller_.join();
}

namespace {

// The worker's grpc.health.v1 status for `service` (SERVING or NOT_SERVING), or the call's error.
absl::StatusOr<bool> CheckHealth(Worker& w, const char* service) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(2000));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = w.health->Check(&ctx, req, &resp);
  if (!st.ok()) return absl::UnavailableError(st.error_message());
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace

void WorkerRegistry::PollOnce() {
  for (auto& w : workers_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(2000));
    rpc::StatsResponse stats;
    grpc::Status st = w->admin->Stats(&ctx, rpc::StatsRequest(), &stats);
    // A worker whose gRPC threads answer while its scheduler loop is stuck is not live.
    absl::StatusOr<bool> live = false, ready = false;
    if (st.ok()) live = CheckHealth(*w, kLivenessService);
    if (st.ok() && live.ok()) ready = CheckHealth(*w, kReadinessService);
    if (st.ok() && !live.ok())
      st = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(live.status().message()));
    std::lock_guard<std::mutex> lock(mu_);
    if (st.ok()) {
      w->up = *live && stats.state() == "serving";
      w->ready = ready.ok() && *ready;
      if (!*live)
        w->last_error =
            "its scheduler loop has not turned for " + absl::FormatDuration(kLoopStallBound);
      w->stats = stats;
      w->failed_polls = 0;
      if (*live) w->last_error.clear();
    } else {
      w->last_error = st.error_message();
      if (++w->failed_polls >= 3) w->up = false;
    }
  }
}

void WorkerRegistry::PollLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoMilliseconds(poll_), [&] { return stop_; });
      if (stop_) return;
    }
    PollOnce();
  }
}

void WorkerRegistry::MarkDown(Worker* w, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  w->up = false;
  w->last_error = error;
}

int WorkerRegistry::Healthy(const std::string& role) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& w : workers_) n += w->role == role && w->up ? 1 : 0;
  return n;
}

Worker* WorkerRegistry::Pick(const std::string& role, absl::Span<const int32_t> prompt,
                             const std::set<Worker*>& exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Worker*> live;
  for (const auto& w : workers_) {
    if (w->role == role && w->up && !exclude.contains(w.get())) live.push_back(w.get());
  }
  if (live.empty()) {
    for (const auto& w : workers_) {
      if (w->role == role && !exclude.contains(w.get())) live.push_back(w.get());
    }
  }
  if (live.empty()) return nullptr;
  const bool prefill = role == "prefill";
  if (placement_ == Placement::kRoundRobin) {
    return live[round_robin_[prefill ? 0 : 1]++ % live.size()];
  }
  if (prefill && placement_ == Placement::kPrefixAffinity) {
    // The first 64 tokens stand for the prefix (a chat's system prompt and template).
    const size_t n = std::min<size_t>(prompt.size(), 64);
    const size_t h = absl::HashOf(std::vector<int32_t>(prompt.begin(), prompt.begin() + n));
    return live[h % live.size()];
  }
  if (prefill) {
    return *std::min_element(live.begin(), live.end(), [](Worker* a, Worker* b) {
      const int64_t la = a->stats.queued_prompt_tokens() + a->in_flight * 512;
      const int64_t lb = b->stats.queued_prompt_tokens() + b->in_flight * 512;
      return la < lb;
    });
  }
  return *std::min_element(live.begin(), live.end(), [](Worker* a, Worker* b) {
    if (a->stats.kv_pages_free() != b->stats.kv_pages_free()) {
      return a->stats.kv_pages_free() > b->stats.kv_pages_free();
    }
    return a->stats.running() + a->in_flight < b->stats.running() + b->in_flight;
  });
}

std::vector<WorkerRegistry::View> WorkerRegistry::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<View> out;
  for (const auto& w : workers_) {
    out.push_back({.address = w->address,
                   .role = w->role,
                   .up = w->up,
                   .ready = w->ready,
                   .stats = w->stats,
                   .last_error = w->last_error});
  }
  return out;
}

}  // namespace sluice::router
