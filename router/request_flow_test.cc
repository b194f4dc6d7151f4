#include "router/request_flow.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Scripted answers, first come first served; once one is left it answers every later call.
template <typename T>
class Script {
 public:
  void Add(T answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(std::move(answer));
  }
  T Next(const T& otherwise) {
    std::lock_guard<std::mutex> lock(mu_);
    if (answers_.empty()) return otherwise;
    T out = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::deque<T> answers_;
};

// A generation that sends its acceptance and `tokens` tokens, or fails at once with `error`,
// or (`hang`) sends nothing until it is cancelled, as a stopped worker.
class FakeGeneration final : public GenerationStream {
 public:
  FakeGeneration(absl::Status error, int tokens, std::atomic<int>* cancels, bool hang = false)
      : error_(std::move(error)), tokens_(tokens), cancels_(cancels), hang_(hang) {}
  bool Read(rpc::GenerateResponse* message) override {
    while (hang_ && !cancelled_) absl::SleepFor(absl::Milliseconds(1));
    if (cancelled_) error_ = absl::CancelledError("cancelled");
    if (!error_.ok() || sent_ > tokens_) return false;
    *message = rpc::GenerateResponse();
    if (sent_ > 0) message->add_tokens()->set_token(sent_);
    if (sent_ == tokens_) message->set_finish_reason("length");
    ++sent_;
    return true;
  }
  absl::Status Finish() override { return error_; }
  void Cancel() override {
    ++*cancels_;
    cancelled_ = true;
  }

 private:
  absl::Status error_;
  int tokens_, sent_ = 0;
  std::atomic<int>* cancels_;
  const bool hang_;
  std::atomic<bool> cancelled_{false};
};

class FakeDecode final : public DecodeCalls {
 public:
  explicit FakeDecode(std::string name) : name_(std::move(name)) {}
  absl::StatusOr<rpc::ReserveResponse> Reserve(const rpc::ReserveRequest& request) override {
    ++reserves;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_reserve = request;
    }
    const absl::Status st = reserve_script.Next(absl::OkStatus());
    if (!st.ok()) return st;
    rpc::ReserveResponse r;
    r.set_reservation_id(++next_id_);
    r.set_expires_in_seconds(expires_in_seconds);
    r.set_pages(7);
    r.set_state_bytes(8);
    r.set_region(name_);
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(r.reservation_id());
    return r;
  }
  absl::Status Renew(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    renew_threads.insert(std::this_thread::get_id());
    ++renewals;
    return live_.contains(id) ? absl::OkStatus() : absl::NotFoundError("no such reservation");
  }
  absl::Status Release(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    released.push_back(id);
    return live_.erase(id) ? absl::OkStatus() : absl::NotFoundError("no such reservation");
  }
  std::unique_ptr<GenerationStream> Generate(const rpc::GenerateRequest& request) override {
    ++generates;
    last_generate = request;
    absl::Status st = generate_script.Next(absl::OkStatus());
    std::lock_guard<std::mutex> lock(mu_);
    generate_requests.push_back(request);
    // A reservation of several choices lasts until its last choice began.
    if (request.choice() + 1 >= std::max(request.choices(), 1))
      live_.erase(request.reservation_id());
    return std::make_unique<FakeGeneration>(std::move(st), 3, &cancels, hang_generate);
  }

  Script<absl::Status> reserve_script, generate_script;
  bool hang_generate = false;
  double expires_in_seconds = 30;
  std::atomic<int> reserves{0}, generates{0}, renewals{0}, cancels{0};
  std::mutex mu_;
  std::vector<uint64_t> released;
  std::set<std::thread::id> renew_threads;
  rpc::GenerateRequest last_generate;
  rpc::ReserveRequest last_reserve;
  std::vector<rpc::GenerateRequest> generate_requests;

 private:
  std::string name_;
  uint64_t next_id_ = 0;
  std::set<uint64_t> live_;
};

