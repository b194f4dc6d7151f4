#include "router/worker_registry.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/worker_health.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kvstore/cache/prefix_index.h"
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
    : placement_(placement), poll_(poll), auth_(auth) {
  channel_args_.SetMaxReceiveMessageSize(256 << 20);
  channel_args_.SetMaxSendMessageSize(256 << 20);
  // A worker that was not listening yet (or restarted) is connected again within a second:
  // while a channel backs off, every call on it fails at once.
  channel_args_.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args_.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  channel_args_.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const auto& [role, list] : {std::pair{"prefill", &prefill}, std::pair{"decode", &decode}}) {
    for (const std::string& source : *list) sources_.emplace_back(role, source);
  }
  PollOnce();
  poller_ = std::thread([this] { PollLoop(); });
}

absl::StatusOr<std::vector<std::string>> WorkerRegistry::Resolve(const std::string& source) {
  if (absl::StartsWith(source, "file:")) {
    const std::string path = source.substr(5);
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrFormat("cannot read worker list %s", path));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      line = std::string(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
      if (line.empty() || absl::StartsWith(line, "file:")) continue;
      SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> named, Resolve(line));
      out.insert(out.end(), named.begin(), named.end());
    }
    return out;
  }
  if (!absl::StartsWith(source, "dns:")) return std::vector<std::string>{source};
  const std::string rest = source.substr(4);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker source %s: expected dns:NAME:PORT", source));
  }
  const std::string name = rest.substr(0, colon), port = rest.substr(colon + 1);
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(name.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrFormat("worker source %s: cannot resolve %s: %s", source, name, gai_strerror(e)));
  }
  std::set<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char host[INET6_ADDRSTRLEN] = {};
    const void* addr = a->ai_family == AF_INET6
                           ? static_cast<const void*>(
                                 &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)
                           : &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr;
    if (inet_ntop(a->ai_family, addr, host, sizeof(host)) == nullptr) continue;
    out.insert(a->ai_family == AF_INET6 ? absl::StrFormat("[%s]:%s", host, port)
                                        : absl::StrFormat("%s:%s", host, port));
  }
  freeaddrinfo(found);
  return std::vector<std::string>(out.begin(), out.end());
}

void WorkerRegistry::Discover() {
  std::set<std::pair<std::string, std::string>> wanted;  // (role, address)
  for (const auto& key : sources_) {
    absl::StatusOr<std::vector<std::string>> named = Resolve(key.second);
    if (named.ok()) named_[key] = *std::move(named);  // else keep what it named last
    for (const std::string& address : named_[key]) wanted.emplace(key.first, address);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : workers_) {
    w->removed = !wanted.erase({w->role, w->address});
    if (w->removed) w->up = false;
  }
  for (const auto& [role, address] : wanted) {  // the ones no worker has yet
    auto w = std::make_unique<Worker>();
    w->address = address;
    w->role = role;
    w->channel = auth_.Channel(address, channel_args_);
    w->admin = rpc::Admin::NewStub(w->channel);
    w->health = grpc::health::v1::Health::NewStub(w->channel);
    if (role == "prefill") {
      w->prefill = GrpcPrefillCalls(w->channel);
    } else {
      w->decode = GrpcDecodeCalls(w->channel);
    }
    workers_.push_back(std::move(w));
  }
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
  Discover();
  std::vector<Worker*> polled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
      if (!w->removed) polled.push_back(w.get());
    }
  }
  for (Worker* w : polled) {
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
      w->prefixes.clear();
      w->prefixes.insert(stats.prefix_blocks().begin(), stats.prefix_blocks().end());
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

bool WorkerRegistry::Up(Worker* w) {
  std::lock_guard<std::mutex> lock(mu_);
  return w->up;
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
      if (w->role == role && !w->removed && !exclude.contains(w.get())) live.push_back(w.get());
    }
  }
  if (live.empty()) return nullptr;
  const bool prefill = role == "prefill";
  if (placement_ == Placement::kRoundRobin) {
    return live[round_robin_[prefill ? 0 : 1]++ % live.size()];
  }
  if (placement_ == Placement::kPrefixAffinity) {
    return prefill ? PickByPrefix(live, prompt) : PickByHeldPrefix(live, prompt);
  }
  if (prefill) {
    return *std::min_element(live.begin(), live.end(), [](Worker* a, Worker* b) {
      const int64_t la = a->stats.queued_prompt_tokens() + a->in_flight * 512;
      const int64_t lb = b->stats.queued_prompt_tokens() + b->in_flight * 512;
      return la < lb;
    });
  }
  return MostFreePages(live);
}

namespace {

// A prompt's prefixes' names (kvstore::PrefixBlockHashes), made once per block size the
// workers cut in (one, usually).
class PrefixNames {
 public:
  explicit PrefixNames(absl::Span<const int32_t> prompt) : prompt_(prompt) {}
  const std::vector<uint64_t>& operator()(int64_t block) {
    auto it = by_block_.find(block);
    if (it == by_block_.end()) {
      const int64_t n = static_cast<int64_t>(prompt_.size());
      it = by_block_.emplace(block, kvstore::PrefixBlockHashes(prompt_, block, n)).first;
    }
    return it->second;
  }

