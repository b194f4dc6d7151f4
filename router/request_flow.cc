#include "router/request_flow.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/sampling.h"
#include "common/status_macros.h"

namespace sluice::router {

Timers::Timers() : thread_([this] { Loop(); }) {}

Timers::~Timers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Timers::Add(absl::Duration period, bool repeat, std::function<void()> fire) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t handle = next_++;
  entries_[handle] = {
      .fire = std::move(fire), .period = period, .repeat = repeat, .due = absl::Now() + period};
  cv_.notify_all();
  return handle;
}

void Timers::Reset(uint64_t handle, absl::Duration period) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return;
  it->second.period = period;
  it->second.due = absl::Now() + period;
  cv_.notify_all();
}

void Timers::Remove(uint64_t handle) {
  std::unique_lock<std::mutex> lock(mu_);
  entries_.erase(handle);
  // From a callback (its own, or one that ends another's request), there is nothing to await.
  if (std::this_thread::get_id() == thread_.get_id()) return;
  cv_.wait(lock, [&] { return firing_ != handle; });
}

void Timers::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto next =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const auto& a, const auto& b) { return a.second.due < b.second.due; });
    if (next == entries_.end()) {
      cv_.wait(lock);
      continue;
    }
    const absl::Time now = absl::Now();
    if (next->second.due > now) {
      cv_.wait_for(lock, absl::ToChronoMicroseconds(next->second.due - now));
      continue;
    }
    const uint64_t handle = next->first;
    std::function<void()> fire = next->second.fire;
    if (next->second.repeat) {
      next->second.due = now + next->second.period;
    } else {
      entries_.erase(next);
    }
    firing_ = handle;
    lock.unlock();
    fire();
    lock.lock();
    firing_ = 0;
    cv_.notify_all();
  }
}

RunningRequest::~RunningRequest() {
  if (decode != nullptr) --decode->in_flight;
}

RequestFlow::RequestFlow(WorkerSet& workers, RequestFlowOptions options)
    : workers_(workers), options_(std::move(options)) {}

void RequestFlow::Retry(const char* role) {
  if (options_.on_retry) options_.on_retry(role);
}

absl::StatusOr<std::unique_ptr<RunningRequest>> RequestFlow::Start(const FlowRequest& r) {
  if (r.choices != 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Start runs one choice; %d need StartChoices", r.choices));
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<RunningRequest>> runs, StartChoices(r));
  return std::move(runs[0]);
}