class FakePrefill final : public PrefillCalls {
 public:
  absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request,
                                               CallCancel* cancel) override {
    ++calls;
    last = request;
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    if (hang) {  // a stopped worker: the call returns only when cancelled
      while (cancel == nullptr || !cancel->cancelled()) absl::SleepFor(absl::Milliseconds(1));
      return absl::CancelledError("cancelled");
    }
    const absl::Status st = script.Next(absl::OkStatus());
    if (!st.ok()) return st;
    rpc::PrefillResponse r;
    r.mutable_first()->set_token(42);
    for (int i = 1; i < request.choices(); ++i) r.add_more_first()->set_token(42 + i);
    r.set_pages(5);
    r.set_state_bytes(100);
    r.set_state_crc32c(0xfeed);
    return r;
  }
  Script<absl::Status> script;
  absl::Duration delay;
  std::atomic<bool> hang{false};
  std::atomic<int> calls{0};
  rpc::PrefillRequest last;
};

// Workers picked in order, skipping the excluded and those marked down.
class FakeWorkers final : public WorkerSet {
 public:
  FakeDecode& AddDecode(const std::string& name) {
    auto w = std::make_unique<Worker>();
    w->address = name;
    w->role = "decode";
    auto calls = std::make_unique<FakeDecode>(name);
    FakeDecode& out = *calls;
    w->decode = std::move(calls);
    workers_.push_back(std::move(w));
    return out;
  }
  FakePrefill& AddPrefill(const std::string& name) {
    auto w = std::make_unique<Worker>();
    w->address = name;
    w->role = "prefill";
    auto calls = std::make_unique<FakePrefill>();
    FakePrefill& out = *calls;
    w->prefill = std::move(calls);
    workers_.push_back(std::move(w));
    return out;
  }
  Worker* Pick(const std::string& role, absl::Span<const int32_t>,
               const std::set<Worker*>& exclude) override {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& w : workers_) {
      if (w->role == role && !exclude.contains(w.get()) && !down.contains(w->address)) {
        return w.get();
      }
    }
    return nullptr;
  }
  void MarkDown(Worker* w, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu);
    down.insert(w->address);
  }
  bool Up(Worker* w) override {
    std::lock_guard<std::mutex> lock(mu);
    return !down.contains(w->address);
  }
  Worker& worker(const std::string& name) {
    for (auto& w : workers_) {
      if (w->address == name) return *w;
    }
    std::abort();
  }

  std::mutex mu;
  std::set<std::string> down;

 private:
  std::vector<std::unique_ptr<Worker>> workers_;
};

struct Counts {
  std::mutex mu;
  std::vector<std::string> retries;
  int waiting = 0, waits = 0, reserved = 0;
};

RequestFlowOptions Options(Counts& c) {
  return {.max_attempts = 3,
          .queue_timeout = absl::Seconds(5),
          .pages_retry = absl::Milliseconds(1),
          .min_renew_period = absl::Milliseconds(20),
          .on_retry =
              [&c](const char* role) {
                std::lock_guard<std::mutex> lock(c.mu);
                c.retries.push_back(role);
              },
          .on_waiting =
              [&c](int delta) {
                c.waiting += delta;
                if (delta > 0) ++c.waits;
              },
          .on_reserved = [&c](absl::Duration) { ++c.reserved; }};
}

FlowRequest Request() {
  FlowRequest r{.request_id = 99, .prompt = {5, 6, 7}, .preset = "int8"};
  r.sampling.set_max_tokens(4);
  return r;
}

// Every token of a running request: the prefill's, then the stream's.
std::vector<int32_t> Tokens(RunningRequest& run) {
  std::vector<int32_t> out = {run.prefilled.first().token()};
  rpc::GenerateResponse m;
  while (run.stream->Read(&m)) {
    for (const auto& t : m.tokens()) out.push_back(t.token());
  }
  return out;
}