 private:
  absl::Span<const int32_t> prompt_;
  std::map<int64_t, std::vector<uint64_t>> by_block_;
};

// The length of the longest prefix of the prompt `names` names among `w`'s published ones, at
// most `limit` tokens.
int64_t LongestPublished(const Worker& w, int64_t limit, PrefixNames& names) {
  const int64_t block = w.stats.prefix_block_tokens();
  if (block <= 0) return 0;
  const std::vector<uint64_t>& mine = names(block);
  for (size_t k = std::min(static_cast<size_t>(limit / block), mine.size()); k > 0; --k) {
    if (w.prefixes.contains(mine[k - 1])) return static_cast<int64_t>(k) * block;
  }
  return 0;
}

}  // namespace

Worker* MostFreePages(absl::Span<Worker* const> live) {
  return *std::min_element(live.begin(), live.end(), [](Worker* a, Worker* b) {
    if (a->stats.kv_pages_free() != b->stats.kv_pages_free()) {
      return a->stats.kv_pages_free() > b->stats.kv_pages_free();
    }
    return a->stats.running() + a->in_flight < b->stats.running() + b->in_flight;
  });
}

Worker* PickByHeldPrefix(absl::Span<Worker* const> live, absl::Span<const int32_t> prompt) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  PrefixNames names_for(prompt);
  int64_t least_busy = std::numeric_limits<int64_t>::max(), most_free = 0;
  for (const Worker* w : live) {
    least_busy = std::min(least_busy, w->stats.running() + w->in_flight);
    most_free = std::max(most_free, w->stats.kv_pages_free());
  }
  Worker* pick = nullptr;
  int64_t held = 0;
  for (Worker* w : live) {
    if (w->stats.running() + w->in_flight > least_busy + 8 ||
        2 * w->stats.kv_pages_free() < most_free) {
      continue;
    }
    const int64_t mine = LongestPublished(*w, n, names_for);
    if (mine > held) {
      pick = w;
      held = mine;
    }
  }
  return pick != nullptr ? pick : MostFreePages(live);
}

Worker* PickByPrefix(absl::Span<Worker* const> live, absl::Span<const int32_t> prompt) {
  // The prompt tokens a worker would compute before this prompt's first token: those queued
  // there, a chunk for each call in flight, and this prompt's past its longest prefix cached
  // there (the last token is always computed).
  const int64_t n = static_cast<int64_t>(prompt.size());
  PrefixNames names_for(prompt);
  std::vector<int64_t> cost(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const Worker& w = *live[i];
    // Prefixes below the last token only.
    const int64_t cached = LongestPublished(w, n - 1, names_for);
    cost[i] = w.stats.queued_prompt_tokens() + w.in_flight * 512 + (n - cached);
  }
  const int64_t least = *std::min_element(cost.begin(), cost.end());
  std::vector<Worker*> best;
  for (size_t i = 0; i < live.size(); ++i) {
    if (cost[i] == least) best.push_back(live[i]);
  }
  // Ties (a prefix cached nowhere, the same load): the first 64 tokens pick, so the same new
  // prefix goes to the same worker.
  const int64_t head = std::min<int64_t>(n, 64);
  const std::vector<uint64_t> first = kvstore::PrefixBlockHashes(prompt, head, head);
  Worker* pick = best[first.empty() ? 0 : first.front() % best.size()];
  // Until its next poll says so, the prompt's prefixes count as cached there.
  for (uint64_t name : names_for(pick->stats.prefix_block_tokens())) pick->prefixes.insert(name);
  return pick;
}

std::vector<WorkerRegistry::View> WorkerRegistry::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<View> out;
  for (const auto& w : workers_) {
    if (w->removed) continue;
    out.push_back({.address = w->address,
                   .role = w->role,
                   .up = w->up,
                   .ready = w->ready,
                   .stats = w->stats,
                   .last_error = w->last_error});
  }
  return out;
}

std::vector<WorkerRegistry::Reset> WorkerRegistry::ResetPrefixCaches(absl::Duration deadline) {
  std::vector<Worker*> named;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
      if (!w->removed) named.push_back(w.get());
    }
  }
  std::vector<Reset> out;
  for (Worker* w : named) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
    rpc::ResetPrefixCacheResponse reply;
    const grpc::Status st =
        w->admin->ResetPrefixCache(&ctx, rpc::ResetPrefixCacheRequest(), &reply);
    std::lock_guard<std::mutex> lock(mu_);
    Reset r{.name = w->stats.name().empty() ? w->address : w->stats.name(),
            .address = w->address,
            .role = w->role};
    if (st.ok()) {
      r.entries_dropped = reply.entries_dropped();
      w->prefixes.clear();
    } else {
      r.error = st.error_message().empty() ? "gRPC status " + std::to_string(st.error_code())
                                           : st.error_message();
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace sluice::router
