// A request's choreography across the workers: reserve KV pages on a decode worker, have a
// prefill worker compute the prompt into them (its pages and its KV state go into the window
// the decode worker exposed for the reservation; only ids, sizes and checksums pass here),
// open the generation;
// retry on other workers while nothing has reached the client, wait for pages while every
// decode worker's pool is busy, and renew the reservation while the prompt queues for prefill.
//
//   decode.Reserve ─► prefill.Prefill (renewed meanwhile) ─► decode.Generate ─► first message
//        │ RESOURCE_EXHAUSTED: wait (queue_timeout)     │ ABORTED: the pages did not reach the
//        │ worker gone: next decode worker              │   decode worker: next decode worker
//        │                                              │ prefill worker gone: next prefill
//        │                                              └ NOT_FOUND at Generate: the reservation
//        │                                                expired: start over
//        └ any other error: returned as is
//
// Attempts that fail on a gone worker mark it down (WorkerSet::MarkDown) and count against
// max_attempts; when a round of attempts ends that way (or finds no worker of a role up), the
// request waits worker_wait and tries again, for queue_timeout from the first such round. A
// reservation whose prefill failed is released. Reservations are renewed by one timer thread
// (Timers), every third of their lifetime, while their prefill runs.
//
// A generation that fails or stalls after it began goes on elsewhere (Continue): the prompt and
// the tokens generated so far are prefilled again on a healthy prefill worker and the rest is
// generated on another decode worker, its sampler past the draws already made. The caller
// (the router) reads the new stream as the old one's continuation; a stream's stall is noticed
// by the same timer thread (the caller arms a timer that cancels the stream).
#ifndef SLUICE_ROUTER_REQUEST_FLOW_H_
#define SLUICE_ROUTER_REQUEST_FLOW_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/sluice.pb.h"
#include "router/worker_calls.h"

namespace sluice::router {

// Runs callbacks on one thread when their time comes: `period` after a timer was added (or
// last reset), then every `period` again while it repeats; until it is removed.
class Timers {
 public:
  Timers();
  ~Timers();
  uint64_t Add(absl::Duration period, bool repeat, std::function<void()> fire);
  // The timer's period starts again now, with `period`.
  void Reset(uint64_t handle, absl::Duration period);
  // Once this returns, the callback neither runs nor will run (called from a callback: will not
  // run again).
  void Remove(uint64_t handle);

 private:
  struct Entry {
    std::function<void()> fire;
    absl::Duration period;
    bool repeat;
    absl::Time due;
  };
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_ = 1;
  uint64_t firing_ = 0;  // the handle whose callback runs
  bool stop_ = false;
  std::thread thread_;
};

struct RequestFlowOptions {
  int max_attempts = 3;                                 // workers tried per request
  absl::Duration queue_timeout = absl::Seconds(60);     // waiting for KV pages on every decoder
  absl::Duration pages_retry = absl::Milliseconds(20);  // between reservations while waiting
  // Between rounds of attempts while every worker of a role is gone or failing.
  absl::Duration worker_wait = absl::Milliseconds(500);
  absl::Duration min_renew_period = absl::Seconds(1);
  // A decode worker that has not begun a generation this long after it was asked counts as
  // gone (the request moves to another one).
  absl::Duration open_timeout = absl::Seconds(10);
  // How often a prefill in flight looks whether its worker is still up (health checks): one
  // that has been down for prefill_down_grace (stopped, hung) has the call cancelled and the
  // request tried elsewhere.
  absl::Duration prefill_watch = absl::Seconds(1);
  absl::Duration prefill_down_grace = absl::Seconds(10);
  // How Continue moves a generation: true, by replay (the prompt prefilled as it was, the
  // generated tokens fed by decode steps as they were: the KV, and so the rest of the text, as
  // on the failed worker, in as many steps as tokens); false, by prefilling prompt and tokens
  // together (one prefill, but a lossy preset's KV then differs from what decoding wrote, and
  // the text may part from what it would have been).
  bool replay_migrations = true;
  // Observers (each may be empty): a retry after `role` failed; the request starts (+1) or
  // stops (-1) waiting for pages; the reservation succeeded `queued` after the request began.
  std::function<void(const char* role)> on_retry;
  std::function<void(int delta)> on_waiting;
  std::function<void(absl::Duration queued)> on_reserved;
};

struct FlowRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> prompt;
  rpc::SamplingParams sampling;
  std::string preset;  // empty: the workers' default
  absl::Time arrived = absl::Now();
  // A migration by replay (Continue): the tokens the request generated, the first one
  // included; the prompt is prefilled as it was, the decode worker feeds these as it did.
  std::vector<int32_t> replay;
  // Generations from the one prompt (OpenAI's n): prefilled once, forked on the decode worker;
  // choice i samples as a request of seed + i (ChoiceSampling) and, once running, is a request
  // of its own (a migration moves it alone).
  int choices = 1;
};

// A request whose generation runs: its first token came with the prefill, the rest come from
// `stream`, whose first (empty) message has been read. Holds one of decode->in_flight.
struct RunningRequest {
  Worker* prefill = nullptr;
  Worker* decode = nullptr;
  rpc::PrefillResponse prefilled;
  std::unique_ptr<GenerationStream> stream;
  absl::Time first_token_time;
  // Tokens replayed (FlowRequest::replay): `prefilled.first()` is the first of them, not a new
  // token, and the stream's first new token comes after the decode worker fed them all.
  int replayed = 0;
  ~RunningRequest();
};

class RequestFlow {
 public:
  RequestFlow(WorkerSet& workers, RequestFlowOptions options);

  // Reserve, prefill and open the generation, retrying as above. The error of the last
  // attempt when every attempt failed (UNAVAILABLE when no worker was left to try).
  absl::StatusOr<std::unique_ptr<RunningRequest>> Start(const FlowRequest& request);
  // Start for a request of several choices: one reservation and one prefill for all, then one
  // generation per choice (in choice order), each as Start's; when one does not begin, those
  // that did are cancelled and the attempt fails as a whole.
  absl::StatusOr<std::vector<std::unique_ptr<RunningRequest>>> StartChoices(
      const FlowRequest& request);
  // `request`'s generation failed or stalled on `failed` (marked down here, with `why`) after
  // `generated` tokens, the prefill's first included: starts it again on other workers, by
  // replay (the run's `replayed` says how many tokens it fed before its new ones) or with the
  // tokens after the prompt, max_tokens less them and the samplers past their draws (the new
  // run's first token then is the request's next one). OutOfRange when no token is left.
  absl::StatusOr<std::unique_ptr<RunningRequest>> Continue(const FlowRequest& request,
                                                           absl::Span<const int32_t> generated,
                                                           Worker* failed, const std::string& why);
  // The timer thread, for callers that watch their streams.
  Timers& timers() { return timers_; }

 private:
  void Retry(const char* role);

  WorkerSet& workers_;
  const RequestFlowOptions options_;
  Timers timers_;
};

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_REQUEST_FLOW_H_