TEST(RequestFlowTest, SeveralChoicesArePrefilledOnceAndEachGenerates) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  FakePrefill& p = workers.AddPrefill("p0");
  Counts c;
  RequestFlow flow(workers, Options(c));
  FlowRequest r = Request();
  r.choices = 3;
  r.sampling.set_seed(1000);
  auto runs = flow.StartChoices(r);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ(d.reserves, 1);
  EXPECT_EQ(d.last_reserve.choices(), 3);
  EXPECT_EQ(p.calls, 1);
  EXPECT_EQ(p.last.choices(), 3);
  ASSERT_EQ(d.generate_requests.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const rpc::GenerateRequest& g = d.generate_requests[static_cast<size_t>(i)];
    EXPECT_EQ(g.reservation_id(), d.generate_requests[0].reservation_id());
    EXPECT_EQ(g.choice(), i);
    EXPECT_EQ(g.choices(), 3);
    EXPECT_EQ(g.sampling().seed(), 1000u + static_cast<uint64_t>(i));  // as a request of seed+i
    EXPECT_EQ(g.first().token(), 42 + i);
    RunningRequest& run = *(*runs)[static_cast<size_t>(i)];
    EXPECT_EQ(run.prefilled.first().token(), 42 + i);
    EXPECT_EQ(run.prefilled.more_first_size(), 0);
    EXPECT_EQ(Tokens(run), std::vector<int32_t>({42 + i, 1, 2, 3}));
  }
  EXPECT_EQ(workers.worker("d0").in_flight, 3);
  runs->clear();
  EXPECT_EQ(workers.worker("d0").in_flight, 0);
  // One choice goes through Start alone; a replay continues one choice.
  EXPECT_FALSE(flow.Start(r).ok());
  r.replay = {42, 1};
  EXPECT_FALSE(flow.StartChoices(r).ok());
}

TEST(RequestFlowTest, AChoiceThatDoesNotBeginTakesTheAttemptWithIt) {
  FakeWorkers workers;
  FakeDecode& d0 = workers.AddDecode("d0");
  FakeDecode& d1 = workers.AddDecode("d1");
  workers.AddPrefill("p0");
  d0.generate_script.Add(absl::OkStatus());
  d0.generate_script.Add(absl::UnavailableError("d0 went away"));
  Counts c;
  RequestFlow flow(workers, Options(c));
  FlowRequest r = Request();
  r.choices = 2;
  auto runs = flow.StartChoices(r);
  ASSERT_TRUE(runs.ok()) << runs.status();
  // On d0 the first choice began and was cancelled, the reservation released; d1 has both.
  EXPECT_EQ(d0.generates, 2);
  EXPECT_EQ(d0.cancels, 1);
  EXPECT_EQ(d0.released.size(), 1u);
  EXPECT_EQ(d1.generates, 2);
  for (const auto& run : *runs) EXPECT_EQ(run->decode, &workers.worker("d1"));
  EXPECT_EQ(workers.worker("d0").in_flight, 0);
  EXPECT_EQ(workers.worker("d1").in_flight, 2);
}

TEST(RequestFlowTest, ReservesPrefillsAndGenerates) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  FakePrefill& p = workers.AddPrefill("p0");
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->decode, &workers.worker("d0"));
  EXPECT_EQ((*run)->prefill, &workers.worker("p0"));
  EXPECT_EQ(workers.worker("d0").in_flight, 1);
  EXPECT_EQ(workers.worker("p0").in_flight, 0);
  // The prefill writes pages and state into the reservation; the generation names the state.
  EXPECT_EQ(p.last.region(), "d0");
  EXPECT_EQ(p.last.pages(), 7);
  EXPECT_EQ(p.last.decode_worker(), "d0");
  EXPECT_EQ(p.last.compression().preset(), "int8");
  EXPECT_EQ(d.last_generate.reservation_id(), 1u);
  EXPECT_EQ(p.last.state_bytes(), 8);
  EXPECT_EQ(d.last_generate.pages(), 5);
  EXPECT_EQ(d.last_generate.state_bytes(), 100);
  EXPECT_EQ(d.last_generate.state_crc32c(), 0xfeedu);
  EXPECT_EQ(d.last_generate.first().token(), 42);
  EXPECT_THAT(Tokens(**run), ElementsAre(42, 1, 2, 3));
  EXPECT_THAT(c.retries, ::testing::IsEmpty());
  EXPECT_EQ(c.reserved, 1);
  run->reset();
  EXPECT_EQ(workers.worker("d0").in_flight, 0);
}

TEST(RequestFlowTest, AGoneDecodeWorkerIsMarkedDownAndAnotherServes) {
  FakeWorkers workers;
  FakeDecode& d0 = workers.AddDecode("d0");
  workers.AddDecode("d1");
  workers.AddPrefill("p0");
  d0.reserve_script.Add(absl::UnavailableError("connection refused"));
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->decode->address, "d1");
  EXPECT_THAT(workers.down, ElementsAre("d0"));
  EXPECT_THAT(c.retries, ElementsAre("decode"));
}

