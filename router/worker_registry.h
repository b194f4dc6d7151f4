// The router's view of its workers: one gRPC channel each, health from Admin.Stats polled every
// `poll` period, and placement.
//
// Placement policies (--placement):
//   round_robin      prefill and decode workers in turn
//   least_loaded     prefill: fewest queued prompt tokens and requests in flight;
//                    decode: most free KV pages, then fewest running sequences
//   prefix_affinity  prefill: the worker that would compute the fewest prompt tokens before
//                    this prompt's first token: those queued there, plus this prompt's tokens
//                    past the longest prefix cached there (each worker publishes its cached
//                    prefixes' names in its stats; a prompt placed on a worker counts as
//                    cached there until its next poll); ties go by a hash of the first 64
//                    tokens, so the same new prefix goes to the same worker; decode: among
//                    the workers within 8 sequences of the least busy and with at least half
//                    the most free pages, the one holding the longest prefix of the prompt
//                    (its prefill then sends only the pages past it), else as least_loaded
// A worker that fails a call, or three polls in a row (a worker whose cores are all busy may
// answer a poll late), is down until a poll succeeds again. When no worker of a role is up,
// requests still try the others before giving up.
//
// Where the workers are, per role, a list of sources, looked at again at every poll:
//   host:port        one worker
//   dns:NAME:PORT    every address NAME resolves to (a Kubernetes headless Service: one per
//                    ready pod), on PORT
//   file:PATH        the sources in PATH, one a line (# comments)
// A worker the sources stop naming is removed: it takes no new requests, and those it is
// serving finish on it. One they name again comes back. A source that cannot be read or
// resolved keeps what it named last.
#ifndef SLUICE_ROUTER_WORKER_REGISTRY_H_
#define SLUICE_ROUTER_WORKER_REGISTRY_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/grpc_auth.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/sluice.grpc.pb.h"
#include "router/worker_calls.h"

namespace sluice::router {

enum class Placement { kRoundRobin, kLeastLoaded, kPrefixAffinity };
absl::StatusOr<Placement> ParsePlacement(const std::string& name);

// prefix_affinity's choice among `live` prefill workers (not empty), as described above; the
// prompt's prefixes are added to the chosen worker's. The caller holds what guards the workers.
Worker* PickByPrefix(absl::Span<Worker* const> live, absl::Span<const int32_t> prompt);
// least_loaded's choice among `live` decode workers (not empty).
Worker* MostFreePages(absl::Span<Worker* const> live);
// prefix_affinity's choice among `live` decode workers (not empty), as described above.
Worker* PickByHeldPrefix(absl::Span<Worker* const> live, absl::Span<const int32_t> prompt);

class WorkerRegistry final : public WorkerSet {
 public:
  // Starts polling; the first poll (sources included) runs before the constructor returns.
  // Every call to a worker carries `auth`'s token.
  WorkerRegistry(const std::vector<std::string>& prefill, const std::vector<std::string>& decode,
                 Placement placement, absl::Duration poll, const GrpcAuth& auth = GrpcAuth());

  // The workers' addresses one source names now (see above): NotFound / Unavailable, naming
  // the source, when a file cannot be read or a name not resolved.
  static absl::StatusOr<std::vector<std::string>> Resolve(const std::string& source);
  ~WorkerRegistry();

  // A healthy worker of `role` not in `exclude`, by the placement policy; when none is healthy,
  // any worker of `role` not in `exclude`; null when none is left.
  Worker* Pick(const std::string& role, absl::Span<const int32_t> prompt,
               const std::set<Worker*>& exclude) override;
  // A call to `w` failed in a way that says the worker is gone.
  void MarkDown(Worker* w, const std::string& error) override;
  bool Up(Worker* w) override;
  // Counts of healthy workers by role.
  int Healthy(const std::string& role);
  struct View {
    std::string address, role;
    bool up = false;
    bool ready = false;
    rpc::StatsResponse stats;
    std::string last_error;
  };
  std::vector<View> Snapshot();
  // Every worker its sources name drops its reusable prefixes (Admin.ResetPrefixCache: a
  // prefill worker's prefix cache, a decode worker's held prefixes), each call within
  // `deadline`; a prefill worker's prefixes stop counting for placement once it answers.
  struct Reset {
    std::string name, address, role;
    int64_t entries_dropped = 0;
    std::string error;  // empty when the worker answered
  };
  std::vector<Reset> ResetPrefixCaches(absl::Duration deadline);

 private:
  void PollOnce();
  void PollLoop();
  // Adds the workers the sources name now and removes those they no longer name (poller only).
  void Discover();

  const Placement placement_;
  const absl::Duration poll_;
  grpc::ChannelArguments channel_args_;
  const GrpcAuth auth_;
  std::vector<std::pair<std::string, std::string>> sources_;                       // (role, source)
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> named_;  // last seen
  // Every worker ever named; never freed (requests hold Worker pointers), only removed.
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t round_robin_[2] = {0, 0};
  std::thread poller_;
};

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_WORKER_REGISTRY_H_
