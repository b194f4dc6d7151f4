// The calls a request makes to its workers, behind one interface per role, so that the request
// choreography (request_flow.h) runs the same against gRPC stubs (the router,
// grpc_worker_calls.h), worker objects in the same process (tests/disaggregated_test.cc) and
// fakes (request_flow_test.cc). Every call returns absl::Status: UNAVAILABLE or
// DEADLINE_EXCEEDED mean the worker is gone.
#ifndef SLUICE_ROUTER_WORKER_CALLS_H_
#define SLUICE_ROUTER_WORKER_CALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grpcpp/channel.h"
#include "proto/health.grpc.pb.h"
#include "proto/sluice.grpc.pb.h"

namespace sluice::router {

// One running generation on a decode worker.
class GenerationStream {
 public:
  virtual ~GenerationStream() = default;
  // The next message; false once the stream has ended (Finish then says how). The first
  // message is empty: the KV is in and the sequence runs.
  virtual bool Read(rpc::GenerateResponse* message) = 0;
  // How the stream ended; call once Read returned false (or after Cancel).
  virtual absl::Status Finish() = 0;
  // Ends the generation early (the client went away); its pages return to the pool.
  virtual void Cancel() = 0;

  // Read without waiting: `done(true)` once the next message is in `message`, `done(false)`
  // once the stream has ended. `done` may run on another thread, and may start the next read.
  // One read at a time. (Here: a Read in place, for streams that have nothing better.)
  virtual void ReadAsync(rpc::GenerateResponse* message, std::function<void(bool)> done) {
    done(Read(message));
  }
  // Finish without waiting: `done` gets how the stream ended, once it has.
  virtual void FinishAsync(std::function<void(absl::Status)> done) { done(Finish()); }
};

class DecodeCalls {
 public:
  virtual ~DecodeCalls() = default;
  virtual absl::StatusOr<rpc::ReserveResponse> Reserve(const rpc::ReserveRequest& request) = 0;
  virtual absl::Status Renew(uint64_t reservation_id) = 0;
  virtual absl::Status Release(uint64_t reservation_id) = 0;
  virtual std::unique_ptr<GenerationStream> Generate(const rpc::GenerateRequest& request) = 0;
};

// Lets another thread cancel a call in flight: the call binds how it is cancelled while it
// runs, and ends CANCELLED when it is.
class CallCancel {
 public:
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (cancel_) cancel_();
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  // Until Unbind, Cancel runs `cancel` (at once when Cancel came first).
  void Bind(std::function<void()> cancel) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = std::move(cancel);
    if (cancelled_) cancel_();
  }
  void Unbind() {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = nullptr;
  }

 private:
  std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> cancel_;
};

class PrefillCalls {
 public:
  virtual ~PrefillCalls() = default;
  // `cancel` (may be null) ends the call early: the request moves to another worker.
  virtual absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request,
                                                       CallCancel* cancel) = 0;
};

// One worker as the router knows it.
struct Worker {
  std::string address;                      // host:port
  std::string role;                         // "prefill" or "decode"
  std::shared_ptr<grpc::Channel> channel;   // the router's; null in tests
  std::unique_ptr<rpc::Admin::Stub> admin;  // stats (WorkerRegistry's polls)
  // grpc.health.v1 (WorkerRegistry's polls: liveness, readiness)
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::unique_ptr<PrefillCalls> prefill;  // prefill workers
  std::unique_ptr<DecodeCalls> decode;    // decode workers
  std::atomic<int64_t> in_flight{0};

  // Under the registry's mutex.
  bool removed = false;  // its sources no longer name it: no new requests
  bool up = false;       // answers, its loop turns (liveness) and it is not draining
  bool ready = false;    // readiness: can take a request now (a full pool is live, not ready)
  int failed_polls = 0;  // in a row
  rpc::StatsResponse stats;
  std::string last_error;
  // Prefill: names of the prompt prefixes it caches (kvstore::PrefixBlockHashes), as its last
  // poll said and as prompts placed on it since then add.
  absl::flat_hash_set<uint64_t> prefixes;
};

// Where requests go: the router's WorkerRegistry, or a test's workers.
class WorkerSet {
 public:
  virtual ~WorkerSet() = default;
  // A worker of `role` ("prefill" or "decode") not in `exclude`; null when none is left.
  virtual Worker* Pick(const std::string& role, absl::Span<const int32_t> prompt,
                       const std::set<Worker*>& exclude) = 0;
  // A call to `w` failed in a way that says the worker is gone.
  virtual void MarkDown(Worker* w, const std::string& error) = 0;
  // Whether `w` is up, as its health checks last said (a call waiting on a worker that stopped
  // answering them is given up).
  virtual bool Up(Worker* w) = 0;
};

// Whether a failed call says its worker is gone (so another may take the request).
inline bool WorkerGone(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
}

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_WORKER_CALLS_H_