TEST(RequestFlowTest, BusyPoolsWaitForPagesThenServe) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  workers.AddPrefill("p0");
  for (int i = 0; i < 5; ++i) d.reserve_script.Add(absl::ResourceExhaustedError("no pages"));
  d.reserve_script.Add(absl::OkStatus());
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(d.reserves, 6);
  EXPECT_EQ(c.waits, 1);
  EXPECT_EQ(c.waiting, 0);
  EXPECT_THAT(c.retries, ::testing::IsEmpty());  // waiting is not a retry
}

TEST(RequestFlowTest, WaitingForPagesEndsAtTheQueueTimeout) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  workers.AddPrefill("p0");
  d.reserve_script.Add(absl::ResourceExhaustedError("no pages"));
  Counts c;
  RequestFlowOptions o = Options(c);
  o.queue_timeout = absl::Milliseconds(50);
  RequestFlow flow(workers, o);
  const absl::Time start = absl::Now();
  auto run = flow.Start(Request());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(c.waiting, 0);
}

TEST(RequestFlowTest, AGonePrefillWorkerReleasesTheReservationAndAnotherPrefills) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  FakePrefill& p0 = workers.AddPrefill("p0");
  FakePrefill& p1 = workers.AddPrefill("p1");
  p0.script.Add(absl::UnavailableError("prefill worker gone"));
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->prefill->address, "p1");
  EXPECT_EQ(p0.calls, 1);
  EXPECT_EQ(p1.calls, 1);
  EXPECT_THAT(d.released, ElementsAre(1));  // the first reservation
  EXPECT_EQ(d.last_generate.reservation_id(), 2u);
  EXPECT_THAT(c.retries, ElementsAre("prefill"));
}

TEST(RequestFlowTest, APrefillWorkerMarkedDownMidCallIsLeftForAnother) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  FakePrefill& p0 = workers.AddPrefill("p0");
  FakePrefill& p1 = workers.AddPrefill("p1");
  p0.hang = true;  // stopped: it would answer at its call's deadline, minutes away
  Counts c;
  RequestFlowOptions o = Options(c);
  o.prefill_watch = absl::Milliseconds(10);
  o.prefill_down_grace = absl::Milliseconds(50);
  RequestFlow flow(workers, o);
  // The health checks find it gone a while into the call.
  std::thread poll([&] {
    while (p0.calls == 0) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(50));
    std::lock_guard<std::mutex> lock(workers.mu);
    workers.down.insert("p0");
  });
  auto run = flow.Start(Request());
  poll.join();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->prefill->address, "p1");
  EXPECT_EQ(p1.calls, 1);
  EXPECT_THAT(d.released, ElementsAre(1));  // p0's reservation
  EXPECT_THAT(c.retries, ElementsAre("prefill"));
}

TEST(RequestFlowTest, PagesThatDidNotArriveMoveTheRequestToAnotherDecodeWorker) {
  FakeWorkers workers;
  FakeDecode& d0 = workers.AddDecode("d0");
  FakeDecode& d1 = workers.AddDecode("d1");
  FakePrefill& p = workers.AddPrefill("p0");
  p.script.Add(absl::AbortedError("transfer to d0 failed"));
  p.script.Add(absl::OkStatus());
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->decode->address, "d1");
  EXPECT_THAT(d0.released, ElementsAre(1));
  EXPECT_EQ(d1.generates, 1);
  EXPECT_THAT(workers.down, ElementsAre("d0"));
  EXPECT_THAT(c.retries, ElementsAre("decode"));
}

TEST(RequestFlowTest, AnExpiredReservationStartsOver) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  workers.AddPrefill("p0");
  d.generate_script.Add(absl::NotFoundError("reservation 1 expired"));
  d.generate_script.Add(absl::OkStatus());
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(d.reserves, 2);
  EXPECT_EQ(d.generates, 2);
  EXPECT_TRUE(workers.down.empty());
  EXPECT_THAT(c.retries, ElementsAre("decode"));
}