absl::StatusOr<std::vector<std::unique_ptr<RunningRequest>>> RequestFlow::StartChoices(
    const FlowRequest& r) {
  SLUICE_ASSIGN_OR_RETURN(const int choices, CheckedChoices(r.choices));
  if (choices > 1 && !r.replay.empty()) {
    return absl::InvalidArgumentError("a replay continues one choice");
  }
  std::set<Worker*> tried_prefill, tried_decode;
  absl::Status last = absl::UnavailableError("no decode worker is up");
  const absl::Time give_up = absl::Now() + options_.queue_timeout;
  absl::Time workers_gone_since = absl::InfiniteFuture();
  bool waiting = false;
  auto wait = [&](bool on) {
    if (waiting != on && options_.on_waiting) options_.on_waiting(on ? 1 : -1);
    waiting = on;
  };
  // A worker that failed this attempt: marked down when gone, never tried again for r.
  auto drop = [&](Worker* w, std::set<Worker*>& tried, const absl::Status& st) {
    const std::string line =
        absl::StrFormat("router: request %d: %s worker %s failed (%s); trying another\n",
                        r.request_id, w->role, w->address, st.ToString());
    std::fputs(line.c_str(), stderr);
    workers_.MarkDown(w, std::string(st.message()));
    tried.insert(w);
    Retry(w->role.c_str());
  };
  // Rounds of attempts: while every worker of a role is gone or failing (restarting, stopped,
  // between pods), the request waits for one to come back, as it waits for pages, until
  // queue_timeout; then it fails with the last error.
  for (;;) {
    for (int attempt = 0; attempt < options_.max_attempts;) {
      Worker* d = workers_.Pick("decode", r.prompt, tried_decode);
      if (d == nullptr) break;
      rpc::ReserveRequest reserve;
      reserve.set_request_id(r.request_id);
      reserve.mutable_compression()->set_preset(r.preset);
      reserve.set_prompt_tokens(static_cast<int32_t>(r.prompt.size()));
      reserve.set_max_tokens(r.sampling.max_tokens());
      if (choices > 1) reserve.set_choices(choices);
      // The decode worker offers the pages it holds of the prompt's prefix.
      reserve.mutable_prompt()->Add(r.prompt.begin(), r.prompt.end());
      absl::StatusOr<rpc::ReserveResponse> reserved = d->decode->Reserve(reserve);
      if (absl::IsResourceExhausted(reserved.status()) && absl::Now() < give_up) {
        // Every decode worker's pool is busy: wait for pages, as a queue would.
        wait(true);
        last = reserved.status();
        absl::SleepFor(options_.pages_retry);
        continue;
      }
      wait(false);
      if (!reserved.ok()) {
        last = reserved.status();
        if (!WorkerGone(last)) return last;
        drop(d, tried_decode, last);
        ++attempt;
        continue;
      }
      if (options_.on_reserved) options_.on_reserved(absl::Now() - r.arrived);
      const uint64_t reservation = reserved->reservation_id();
      Worker* pf = workers_.Pick("prefill", r.prompt, tried_prefill);
      if (pf == nullptr) {
        d->decode->Release(reservation).IgnoreError();
        last = absl::UnavailableError("no prefill worker is up");
        break;
      }
      rpc::PrefillRequest pre;
      pre.set_request_id(r.request_id);
      pre.mutable_prompt()->Add(r.prompt.begin(), r.prompt.end());
      *pre.mutable_sampling() = r.sampling;
      pre.mutable_compression()->set_preset(r.preset);
      pre.set_decode_worker(d->address);
      pre.set_region(reserved->region());
      pre.set_pages(reserved->pages());
      pre.set_state_bytes(reserved->state_bytes());
      pre.set_page_bytes(reserved->page_bytes());
      if (choices > 1) pre.set_choices(choices);
      if (reserved->has_held()) *pre.mutable_held() = reserved->held();
      // The prompt may wait in the prefill worker's queue longer than the reservation lives.
      const absl::Duration period =
          std::max(options_.min_renew_period, absl::Seconds(reserved->expires_in_seconds() / 3.0));
      ++pf->in_flight;
      // A failed renewal needs no action: the generation that follows finds the reservation
      // gone (NOT_FOUND) and the request starts over.
      DecodeCalls* decode = d->decode.get();
      const uint64_t renewal = timers_.Add(period, /*repeat=*/true, [decode, reservation] {
        decode->Renew(reservation).IgnoreError();
      });
      // A prefill worker that stops answering its health checks (stopped, hung) would hold
      // the request until the call's deadline: the call is cancelled once the worker has been
      // down for prefill_down_grace (a worker that misses a few polls under load and answers
      // again keeps its prompts).
      CallCancel stop_prefill;
      absl::Time down_since = absl::InfiniteFuture();  // the timer thread's
      const uint64_t prefill_watch = timers_.Add(
          options_.prefill_watch, /*repeat=*/true, [this, pf, &stop_prefill, &down_since] {
            const absl::Time now = absl::Now();
            if (workers_.Up(pf)) {
              down_since = absl::InfiniteFuture();
            } else if (down_since == absl::InfiniteFuture()) {
              down_since = now;
            } else if (now - down_since >= options_.prefill_down_grace) {
              stop_prefill.Cancel();
            }
          });
      absl::StatusOr<rpc::PrefillResponse> prefilled = pf->prefill->Prefill(pre, &stop_prefill);
      timers_.Remove(prefill_watch);
      timers_.Remove(renewal);
      --pf->in_flight;
      if (!prefilled.ok() && stop_prefill.cancelled()) {
        prefilled = absl::UnavailableError(absl::StrFormat(
            "the prefill worker %s stopped answering its health checks during the prefill "
            "(down for %s)",
            pf->address, absl::FormatDuration(options_.prefill_down_grace)));
      }
      if (!prefilled.ok()) {
        d->decode->Release(reservation).IgnoreError();
        last = prefilled.status();
        if (absl::IsAborted(last)) {
          drop(d, tried_decode, last);  // the pages did not reach the decode worker
        } else if (WorkerGone(last)) {
          drop(pf, tried_prefill, last);
        } else {
          return last;
        }
        ++attempt;
        continue;
      }
      if (prefilled->more_first_size() != choices - 1) {
        d->decode->Release(reservation).IgnoreError();
        return absl::InternalError(
            absl::StrFormat("the prefill worker %s sampled %d first tokens for %d choices",
                            pf->address, prefilled->more_first_size() + 1, choices));
      }
      const absl::Time first_token_time = absl::Now();
      // Each choice's generation, opened one after another on the reservation: the first
      // imports the prompt's KV, the others fork it.
      std::vector<std::unique_ptr<RunningRequest>> runs;
      absl::Status opening_failed;
      for (int choice = 0; choice < choices && opening_failed.ok(); ++choice) {
        auto running = std::make_unique<RunningRequest>();
        running->first_token_time = first_token_time;
        rpc::GenerateRequest gen;
        gen.set_request_id(r.request_id);
        gen.set_reservation_id(reservation);
        gen.mutable_prompt()->Add(r.prompt.begin(), r.prompt.end());
        *gen.mutable_sampling() = ChoiceSampling(r.sampling, choice);  // choice 0: as asked
        gen.mutable_compression()->set_preset(r.preset);
        // The pages and the KV state are in the reservation's window; the generation names how
        // many pages, and the state's size and checksum.
        gen.set_pages(static_cast<int32_t>(prefilled->pages()));
        gen.set_state_bytes(prefilled->state_bytes());
        gen.set_state_crc32c(prefilled->state_crc32c());
        gen.set_wire_codec(prefilled->wire_codec());
        gen.set_wire_calibration(prefilled->wire_calibration());
        *gen.mutable_held_pages() = prefilled->held_pages();
        if (prefilled->has_marks()) *gen.mutable_marks() = prefilled->marks();
        if (choices > 1) {
          gen.set_choice(choice);
          gen.set_choices(choices);
        }
        const rpc::GeneratedToken& first =
            choice == 0 ? prefilled->first() : prefilled->more_first(choice - 1);
        *gen.mutable_first() = first;
        if (!r.replay.empty()) {
          // The first token is the one the request generated first (the prefill, given the
          // same prompt and draws, sampled it again); the rest are fed after it.
          gen.mutable_first()->Clear();
          gen.mutable_first()->set_token(r.replay[0]);
          gen.mutable_replay()->Add(r.replay.begin() + 1, r.replay.end());
          running->replayed = static_cast<int>(r.replay.size());
        }
        running->stream = d->decode->Generate(gen);
        rpc::GenerateResponse accepted;
        // A decode worker that does not take the generation within open_timeout (stopped, or
        // its loop stuck) has the stream cancelled under it, and counts as gone.
        std::atomic<bool> stalled{false};
        GenerationStream* opening = running->stream.get();
        const uint64_t watch = timers_.Add(options_.open_timeout, /*repeat=*/false, [&] {
          stalled = true;
          opening->Cancel();
        });
        const bool opened = running->stream->Read(&accepted);
        timers_.Remove(watch);
        if (!opened) {
          opening_failed = running->stream->Finish();
          if (stalled) {
            opening_failed = absl::DeadlineExceededError(
                absl::StrFormat("the decode worker %s did not begin the generation within %s",
                                d->address, absl::FormatDuration(options_.open_timeout)));
          }
          if (opening_failed.ok()) {
            opening_failed = absl::InternalError(absl::StrFormat(
                "the decode worker %s ended the generation before it began", d->address));
          }
          break;
        }
        running->prefill = pf;
        running->decode = d;
        ++d->in_flight;
        running->prefilled = *prefilled;
        *running->prefilled.mutable_first() = first;
        running->prefilled.clear_more_first();
        running->prefilled.clear_marks();
        runs.push_back(std::move(running));
      }
      if (!opening_failed.ok()) {
        last = opening_failed;
        // A choice did not begin: the ones that did end, and the request starts again whole.
        for (std::unique_ptr<RunningRequest>& run : runs) {
          run->stream->Cancel();
          run->stream->Finish().IgnoreError();
        }
        if (choices > 1) d->decode->Release(reservation).IgnoreError();
        if (absl::IsNotFound(last)) {
          // The reservation expired while the prompt waited for prefill: start over.
          Retry("decode");
          ++attempt;
          continue;
        }
        if (!WorkerGone(last)) return last;
        drop(d, tried_decode, last);
        ++attempt;
        continue;
      }
      return runs;
    }
    const bool workers_failed =
        absl::IsUnavailable(last) || absl::IsDeadlineExceeded(last) || absl::IsAborted(last);
    // The wait for workers counts from the first round that found none: time the request
    // spent queued for a prefill before a worker failed under it does not use it up.
    if (workers_gone_since == absl::InfiniteFuture()) workers_gone_since = absl::Now();
    if (!workers_failed ||
        absl::Now() + options_.worker_wait >= workers_gone_since + options_.queue_timeout) {
      break;
    }
    wait(true);
    absl::SleepFor(options_.worker_wait);
    tried_prefill.clear();
    tried_decode.clear();
  }
  wait(false);
  return last;
}

absl::StatusOr<std::unique_ptr<RunningRequest>> RequestFlow::Continue(
    const FlowRequest& request, absl::Span<const int32_t> generated, Worker* failed,
    const std::string& why) {
  const int left = request.sampling.max_tokens() - static_cast<int>(generated.size());
  if (left <= 0) {
    return absl::OutOfRangeError(
        absl::StrFormat("the request generated all its %d tokens", request.sampling.max_tokens()));
  }
  if (failed != nullptr) workers_.MarkDown(failed, why);
  if (options_.replay_migrations) {
    FlowRequest next = request;
    next.replay.assign(generated.begin(), generated.end());
    return Start(next);
  }
  FlowRequest next = request;
  next.prompt.insert(next.prompt.end(), generated.begin(), generated.end());
  next.sampling.set_max_tokens(left);
  next.sampling.set_skip_samples(request.sampling.skip_samples() +
                                 static_cast<int>(generated.size()));
  return Start(next);
}

}  // namespace sluice::router