TEST(RequestFlowTest, OtherErrorsReturnAtOnce) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  workers.AddDecode("d1");
  FakePrefill& p = workers.AddPrefill("p0");
  d.reserve_script.Add(absl::NotFoundError("no preset 'x'"));
  Counts c;
  RequestFlow flow(workers, Options(c));
  EXPECT_EQ(flow.Start(Request()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.calls, 0);
  d.reserve_script.Add(absl::OkStatus());
  d.reserve_script.Next(absl::OkStatus()).IgnoreError();  // drop the NotFound
  p.script.Add(absl::InvalidArgumentError("token 99999 outside the vocabulary"));
  auto st = flow.Start(Request()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("vocabulary"));
  EXPECT_THAT(d.released, ElementsAre(1));
  EXPECT_THAT(c.retries, ::testing::IsEmpty());
  EXPECT_TRUE(workers.down.empty());
}

TEST(RequestFlowTest, AttemptsRunOutWithTheLastErrorOnceNoWorkerCameBack) {
  FakeWorkers workers;
  for (const char* name : {"d0", "d1", "d2", "d3"}) {
    workers.AddDecode(name).reserve_script.Add(absl::UnavailableError(std::string(name) + " gone"));
  }
  workers.AddPrefill("p0");
  Counts c;
  RequestFlowOptions options = Options(c);
  options.queue_timeout = absl::Milliseconds(300);
  options.worker_wait = absl::Milliseconds(50);
  RequestFlow flow(workers, options);
  const absl::Time start = absl::Now();
  auto st = flow.Start(Request()).status();
  // A round of 3 attempts, then rounds on what is left (d3) and on nothing, waiting for a
  // worker to come back until the queue timeout.
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("d3 gone"));
  EXPECT_EQ(c.retries.size(), 4u);
  EXPECT_EQ(workers.down.size(), 4u);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST(RequestFlowTest, NoPrefillWorkerReleasesTheReservation) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  Counts c;
  RequestFlowOptions options = Options(c);
  options.queue_timeout = absl::Milliseconds(200);
  options.worker_wait = absl::Milliseconds(50);
  RequestFlow flow(workers, options);
  auto st = flow.Start(Request()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("no prefill worker"));
  // One reservation a round, each released.
  EXPECT_GE(d.reserves, 2);
  EXPECT_EQ(static_cast<int>(d.released.size()), d.reserves.load());
}

TEST(RequestFlowTest, ReservationsAreRenewedWhileThePromptWaitsAndNotAfter) {
  FakeWorkers workers;
  FakeDecode& d = workers.AddDecode("d0");
  FakePrefill& p = workers.AddPrefill("p0");
  d.expires_in_seconds = 0.03;  // renewed every 20 ms (the floor)
  p.delay = absl::Milliseconds(200);
  Counts c;
  RequestFlow flow(workers, Options(c));
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  const int renewed = d.renewals;
  EXPECT_GE(renewed, 3);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(d.renewals, renewed);
}

TEST(RequestFlowTest, ADecodeWorkerThatNeverBeginsIsLeftForAnother) {
  FakeWorkers workers;
  FakeDecode& d0 = workers.AddDecode("d0");
  workers.AddDecode("d1");
  workers.AddPrefill("p0");
  d0.hang_generate = true;
  Counts c;
  RequestFlowOptions options = Options(c);
  options.open_timeout = absl::Milliseconds(100);
  RequestFlow flow(workers, options);
  auto run = flow.Start(Request());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->decode, &workers.worker("d1"));
  EXPECT_EQ(d0.cancels, 1);
  EXPECT_TRUE(workers.down.contains("d0"));
  EXPECT_THAT(c.retries, ElementsAre("decode"));
}

TEST(RequestFlowTest, ContinueReplaysTheGeneratedTokensElsewhere) {
  FakeWorkers workers;
  workers.AddDecode("d0");
  FakeDecode& d1 = workers.AddDecode("d1");
  FakePrefill& p = workers.AddPrefill("p0");
  Counts c;
  RequestFlow flow(workers, Options(c));
  FlowRequest r = Request();
  r.sampling.set_max_tokens(10);
  const std::vector<int32_t> prompt = r.prompt;
  auto run = flow.Continue(r, {42, 7, 9}, &workers.worker("d0"), "stalled");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->decode, &workers.worker("d1"));
  // The prompt is prefilled as it was, with the request's own sampling; the decode worker
  // starts from the first generated token and feeds the others before it samples.
  EXPECT_THAT(p.last.prompt(), ::testing::ElementsAreArray(prompt));
  EXPECT_EQ(p.last.sampling().max_tokens(), 10);
  EXPECT_EQ(p.last.sampling().skip_samples(), 0);
  EXPECT_EQ(d1.last_generate.first().token(), 42);
  EXPECT_THAT(d1.last_generate.replay(), ElementsAre(7, 9));
  EXPECT_EQ(d1.last_generate.sampling().max_tokens(), 10);
  EXPECT_EQ((*run)->replayed, 3);
  EXPECT_EQ(flow.Continue(r, std::vector<int32_t>(10, 1), nullptr, "failed").status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(RequestFlowTest, ContinueByPrefillCarriesTheGeneratedTokensElsewhere) {
  FakeWorkers workers;
  workers.AddDecode("d0");
  FakeDecode& d1 = workers.AddDecode("d1");
  FakePrefill& p = workers.AddPrefill("p0");
  Counts c;
  RequestFlowOptions o = Options(c);
  o.replay_migrations = false;
  RequestFlow flow(workers, o);
  FlowRequest r = Request();
  r.sampling.set_max_tokens(10);
  r.sampling.set_skip_samples(2);
  const std::vector<int32_t> prompt = r.prompt;
  auto run = flow.Continue(r, {42, 7, 9}, &workers.worker("d0"), "stalled");
  ASSERT_TRUE(run.ok()) << run.status();
  // d0 was marked down: the rest runs on d1, its prompt followed by what was generated.
  EXPECT_EQ((*run)->decode, &workers.worker("d1"));
  std::vector<int32_t> want = prompt;
  want.insert(want.end(), {42, 7, 9});
  EXPECT_THAT(p.last.prompt(), ::testing::ElementsAreArray(want));
  EXPECT_EQ(p.last.sampling().max_tokens(), 7);
  EXPECT_EQ(p.last.sampling().skip_samples(), 5);
  EXPECT_EQ(d1.last_generate.sampling().skip_samples(), 5);
  EXPECT_EQ((*run)->replayed, 0);
  EXPECT_TRUE(d1.last_generate.replay().empty());
  // Nothing left to generate: OutOfRange, nothing started.
  EXPECT_EQ(flow.Continue(r, std::vector<int32_t>(10, 1), nullptr, "failed").status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(TimersTest, OneThreadFiresEveryTimer) {
  FakeDecode a("a"), b("b");
  rpc::ReserveRequest req;
  const uint64_t ra = a.Reserve(req)->reservation_id(), rb = b.Reserve(req)->reservation_id();
  Timers timers;
  const uint64_t ha = timers.Add(absl::Milliseconds(10), true, [&] { a.Renew(ra).IgnoreError(); });
  const uint64_t hb = timers.Add(absl::Milliseconds(15), true, [&] { b.Renew(rb).IgnoreError(); });
  std::atomic<int> once{0}, reset{0};
  timers.Add(absl::Milliseconds(5), false, [&] { ++once; });
  // Reset more often than its period: it never fires until the resets stop.
  const uint64_t hr = timers.Add(absl::Milliseconds(40), false, [&] { ++reset; });
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(15));
    timers.Reset(hr, absl::Milliseconds(40));
  }
  EXPECT_EQ(reset, 0);
  timers.Remove(ha);
  const int after = a.renewals;
  absl::SleepFor(absl::Milliseconds(60));
  timers.Remove(hb);
  EXPECT_GE(after, 5);
  EXPECT_EQ(a.renewals, after);
  EXPECT_GE(b.renewals, 5);
  EXPECT_EQ(once, 1);
  EXPECT_EQ(reset, 1);
  std::set<std::thread::id> threads = a.renew_threads;
  threads.insert(b.renew_threads.begin(), b.renew_threads.end());
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_FALSE(threads.contains(std::this_thread::get_id()));
}

}  // namespace
}  // namespace sluice::router
