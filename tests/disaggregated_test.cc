// A prefill worker and a decode worker in one process, joined by the loopback transport, on the
// real model, driven by the router's request choreography (router/request_flow.h) through
// in-process calls: generation split across them gives exactly the tokens one process gives
// with the same preset; reservations expire, cancellation and damaged pages free everything;
// a put reaches only the window of the reservation it serves, and a client holds a bounded
// share of the pool.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/sampling.h"
#include "common/worker_runtime.h"
#include "decode/decode_worker.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/cache/prefix_index.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_transform_calibration.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "prefill/prefill_worker.h"
#include "router/request_flow.h"
#include "router/worker_calls.h"
#include "transport/transport.h"

namespace sluice {
namespace {

// The workers' calls in this process (the router's are gRPC stubs of the same workers' services).
class LocalGeneration final : public router::GenerationStream {
 public:
  LocalGeneration(decode::DecodeWorker& worker,
                  absl::StatusOr<std::shared_ptr<decode::TokenStream>> s)
      : worker_(worker), stream_(std::move(s)) {}
  bool Read(rpc::GenerateResponse* message) override {
    if (!stream_.ok() || ended_) return false;
    if (!accepted_) {  // as the service: an empty first message once the sequence runs
      accepted_ = true;
      message->Clear();
      return true;
    }
    while (!(*stream_)->NextMessage(message, &ended_, &error_, absl::Milliseconds(20))) {
    }
    return !(ended_ && !error_.ok() && message->tokens_size() == 0);
  }
  absl::Status Finish() override { return stream_.ok() ? error_ : stream_.status(); }
  void Cancel() override {
    if (stream_.ok()) worker_.Cancel(*stream_);
  }

 private:
  decode::DecodeWorker& worker_;
  absl::StatusOr<std::shared_ptr<decode::TokenStream>> stream_;
  bool accepted_ = false, ended_ = false;
  absl::Status error_;
};

class LocalDecode final : public router::DecodeCalls {
 public:
  LocalDecode(decode::DecodeWorker& worker, std::function<void()> before_generate)
      : worker_(worker), before_generate_(std::move(before_generate)) {}
  absl::StatusOr<rpc::ReserveResponse> Reserve(const rpc::ReserveRequest& request) override {
    auto r = worker_.Reserve(request);
    if (r.ok()) last_reserved = *r;
    return r;
  }
  rpc::ReserveResponse last_reserved;
  absl::Status Renew(uint64_t id) override { return worker_.Renew(id).status(); }
  absl::Status Release(uint64_t id) override { return worker_.Release(id); }
  std::unique_ptr<router::GenerationStream> Generate(const rpc::GenerateRequest& r) override {
    if (before_generate_) before_generate_();
    return std::make_unique<LocalGeneration>(worker_, worker_.Generate(r));
  }

 private:
  decode::DecodeWorker& worker_;
  std::function<void()> before_generate_;
};

class LocalPrefill final : public router::PrefillCalls {
 public:
  explicit LocalPrefill(prefill::PrefillWorker& worker) : worker_(worker) {}
  absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request,
                                               router::CallCancel*) override {
    return worker_.Prefill(request);
  }

 private:
  prefill::PrefillWorker& worker_;
};

// One prefill and one decode worker; a worker marked down is not picked again.
class LocalWorkers final : public router::WorkerSet {
 public:
  LocalWorkers(prefill::PrefillWorker& p, decode::DecodeWorker& d,
               std::function<void()> before_generate) {
    prefill_.address = "prefill-0";
    prefill_.role = "prefill";
    prefill_.prefill = std::make_unique<LocalPrefill>(p);
    decode_.address = "decode-0";
    decode_.role = "decode";
    auto calls = std::make_unique<LocalDecode>(d, std::move(before_generate));
    local_decode_ = calls.get();
    decode_.decode = std::move(calls);
  }
  const rpc::ReserveResponse& last_reserved() const { return local_decode_->last_reserved; }
  router::Worker* Pick(const std::string& role, absl::Span<const int32_t>,
                       const std::set<router::Worker*>& exclude) override {
    router::Worker* w = role == "prefill" ? &prefill_ : &decode_;
    return exclude.contains(w) || !down_.empty() ? nullptr : w;
  }
  void MarkDown(router::Worker* w, const std::string& error) override {
    down_ = w->address + ": " + error;
  }
  bool Up(router::Worker*) override { return down_.empty(); }

 private:
  router::Worker prefill_, decode_;
  LocalDecode* local_decode_ = nullptr;
  std::string down_;
};

class Disaggregated : public testing::Test {
 public:
  void SetUp() override {
    path_ = model::DefaultModelPath();
    if (!std::filesystem::exists(path_)) GTEST_SKIP() << "no model at " << path_;
    transport_ = transport::CreateLoopbackTransport();
    auto p = WorkerRuntime::Create({.model_path = path_,
                                    .backend = "cpu",
                                    .threads = 1,
                                    .kv_pages = prefill_pages_,
                                    .default_preset = "sluice",
                                    .max_presets = 8,
                                    .stage_pools = stage_pools_,
                                    .kv_calibration = kv_calibration_,
                                    .wire_bits = wire_bits_},
                                   transport_.get());
    ASSERT_TRUE(p.ok()) << p.status();
    auto d = WorkerRuntime::Create({.model_path = path_,
                                    .backend = "cpu",
                                    .threads = 1,
                                    .kv_pages = decode_pages_,
                                    .default_preset = "sluice",
                                    .max_presets = 8,
                                    .receiver = true,
                                    .kv_calibration = kv_calibration_},
                                   transport_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    prefill_rt_ = *std::move(p);
    decode_rt_ = *std::move(d);
    prefill_ = std::make_unique<prefill::PrefillWorker>(*prefill_rt_, *transport_, registry_,
                                                        prefill_options_);
    decode_ = std::make_unique<decode::DecodeWorker>(
        *decode_rt_, registry_, decode::DecodeWorkerOptions{.reservation_ttl = absl::Seconds(60)});
    auto gguf = model::GgufFile::Open(path_);
    ASSERT_TRUE(gguf.ok());
    auto vocab = model::VocabFromGguf(**gguf);
    ASSERT_TRUE(vocab.ok());
    auto tok = model::Tokenizer::Create(*std::move(vocab));
    ASSERT_TRUE(tok.ok());
    std::string text;
    for (int i = 0; i < 3; ++i) {
      text +=
          "The river Rhine rises in the Swiss Alps and flows north through Germany and the "
          "Netherlands before it reaches the North Sea. Along its banks lie many old towns, "
          "castles and vineyards, and barges carry coal, grain and containers on its water. "
          "The river Danube, by contrast, flows east. ";
    }
    auto ids = (*tok)->Encode(text, false);
    ASSERT_TRUE(ids.ok());
    prompt_ = *ids;
    auto question = (*tok)->Encode(" Which of the two rivers is longer, and by how much?", false);
    ASSERT_TRUE(question.ok());
    question_ = *question;
    eos_ = (*tok)->eos_id();
  }

  rpc::SamplingParams Greedy(int max_tokens, bool stop_at_eos = true) const {
    rpc::SamplingParams s;
    s.set_temperature(0);
    s.set_top_p(1);
    s.set_repetition_penalty(1);
    s.set_max_tokens(max_tokens);
    if (stop_at_eos) s.add_stop_token_ids(eos_);
    return s;
  }

  // The router's choreography: reserve on decode, prefill into the reservation, generate.
  // `before_generate` runs between the prefill and the generation.
  absl::StatusOr<std::unique_ptr<router::RunningRequest>> Start(
      const std::string& preset, const rpc::SamplingParams& sampling,
      std::function<void()> before_generate = nullptr) {
    workers_ = std::make_unique<LocalWorkers>(*prefill_, *decode_, std::move(before_generate));
    flow_ = std::make_unique<router::RequestFlow>(*workers_, router::RequestFlowOptions{});
    return flow_->Start(
        {.request_id = 1, .prompt = prompt_, .sampling = sampling, .preset = preset});
  }

  // Every token of a running request after the first, until it ends.
  static std::vector<int32_t> Drain(router::GenerationStream& stream, std::string* reason) {
    std::vector<int32_t> out;
    rpc::GenerateResponse m;
    while (stream.Read(&m)) {
      for (const auto& t : m.tokens()) out.push_back(t.token());
      if (!m.finish_reason().empty()) *reason = m.finish_reason();
    }
    return out;
  }

  // Greedy tokens of one process with `preset`: the prompt, then one token at a time.
  std::vector<int32_t> Local(const std::string& preset, int max_tokens) {
    auto gguf = model::GgufFile::Open(path_);
    auto backend = kernels::CpuBackend::Create({.threads = 1});
    auto llama = model::LlamaModel::Load(**gguf, **backend);
    const model::LlamaConfig& c = (*llama)->config();
    auto p = kvstore::FindKvPreset(preset, static_cast<int32_t>(c.head_dim));
    auto cache = kvstore::PagedKvCache::Create({.layers = c.layers,
                                                .heads = c.heads,
                                                .kv_heads = c.kv_heads,
                                                .head_dim = c.head_dim,
                                                .preset = *p,
                                                .pages = 4096},
                                               **backend);
    EXPECT_TRUE(cache.ok()) << cache.status();
    EXPECT_TRUE((*cache)->AddSequence(0, prompt_.size() + max_tokens).ok());
    std::vector<float> logits(c.vocab);
    std::vector<int32_t> history = prompt_, out;
    EXPECT_TRUE((*llama)->Forward({{0, prompt_}}, **cache, logits.data()).ok());
    model::SamplingParams sp;
    sp.temperature = 0;
    model::Sampler sampler(sp);
    for (int i = 0; i < max_tokens; ++i) {
      const int32_t t = sampler.Sample(logits, history);
      out.push_back(t);
      history.push_back(t);
      if (t == eos_ || i + 1 == max_tokens) break;
      EXPECT_TRUE(
          (*llama)->Forward({{0, absl::MakeConstSpan(&t, 1)}}, **cache, logits.data()).ok());
    }
    return out;
  }

  double Counter(const std::string& name) {
    double total = 0;
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) total += m.counter.value;
    }
    return total;
  }

  // A histogram's sum and count, over its labels.
  std::pair<double, uint64_t> Histogram(const std::string& name) {
    std::pair<double, uint64_t> total{0, 0};
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        total.first += m.histogram.sample_sum;
        total.second += m.histogram.sample_count;
      }
    }
    return total;
  }

  void ExpectNothingHeld() {
    // What the workers hold besides their cached and held prefixes comes back too.
    prefill_->DropPrefixCache();
    decode_->DropHeldPrefixes();
    // The decode worker's gauges refresh every scheduler loop.
    for (int i = 0; i < 100 && decode_->Stats().kv_pages_used() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(decode_->Stats().kv_pages_used(), 0);
    EXPECT_EQ(decode_->Stats().kv_pages_reserved(), 0);
    EXPECT_EQ(decode_->Stats().running(), 0);
    for (const auto& [name, cache] : prefill_rt_->caches()) {
      EXPECT_EQ(cache.cache->pool().used_pages(), 0) << name;
    }
    for (const auto& [name, cache] : decode_rt_->caches()) {
      EXPECT_EQ(cache.cache->pool().used_pages(), 0) << "decode " << name;
    }
  }

  bool stage_pools_ = false;  // set before SetUp: pages pass through host copies of the pools
  // Set before SetUp: the prefill worker's options and pool.
  prefill::PrefillWorkerOptions prefill_options_;
  int64_t prefill_pages_ = 4096;
  int64_t decode_pages_ = 4096;
  // Set before SetUp: the transform-coded wire (both workers' calibration, the prefill's bits).
  std::string kv_calibration_, wire_bits_;
  std::string path_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<WorkerRuntime> prefill_rt_, decode_rt_;
  prometheus::Registry registry_;
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::unique_ptr<LocalWorkers> workers_;
  std::unique_ptr<router::RequestFlow> flow_;
  std::vector<int32_t> prompt_, question_;
  int32_t eos_ = 0;
};

// Split across the two workers, `preset` gives the greedy tokens one process gives, and every
// page comes back.
void ExpectSameTokensAsOneProcess(Disaggregated& t, const std::string& preset) {
  SCOPED_TRACE(preset);
  auto run = t.Start(preset, t.Greedy(12));
  ASSERT_TRUE(run.ok()) << run.status();
  std::string reason;
  std::vector<int32_t> got = {(*run)->prefilled.first().token()};
  for (int32_t token : Disaggregated::Drain(*(*run)->stream, &reason)) got.push_back(token);
  EXPECT_TRUE((*run)->stream->Finish().ok());
  EXPECT_EQ(got, t.Local(preset, 12));
  // The state went into the decode worker's memory with the pages; the answer names it.
  EXPECT_GT((*run)->prefilled.state_bytes(), 0);
  EXPECT_GE((*run)->prefilled.transfer_bytes(), (*run)->prefilled.state_bytes());
  run->reset();
  // Presets without eviction send each layer's pages while the next layers compute.
  if (preset == "fp16" || preset == "sluice") {
    EXPECT_GT(t.Counter("sluice_kv_transfer_streamed_pages_total"), 0);
  }
  EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
  t.ExpectNothingHeld();
}

TEST_F(Disaggregated, SplitGenerationGivesTheSameTokensAsOneProcess) {
  for (const char* preset : {"fp16", "sluice", "kvcomp", "leankv-k8v4", "h2o", "snapkv"}) {
    ExpectSameTokensAsOneProcess(*this, preset);
  }
}

// OpenAI's n: one reservation and one prefill, and each choice forked from the prompt's pages
// goes on as a request of its own seed (seed + i) would, alone.
TEST_F(Disaggregated, ChoicesShareOnePrefillAndEachGoesOnAsARequestOfItsSeed) {
  // A prompt of several pages per list, for the choices to share its full pages.
  prompt_.reserve(prompt_.size() * 8);
  for (size_t i = 0, n = prompt_.size(); i < 7 * n; ++i) prompt_.push_back(prompt_[i]);
  rpc::SamplingParams sampled = Greedy(24, /*stop_at_eos=*/false);
  sampled.set_temperature(0.9f);
  sampled.set_top_p(0.95f);
  sampled.set_seed(7);
  auto tokens = [](router::RunningRequest& run) {
    std::vector<int32_t> out = {run.prefilled.first().token()};
    std::string reason;
    for (int32_t t : Drain(*run.stream, &reason)) out.push_back(t);
    EXPECT_EQ(reason, "length");
    return out;
  };
  auto pages_used = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the gauges' next refresh
    return decode_->Stats().kv_pages_used();
  };
  std::vector<std::vector<int32_t>> alone;
  int64_t pages_alone = 0;
  for (int i = 0; i < 3; ++i) {
    auto run = Start("sluice", ChoiceSampling(sampled, i));
    ASSERT_TRUE(run.ok()) << run.status();
    if (i == 0) pages_alone = pages_used();
    alone.push_back(tokens(**run));
  }
  EXPECT_NE(alone[0], alone[1]);  // the seeds differ
  ExpectNothingHeld();
  auto runs = flow_->StartChoices(
      {.request_id = 2, .prompt = prompt_, .sampling = sampled, .preset = "sluice", .choices = 3});
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 3u);
  const int64_t pages_shared = pages_used();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(tokens(*(*runs)[static_cast<size_t>(i)]), alone[static_cast<size_t>(i)])
        << "choice " << i;
  }
  // The prompt's full pages are held once; each choice copies only its lists' last pages.
  EXPECT_GT(pages_alone, 0);
  EXPECT_LT(pages_shared, 3 * pages_alone);
  runs->clear();
  ExpectNothingHeld();
  // Greedy choices are one text.
  auto greedy = flow_->StartChoices({.request_id = 3,
                                     .prompt = prompt_,
                                     .sampling = Greedy(8),
                                     .preset = "sluice",
                                     .choices = 2});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_EQ(tokens(*(*greedy)[0]), tokens(*(*greedy)[1]));
  greedy->clear();
  ExpectNothingHeld();
}

// A reservation of several choices whose choices do not all come: the prompt's pages go when
// it expires. A choice begins once; choices outside the reservation's are refused.
TEST_F(Disaggregated, ChoicesThatNeverComeLeaveNothingAfterTheExpiry) {
  decode_.reset();
  decode_ = std::make_unique<decode::DecodeWorker>(
      *decode_rt_, registry_,
      decode::DecodeWorkerOptions{.name = "decode-1", .reservation_ttl = absl::Milliseconds(400)});
  rpc::ReserveRequest reserve;
  reserve.set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
  reserve.set_max_tokens(4);
  reserve.set_choices(3);
  reserve.mutable_compression()->set_preset("sluice");
  auto r = decode_->Reserve(reserve);
  ASSERT_TRUE(r.ok()) << r.status();
  rpc::PrefillRequest pre;
  pre.mutable_prompt()->Add(prompt_.begin(), prompt_.end());
  *pre.mutable_sampling() = Greedy(4);
  pre.mutable_compression()->set_preset("sluice");
  pre.set_decode_worker("decode-0");
  pre.set_region(r->region());
  pre.set_page_bytes(r->page_bytes());
  pre.set_pages(r->pages());
  pre.set_state_bytes(r->state_bytes());
  pre.set_choices(3);
  // Renewed while the prompt is prefilled, as the router does.
  std::atomic<bool> prefilling{true};
  std::thread renew([&] {
    while (prefilling) {
      decode_->Renew(r->reservation_id()).IgnoreError();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto prefilled = prefill_->Prefill(pre);
  prefilling = false;
  renew.join();
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  ASSERT_EQ(prefilled->more_first_size(), 2);
  rpc::GenerateRequest gen;
  gen.set_reservation_id(r->reservation_id());
  gen.mutable_prompt()->Add(prompt_.begin(), prompt_.end());
  *gen.mutable_sampling() = Greedy(4);
  gen.mutable_compression()->set_preset("sluice");
  gen.set_pages(static_cast<int32_t>(prefilled->pages()));
  gen.set_state_bytes(prefilled->state_bytes());
  gen.set_state_crc32c(prefilled->state_crc32c());
  *gen.mutable_first() = prefilled->first();
  gen.set_choices(3);
  gen.set_choice(1);
  {
    auto stream = decode_->Generate(gen);
    ASSERT_TRUE(stream.ok()) << stream.status();
    LocalGeneration run(*decode_, *std::move(stream));
    std::string reason;
    Drain(run, &reason);
    EXPECT_EQ(reason, "length");
  }
  EXPECT_EQ(decode_->Generate(gen).status().code(), absl::StatusCode::kAlreadyExists);
  gen.set_choice(3);
  EXPECT_EQ(decode_->Generate(gen).status().code(), absl::StatusCode::kInvalidArgument);
  // Choices 0 and 2 never come: the imported prompt holds pages until the expiry.
  EXPECT_GT(decode_->Stats().kv_pages_used() + decode_->Stats().kv_pages_reserved(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ExpectNothingHeld();
  gen.set_choice(0);
  EXPECT_EQ(decode_->Generate(gen).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(Disaggregated, ReservationsExpireAndTheirPagesReturn) {
  decode_.reset();
  decode_ = std::make_unique<decode::DecodeWorker>(
      *decode_rt_, registry_,
      decode::DecodeWorkerOptions{.name = "decode-1", .reservation_ttl = absl::Milliseconds(300)});
  rpc::ReserveRequest reserve;
  reserve.set_prompt_tokens(500);
  reserve.set_max_tokens(10);
  auto r = decode_->Reserve(reserve);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->pages(), 0);
  EXPECT_GT(r->state_bytes(), 0);
  auto kept = decode_->Reserve(reserve);
  ASSERT_TRUE(kept.ok()) << kept.status();
  for (int i = 0; i < 6; ++i) {  // renewed, it outlives the other
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(decode_->Renew(kept->reservation_id()).ok());
  }
  EXPECT_EQ(decode_->Renew(r->reservation_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(decode_->Release(kept->reservation_id()).ok());
  ExpectNothingHeld();
  rpc::GenerateRequest gen;
  gen.set_reservation_id(r->reservation_id());
  gen.add_prompt(1);
  *gen.mutable_sampling() = Greedy(4);
  EXPECT_EQ(decode_->Generate(gen).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(decode_->Release(r->reservation_id()).code(), absl::StatusCode::kNotFound);
}

TEST_F(Disaggregated, CancelFreesThePagesAtOnce) {
  auto run = Start("", Greedy(400, /*stop_at_eos=*/false));
  ASSERT_TRUE(run.ok()) << run.status();
  router::GenerationStream& stream = *(*run)->stream;
  int tokens = 0;
  rpc::GenerateResponse m;
  while (tokens < 3 && stream.Read(&m)) tokens += m.tokens_size();
  stream.Cancel();
  std::string reason;
  std::vector<int32_t> rest = Drain(stream, &reason);
  EXPECT_EQ(stream.Finish().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(reason, "");  // a cancelled stream sends no finish reason
  EXPECT_LT(tokens + rest.size(), 400u);
  run->reset();
  ExpectNothingHeld();
}

// A generation moved after `cut` tokens (RequestFlow::Continue, by replay) goes on as the
// undisturbed one does: the replay leaves the KV the first decode wrote, lossy preset or not.
// The undisturbed run is cut short first: its pages go, as a failed worker's would.
TEST_F(Disaggregated, AReplayedMigrationGoesOnAsTheUndisturbedRun) {
  for (const char* preset : {"sluice", "leankv-k8v4"}) {
    for (const bool seeded : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (seeded ? " seeded" : " greedy"));
      rpc::SamplingParams sampling = Greedy(48, /*stop_at_eos=*/false);
      if (seeded) {
        sampling.set_temperature(0.8f);
        sampling.set_seed(7);
      }
      auto whole = Start(preset, sampling);
      ASSERT_TRUE(whole.ok()) << whole.status();
      std::string reason;
      std::vector<int32_t> want = {(*whole)->prefilled.first().token()};
      for (int32_t t : Drain(*(*whole)->stream, &reason)) want.push_back(t);
      whole->reset();
      ASSERT_EQ(want.size(), 48u);

      auto cut = Start(preset, sampling);
      ASSERT_TRUE(cut.ok()) << cut.status();
      std::vector<int32_t> generated = {(*cut)->prefilled.first().token()};
      rpc::GenerateResponse m;
      while (generated.size() < 37 && (*cut)->stream->Read(&m)) {
        for (const auto& t : m.tokens()) generated.push_back(t.token());
      }
      // A message may carry several tokens (the worker sends what piled up): cut at 37.
      if (generated.size() > 37) generated.resize(37);
      (*cut)->stream->Cancel();
      Drain(*(*cut)->stream, &reason);
      cut->reset();
      const router::FlowRequest request{
          .request_id = 2, .prompt = prompt_, .sampling = sampling, .preset = preset};
      auto moved = flow_->Continue(request, generated, nullptr, "the test cut it");
      ASSERT_TRUE(moved.ok()) << moved.status();
      EXPECT_EQ((*moved)->replayed, static_cast<int>(generated.size()));
      std::vector<int32_t> got = generated;
      for (int32_t t : Drain(*(*moved)->stream, &reason)) got.push_back(t);
      EXPECT_EQ(reason, "length");
      moved->reset();
      EXPECT_EQ(got, want);
      ExpectNothingHeld();
    }
  }
}

// Among other requests the same: the prompt prefilled while others' prompts arrive beside it,
// the generation cut and replayed while others decode in the same steps, in batches whose size
// and order change as they come and go. The text equals the one the request gave alone, as a
// greedy request moved by the router must (a sequence's numbers do not depend on its batch).
TEST_F(Disaggregated, AMigrationAmongOtherRequestsGoesOnAsTheRunAlone) {
  const std::string preset = "sluice";
  // Tokens and their logprobs, which show a difference in the last bit of the logits.
  rpc::SamplingParams sampling = Greedy(48, /*stop_at_eos=*/false);
  sampling.set_logprobs(true);
  using Scored = std::vector<std::pair<int32_t, float>>;
  const auto drain = [](router::GenerationStream& stream, Scored& out) {
    rpc::GenerateResponse m;
    while (stream.Read(&m)) {
      for (const auto& t : m.tokens()) out.emplace_back(t.token(), t.logprob());
    }
  };
  auto alone = Start(preset, sampling);
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::string reason;
  Scored want = {{(*alone)->prefilled.first().token(), (*alone)->prefilled.first().logprob()}};
  drain(*(*alone)->stream, want);
  alone->reset();
  ASSERT_EQ(want.size(), 48u);

  // Six others of 20 to 120 tokens, started with the request to cut: decode batches of up to
  // seven.
  constexpr int kOthers = 6;
  std::vector<std::unique_ptr<router::RunningRequest>> others(kOthers);
  std::vector<std::thread> starting;
  for (int i = 0; i < kOthers; ++i) {
    starting.emplace_back([&, i] {
      std::vector<int32_t> prompt(prompt_.begin() + 5 * i, prompt_.begin() + 20 + 20 * i);
      auto run = flow_->Start({.request_id = 10u + i,
                               .prompt = prompt,
                               .sampling = Greedy(400, /*stop_at_eos=*/false),
                               .preset = preset});
      ASSERT_TRUE(run.ok()) << run.status();
      others[i] = *std::move(run);
    });
  }
  const router::FlowRequest request{
      .request_id = 2, .prompt = prompt_, .sampling = sampling, .preset = preset};
  auto cut = flow_->Start(request);
  for (std::thread& t : starting) t.join();
  ASSERT_TRUE(cut.ok()) << cut.status();
  Scored got = {{(*cut)->prefilled.first().token(), (*cut)->prefilled.first().logprob()}};
  rpc::GenerateResponse m;
  while (got.size() < 29 && (*cut)->stream->Read(&m)) {
    for (const auto& t : m.tokens()) got.emplace_back(t.token(), t.logprob());
  }
  // A message may carry several tokens (the worker sends what piled up): cut at 29.
  if (got.size() > 29) got.resize(29);
  (*cut)->stream->Cancel();
  Drain(*(*cut)->stream, &reason);
  cut->reset();
  // One of the others ends before the replay, so the batch shrinks under it.
  others[0]->stream->Cancel();
  Drain(*others[0]->stream, &reason);
  others[0].reset();
  std::vector<int32_t> generated;
  for (const auto& [token, logprob] : got) generated.push_back(token);
  auto moved = flow_->Continue(request, generated, nullptr, "the test cut it");
  ASSERT_TRUE(moved.ok()) << moved.status();
  drain(*(*moved)->stream, got);
  moved->reset();
  EXPECT_EQ(got, want);
  for (int i = 1; i < kOthers; ++i) {
    ASSERT_NE(others[i], nullptr);
    others[i]->stream->Cancel();
    Drain(*others[i]->stream, &reason);
    others[i].reset();
  }
  ExpectNothingHeld();
}

// Writes `bytes` at `offset` of the window `reserved` names, as a peer holding its descriptor
// may; the status of the put and its flush.
absl::Status PutIntoWindow(transport::Transport& t, const rpc::ReserveResponse& reserved,
                           uint64_t offset, std::string_view bytes) {
  auto sender = t.Connect(reserved.region());
  if (!sender.ok()) return sender.status();
  absl::Status st = (*sender)->Put(bytes.data(), bytes.size(), offset);
  if (st.ok()) st = (*sender)->Flush(absl::Seconds(5));
  return st;
}

TEST_F(Disaggregated, DamagedPagesAreRefusedAndFreed) {
  // Bytes change in the first page of the reservation's window after the prefill put it there:
  // the generation refuses the page, the request fails with DATA_LOSS and is not retried.
  auto run = Start("int8", Greedy(8), [&] {
    EXPECT_TRUE(
        PutIntoWindow(*transport_, workers_->last_reserved(), 72, "\xde\xad\xbe\xef\x01").ok());
  });
  EXPECT_EQ(run.status().code(), absl::StatusCode::kDataLoss) << run.status();
  ExpectNothingHeld();
}

TEST_F(Disaggregated, ADamagedStateIsRefusedAndFreed) {
  // The KV state travels after the pages in the window, checksummed: bytes that change there
  // fail the generation with DATA_LOSS, and every page returns.
  auto run = Start("sluice", Greedy(8), [&] {
    const rpc::ReserveResponse& r = workers_->last_reserved();
    EXPECT_TRUE(PutIntoWindow(*transport_, r, r.pages() * r.page_bytes() + 5, "\x10\x20").ok());
  });
  EXPECT_EQ(run.status().code(), absl::StatusCode::kDataLoss) << run.status();
  EXPECT_NE(std::string(run.status().message()).find("state"), std::string::npos) << run.status();
  ExpectNothingHeld();
}

TEST_F(Disaggregated, PutsReachOnlyTheWindowOfTheirReservation) {
  // While a request waits to generate, another client of the decode worker tries what a peer
  // with network access tried before windows existed: release or use the request's
  // reservation, and have the prefill worker put a long prompt's pages through a reservation
  // made for a short one. Every attempt fails; the request's tokens are those of an
  // undisturbed run, and every page returns.
  const std::string attacker = "ipv4:10.0.0.66";
  std::vector<int32_t> undisturbed;
  {
    auto run = Start("sluice", Greedy(12));
    ASSERT_TRUE(run.ok()) << run.status();
    std::string reason;
    undisturbed = Drain(*(*run)->stream, &reason);
  }
  rpc::ReserveResponse victim;
  absl::Status overflow;
  auto run = Start("sluice", Greedy(12), [&] {
    victim = workers_->last_reserved();
    EXPECT_EQ(decode_->Release(victim.reservation_id(), attacker).code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(decode_->Renew(victim.reservation_id(), attacker).status().code(),
              absl::StatusCode::kNotFound);
    rpc::GenerateRequest steal;
    steal.set_reservation_id(victim.reservation_id());
    steal.add_prompt(1);
    steal.set_pages(1);
    steal.set_state_bytes(1);
    *steal.mutable_sampling() = Greedy(4);
    EXPECT_EQ(decode_->Generate(steal, attacker).status().code(), absl::StatusCode::kNotFound);
    // A reservation for 8 tokens; the prefill request claims room for far more pages.
    rpc::ReserveRequest small;
    small.set_prompt_tokens(8);
    small.set_max_tokens(1);
    small.mutable_compression()->set_preset("sluice");
    auto own = decode_->Reserve(small, attacker);
    ASSERT_TRUE(own.ok()) << own.status();
    rpc::PrefillRequest pre;
    pre.mutable_prompt()->Add(prompt_.begin(), prompt_.end());
    *pre.mutable_sampling() = Greedy(1);
    pre.mutable_compression()->set_preset("sluice");
    pre.set_decode_worker("decode-0");
    pre.set_region(own->region());
    pre.set_page_bytes(own->page_bytes());
    pre.set_pages(victim.pages() + own->pages() + 600);
    pre.set_state_bytes(victim.state_bytes());
    overflow = prefill_->Prefill(pre).status();
    EXPECT_TRUE(decode_->Release(own->reservation_id(), attacker).ok());
  });
  ASSERT_TRUE(run.ok()) << run.status();
  std::string reason;
  EXPECT_EQ(Drain(*(*run)->stream, &reason), undisturbed);
  EXPECT_EQ(overflow.code(), absl::StatusCode::kAborted) << overflow;
  EXPECT_NE(std::string(overflow.message()).find("leaves"), std::string::npos) << overflow;
  // Once the generation began, the request's window is gone: its descriptor reaches nothing.
  EXPECT_FALSE(PutIntoWindow(*transport_, victim, 0, "x").ok());
  run->reset();
  ExpectNothingHeld();
}

TEST_F(Disaggregated, AClientHoldsABoundedShareOfThePool) {
  decode_.reset();
  decode_ = std::make_unique<decode::DecodeWorker>(
      *decode_rt_, registry_,
      decode::DecodeWorkerOptions{
          .name = "decode-1", .max_client_reserved_fraction = 0.25, .max_client_reservations = 3});
  rpc::ReserveRequest big;  // about 15% of the 4096 pages
  big.set_prompt_tokens(1300);
  big.set_max_tokens(8);
  auto first = decode_->Reserve(big, "ipv4:10.0.0.1");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(first->pages() * 2, 4096 / 4) << first->pages();
  ASSERT_LT(first->pages(), 4096 / 4) << first->pages();
  // A second one would take the client past a quarter of the pool; another client's fits.
  auto second = decode_->Reserve(big, "ipv4:10.0.0.1");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_NE(std::string(second.status().message()).find("ipv4:10.0.0.1"), std::string::npos);
  auto other = decode_->Reserve(big, "ipv4:10.0.0.2");
  EXPECT_TRUE(other.ok()) << other.status();
  // Small ones, up to the count.
  rpc::ReserveRequest small;
  small.set_prompt_tokens(8);
  small.set_max_tokens(8);
  EXPECT_TRUE(decode_->Reserve(small, "ipv4:10.0.0.1").ok());
  EXPECT_TRUE(decode_->Reserve(small, "ipv4:10.0.0.1").ok());
  EXPECT_EQ(decode_->Reserve(small, "ipv4:10.0.0.1").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Counter("sluice_kv_client_bound_refusals_total"), 2);
  // Released, the client's share is back.
  ASSERT_TRUE(decode_->Release(first->reservation_id(), "ipv4:10.0.0.1").ok());
  EXPECT_TRUE(decode_->Reserve(big, "ipv4:10.0.0.1").ok());
}

// The path of a pool in device memory, on the CPU: the prefill worker's pool is apart from the
// memory the transport reads (and the decode worker's always is, behind its windows), so a page
// the prefill worker did not copy out, or the decode worker did not copy in, would change the
// tokens.
// Prefix caching with prompts cut every 32 tokens: a multi-turn conversation, each turn's
// prompt the last one's with its answer and a question after it.
class DisaggregatedPrefixCache : public Disaggregated {
 protected:
  void SetUp() override {
    prefill_options_.chunk_tokens = 32;
    Disaggregated::SetUp();
  }
  struct Turn {
    std::vector<int32_t> tokens;
    int64_t cached = 0;
    int64_t sent = 0, held = 0;  // page bytes put, and not put for the decode worker held them
  };
  // The prompt `times` over.
  std::vector<int32_t> Repeated(int times) const {
    std::vector<int32_t> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), prompt_.begin(), prompt_.end());
    return out;
  }
  // Six prompts of their own from the first token, every other one twice as long (a long one
  // finds the pool full of the short one's prefixes); each must run.
  void RunPromptsOfTheirOwn(const std::string& preset) {
    const std::vector<int32_t> base = prompt_;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> prompt = base;
      if (i % 2 == 1) prompt.insert(prompt.end(), base.begin(), base.end());
      prompt[0] = base[1 + i];
      EXPECT_EQ(Run(preset, prompt).tokens.size(), 8u) << i;
    }
    prompt_ = base;
  }
  Turn Run(const std::string& preset, const std::vector<int32_t>& prompt) {
    prompt_ = prompt;
    auto run = Start(preset, Greedy(8, /*stop_at_eos=*/false));
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {};
    const rpc::PrefillResponse& p = (*run)->prefilled;
    Turn t{.tokens = {p.first().token()},
           .cached = p.cached_tokens(),
           .sent = p.transfer_bytes() - p.state_bytes(),
           .held = p.held_bytes()};
    std::string reason;
    for (int32_t token : Drain(*(*run)->stream, &reason)) t.tokens.push_back(token);
    EXPECT_TRUE((*run)->stream->Finish().ok());
    return t;
  }
};

// With the cache the greedy tokens are those without it, for every preset whose prompts are
// chunked; a hit forks the longest cached whole chunks below the prompt's last token, and
// nothing is held once the cache is dropped.
TEST_F(DisaggregatedPrefixCache, CachedPrefixesGiveTheTokensOfAPrefillFromTheStart) {
  const std::vector<int32_t> first = prompt_;
  for (const char* preset : {"fp16", "sluice", "kvcomp", "leankv-k8v4", "h2o", "sinks"}) {
    SCOPED_TRACE(preset);
    std::vector<int32_t> conversation = first;
    prefill_->DropPrefixCache();
    int64_t last = 0;  // the last turn's prompt
    for (int turn = 0; turn < 3; ++turn) {
      SCOPED_TRACE(turn);
      const int64_t whole = (static_cast<int64_t>(conversation.size()) - 1) / 32 * 32;
      // Turn 0 cold; a later one forks the last turn's prompt, cut at its last whole chunk.
      const Turn a = Run(preset, conversation);
      EXPECT_EQ(a.cached, last / 32 * 32);
      const Turn b = Run(preset, conversation);  // every whole chunk below the last token
      EXPECT_EQ(b.cached, whole);
      prefill_->DropPrefixCache();
      const Turn c = Run(preset, conversation);  // from the start
      EXPECT_EQ(c.cached, 0);
      EXPECT_EQ(a.tokens, c.tokens);
      EXPECT_EQ(b.tokens, c.tokens);
      ASSERT_EQ(c.tokens.size(), 8u);
      last = static_cast<int64_t>(conversation.size());
      conversation.insert(conversation.end(), c.tokens.begin(), c.tokens.end());
      conversation.insert(conversation.end(), question_.begin(), question_.end());
    }
  }
  EXPECT_GT(Counter("sluice_prefix_cache_hit_tokens_total"), 0);
  ExpectNothingHeld();
}

// A decode worker that holds a prompt's prefix receives only the pages it lacks: each turn of
// a conversation sends the pages past the last turn's, and the greedy tokens are those of a
// decode worker that holds nothing, for every preset whose prompts are chunked.
TEST_F(DisaggregatedPrefixCache, ADecodeWorkerReceivesOnlyThePagesItLacks) {
  // Long enough for full pages of the compressed presets (a page holds a few hundred tokens).
  const std::vector<int32_t> first = Repeated(4);
  for (const char* preset : {"fp16", "sluice", "kvcomp", "h2o"}) {
    SCOPED_TRACE(preset);
    const bool appends = std::string(preset) != "h2o";
    std::vector<int32_t> conversation = first;
    decode_->DropHeldPrefixes();
    for (int turn = 0; turn < 2; ++turn) {
      SCOPED_TRACE(turn);
      const Turn a = Run(preset, conversation);  // over the last turn's held pages
      const Turn b = Run(preset, conversation);  // the same prompt again: all but its tail
      decode_->DropHeldPrefixes();
      const Turn c = Run(preset, conversation);  // nothing held
      EXPECT_EQ(c.held, 0);
      EXPECT_EQ(a.tokens, c.tokens);
      EXPECT_EQ(b.tokens, c.tokens);
      EXPECT_EQ(a.sent + a.held, c.sent);
      EXPECT_EQ(b.sent + b.held, c.sent);
      if (appends) {
        EXPECT_GT(b.held, 0);
        EXPECT_GE(b.held, a.held);
        if (turn > 0) {
          EXPECT_GT(a.held, 0);
        }
      }
      ASSERT_EQ(c.tokens.size(), 8u);
      conversation.insert(conversation.end(), c.tokens.begin(), c.tokens.end());
      conversation.insert(conversation.end(), question_.begin(), question_.end());
    }
  }
  EXPECT_GT(Counter("sluice_prefix_cache_bytes_not_sent_total"), 0);
  EXPECT_GT(Counter("sluice_prefix_cache_held_offered_tokens_total"), 0);
  ExpectNothingHeld();
}

// The decode worker names its held prefixes in its stats as the router names a prompt's, and
// the pages only they keep count as free.
TEST_F(DisaggregatedPrefixCache, DecodeStatsNameTheHeldPrefixes) {
  EXPECT_EQ(Run("sluice", Repeated(4)).tokens.size(), 8u);
  rpc::StatsResponse stats;
  for (int i = 0; i < 100; ++i) {  // the stats' next refresh, once the sequence ended
    stats = decode_->Stats();
    if (stats.running() == 0 && stats.prefix_cache_entries() > 0 && stats.kv_pages_used() == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::vector<uint64_t> names =
      kvstore::PrefixBlockHashes(prompt_, 32, static_cast<int64_t>(prompt_.size()));
  EXPECT_EQ(stats.prefix_block_tokens(), 32);
  EXPECT_EQ(stats.prefix_cache_entries(), static_cast<int64_t>(names.size()));
  EXPECT_EQ(std::set<uint64_t>(stats.prefix_blocks().begin(), stats.prefix_blocks().end()),
            std::set<uint64_t>(names.begin(), names.end()));
  EXPECT_GT(stats.prefix_cache_pages(), 0);
  EXPECT_EQ(stats.prefix_cache_pages(),
            decode_rt_->caches().at("sluice").cache->pool().used_pages());
  EXPECT_EQ(stats.kv_pages_used(), 0);
  ExpectNothingHeld();
}

// A generation that names more held pages than its reservation offered is refused by name,
// and the reservation's pages, the offered ones included, go back.
TEST_F(DisaggregatedPrefixCache, AGenerationTakingPagesNotOfferedIsRefused) {
  EXPECT_EQ(Run("fp16", prompt_).tokens.size(), 8u);
  rpc::ReserveRequest reserve;
  reserve.mutable_compression()->set_preset("fp16");
  reserve.set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
  reserve.set_max_tokens(8);
  reserve.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  auto r = decode_->Reserve(reserve);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_held());
  EXPECT_EQ(r->held().tokens(), static_cast<int64_t>(prompt_.size()) / 32 * 32);
  rpc::GenerateRequest gen;
  gen.set_reservation_id(r->reservation_id());
  gen.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  *gen.mutable_sampling() = Greedy(8);
  gen.mutable_compression()->set_preset("fp16");
  gen.set_state_bytes(1);
  for (int32_t n : r->held().pages()) gen.add_held_pages(n);
  gen.set_held_pages(0, r->held().pages(0) + 1);
  auto g = decode_->Generate(gen);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("held pages of run 0"), std::string::npos) << g.status();
  // A prompt whose size disagrees with its tokens is refused by name.
  reserve.set_prompt_tokens(reserve.prompt_tokens() + 1);
  auto bad = decode_->Reserve(reserve);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("prompt_tokens"), std::string::npos) << bad.status();
  ExpectNothingHeld();
}

// A decode pool of a few prompts' pages: held prefixes give way to reservations, least
// recently used first, and no request is refused for pages they kept.
class DisaggregatedHeldSmallPool : public DisaggregatedPrefixCache {
 protected:
  void SetUp() override {
    decode_pages_ = 700;
    DisaggregatedPrefixCache::SetUp();
  }
};

TEST_F(DisaggregatedHeldSmallPool, HeldPrefixesGiveWayToReservations) {
  // fp16 pages hold 64 tokens of a list: the long prompts need most of the pool, the held
  // pages of the prompts before them included.
  RunPromptsOfTheirOwn("fp16");
  EXPECT_GT(Counter("sluice_prefix_cache_held_evictions_total"), 0);
  ExpectNothingHeld();
}

// A prompt that arrives while another computes the blocks it starts with waits for their
// snapshot rather than compute them too, and gives the tokens it gives alone.
TEST_F(DisaggregatedPrefixCache, APromptWaitsForTheSharedPrefixAnotherComputes) {
  std::vector<int32_t> first;
  for (int i = 0; i < 8; ++i) first.insert(first.end(), prompt_.begin(), prompt_.end());
  std::vector<int32_t> second(first.begin(), first.begin() + 1200);
  second.insert(second.end(), question_.begin(), question_.end());
  const Turn alone = Run("sluice", second);
  prefill_->DropPrefixCache();
  const double computed = Counter("sluice_prefill_tokens_total");
  const auto prompts_before = Histogram("sluice_prefill_seconds");
  const auto steps_before = Histogram("sluice_prefill_step_seconds");
  auto run = [&](const std::vector<int32_t>& prompt, Turn* out) {
    LocalWorkers workers(*prefill_, *decode_, nullptr);
    router::RequestFlow flow(workers, router::RequestFlowOptions{});
    auto r = flow.Start(
        {.request_id = 7, .prompt = prompt, .sampling = Greedy(8, false), .preset = "sluice"});
    ASSERT_TRUE(r.ok()) << r.status();
    out->tokens = {(*r)->prefilled.first().token()};
    out->cached = (*r)->prefilled.cached_tokens();
    std::string reason;
    for (int32_t token : Drain(*(*r)->stream, &reason)) out->tokens.push_back(token);
  };
  Turn a, b;
  std::thread ta([&] { run(first, &a); });
  // The first has committed a few chunks, far from the 1,200 tokens both start with.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread tb([&] { run(second, &b); });
  ta.join();
  tb.join();
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(b.cached, 1184);  // the whole chunks of the 1,200
  EXPECT_EQ(b.tokens, alone.tokens);
  EXPECT_EQ(Counter("sluice_prefill_tokens_total") - computed,
            static_cast<double>(first.size() + second.size() - 1184));
  // Each prompt counts every step it ran in; each step counts once, however many prompts
  // it held: at least one step, and no more forward time than the prompts together.
  const auto prompts = Histogram("sluice_prefill_seconds");
  const auto steps = Histogram("sluice_prefill_step_seconds");
  EXPECT_EQ(prompts.second - prompts_before.second, 2u);
  EXPECT_GE(steps.second - steps_before.second, 1u);
  EXPECT_GT(steps.first - steps_before.first, 0);
  EXPECT_LE(steps.first - steps_before.first, prompts.first - prompts_before.first + 1e-9);
  ExpectNothingHeld();
}

// A prompt forked from the cache that then fails (its window too small for its pages) gives
// its pages back: only the cached prefixes hold any, and they go when dropped.
TEST_F(DisaggregatedPrefixCache, AFailedPromptAfterAHitGivesItsPagesBack) {
  EXPECT_EQ(Run("sluice", prompt_).tokens.size(), 8u);
  const double hits = Counter("sluice_prefix_cache_hit_tokens_total");
  rpc::PrefillRequest bad;
  bad.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  *bad.mutable_sampling() = Greedy(8);
  bad.mutable_compression()->set_preset("sluice");
  bad.set_pages(1);
  bad.set_state_bytes(1);
  bad.set_page_bytes(prefill_rt_->caches().at("sluice").cache->pool().page_bytes());
  auto r = prefill_->Prefill(bad);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(Counter("sluice_prefix_cache_hit_tokens_total") - hits,
            static_cast<double>((prompt_.size() - 1) / 32 * 32));
  ExpectNothingHeld();
}

// The worker's stats name its cached prefixes as the router names a prompt's.
TEST_F(DisaggregatedPrefixCache, StatsNameTheCachedPrefixes) {
  EXPECT_EQ(Run("sluice", prompt_).tokens.size(), 8u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the stats' next refresh
  const rpc::StatsResponse stats = prefill_->Stats();
  const std::vector<uint64_t> names =
      kvstore::PrefixBlockHashes(prompt_, 32, static_cast<int64_t>(prompt_.size()));
  EXPECT_EQ(stats.prefix_block_tokens(), 32);
  EXPECT_EQ(stats.prefix_cache_entries(), static_cast<int64_t>(names.size()));
  EXPECT_EQ(std::set<uint64_t>(stats.prefix_blocks().begin(), stats.prefix_blocks().end()),
            std::set<uint64_t>(names.begin(), names.end()));
  // Idle, every page the pool has given out is a cached prefix's, and counts as free.
  EXPECT_GT(stats.prefix_cache_pages(), 0);
  EXPECT_EQ(stats.prefix_cache_pages(),
            prefill_rt_->caches().at("sluice").cache->pool().used_pages());
  EXPECT_EQ(stats.kv_pages_used(), 0);
  EXPECT_EQ(stats.kv_pages_free(), prefill_pages_);
  ExpectNothingHeld();
}

// Presets that select from the whole prompt are not cached.
TEST_F(DisaggregatedPrefixCache, PromptSelectionIsNotCached) {
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Run("snapkv", prompt_).cached, 0);
  ExpectNothingHeld();
}

// A pool of a few prompts' pages: cached prefixes give way, least recently used first, and no
// prompt is refused for pages they held.
class DisaggregatedPrefixCacheSmallPool : public DisaggregatedPrefixCache {
 protected:
  void SetUp() override {
    prefill_pages_ = 400;
    DisaggregatedPrefixCache::SetUp();
  }
};

TEST_F(DisaggregatedPrefixCacheSmallPool, CachedPrefixesGiveWayToPrompts) {
  RunPromptsOfTheirOwn("sluice");
  EXPECT_GT(Counter("sluice_prefix_cache_evictions_total"), 0);
  ExpectNothingHeld();
}

class DisaggregatedThroughHostCopies : public Disaggregated {
 protected:
  void SetUp() override {
    stage_pools_ = true;
    Disaggregated::SetUp();
  }
};

TEST_F(DisaggregatedThroughHostCopies, SplitGenerationGivesTheSameTokensAsOneProcess) {
  for (const auto& [name, cache] : prefill_rt_->caches()) {
    ASSERT_TRUE(cache.staged) << name;
    EXPECT_NE(cache.transport_pages, cache.cache->pool().data(0)) << name;
  }
  // Pages streamed by layer (fp16, sluice) and sent after the commit (h2o).
  for (const char* preset : {"fp16", "sluice", "h2o"}) ExpectSameTokensAsOneProcess(*this, preset);
}

// The transform-coded wire between the workers: bases and cross-layer predictors fitted on the
// GPL-3's first 512 tokens (not the prompt), 8 code bits per value.
class DisaggregatedTransformWire : public Disaggregated {
 protected:
  static std::string Calibrate(const std::string& model, int64_t first, const std::string& to) {
    auto gguf = model::GgufFile::Open(model);
    auto backend = kernels::CpuBackend::Create({.threads = 1});
    auto llama = model::LlamaModel::Load(**gguf, **backend);
    auto tok = model::Tokenizer::Create(*model::VocabFromGguf(**gguf));
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream text;
    text << in.rdbuf();
    auto ids = (*tok)->Encode(text.str(), false);
    EXPECT_TRUE(ids.ok() && ids->size() > static_cast<size_t>(first + 512));
    const std::vector<int32_t> tokens(ids->begin() + first, ids->begin() + first + 512);
    auto cal = kvstore::CalibrateKvTransform(**llama, **backend, **gguf, tokens, true);
    EXPECT_TRUE(cal.ok()) << cal.status();
    std::ofstream(to, std::ios::binary) << kvstore::SerializeKvTransformCalibration(*cal);
    return to;
  }
  void SetUp() override {
    if (!std::filesystem::exists(model::DefaultModelPath())) GTEST_SKIP() << "no model";
    if (!std::filesystem::exists("/usr/share/common-licenses/GPL-3")) GTEST_SKIP() << "no GPL-3";
    kv_calibration_ =
        Calibrate(model::DefaultModelPath(), 0, testing::TempDir() + "/disaggregated.kvtc");
    wire_bits_ = "8/8";
    Disaggregated::SetUp();
  }
};

TEST_F(DisaggregatedTransformWire, PromptsCrossCodedAndGenerateAsOneProcess) {
  // fp16 pages on the decode side: at 8 bits the greedy tokens are one process's, in about
  // 0.6 of fp16's bytes; the prefill worker counts them.
  auto run = Start("fp16", Greedy(12));
  ASSERT_TRUE(run.ok()) << run.status();
  const rpc::PrefillResponse prefilled = (*run)->prefilled;
  EXPECT_EQ(prefilled.wire_codec(), kvstore::kKvWireCodecTransform);
  EXPECT_EQ(prefilled.pages(), 0);
  EXPECT_EQ(prefilled.transfer_bytes(), prefilled.state_bytes());
  EXPECT_LT(prefilled.transfer_bytes(), prefilled.kv_fp16_bytes() * 7 / 10);
  std::string reason;
  std::vector<int32_t> got = {prefilled.first().token()};
  for (int32_t token : Drain(*(*run)->stream, &reason)) got.push_back(token);
  EXPECT_TRUE((*run)->stream->Finish().ok());
  run->reset();
  EXPECT_EQ(got, Local("fp16", 12));
  EXPECT_EQ(Counter("sluice_kv_wire_bytes_total"), prefilled.transfer_bytes());
  EXPECT_EQ(Counter("sluice_kv_wire_fp16_bytes_total"), prefilled.kv_fp16_bytes());
  ExpectNothingHeld();
  // Two choices of one coded prompt: the first imports the decoded rows, the second forks.
  auto choices = flow_->StartChoices(
      {.request_id = 5, .prompt = prompt_, .sampling = Greedy(12), .preset = "fp16", .choices = 2});
  ASSERT_TRUE(choices.ok()) << choices.status();
  for (auto& choice : *choices) {
    std::vector<int32_t> tokens = {choice->prefilled.first().token()};
    for (int32_t token : Drain(*choice->stream, &reason)) tokens.push_back(token);
    EXPECT_EQ(tokens, got);
  }
  choices->clear();
  ExpectNothingHeld();
  // KIVI-4 pages from the decoded rows; a preset that selects by attention sends its pages.
  for (const char* preset : {"sluice", "snapkv"}) {
    SCOPED_TRACE(preset);
    auto r = Start(preset, Greedy(8));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->prefilled.wire_codec(),
              std::string(preset) == "sluice" ? kvstore::kKvWireCodecTransform : 0u);
    std::vector<int32_t> tokens = Drain(*(*r)->stream, &reason);
    EXPECT_TRUE((*r)->stream->Finish().ok());
    EXPECT_FALSE(tokens.empty());
    r->reset();
    ExpectNothingHeld();
  }
}

TEST_F(DisaggregatedTransformWire, ADecodeWorkerWithAnotherCalibrationRefusesByName) {
  const std::string other =
      Calibrate(path_, 2000, testing::TempDir() + "/disaggregated-other.kvtc");
  for (const std::string& file : {other, std::string()}) {
    SCOPED_TRACE(file.empty() ? "no calibration" : "another calibration");
    auto d = WorkerRuntime::Create({.model_path = path_,
                                    .backend = "cpu",
                                    .threads = 1,
                                    .kv_pages = 1024,
                                    .default_preset = "sluice",
                                    .receiver = true,
                                    .kv_calibration = file},
                                   transport_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    prometheus::Registry registry;
    decode::DecodeWorker decode(**d, registry, {.name = "decode-x"});
    LocalWorkers workers(*prefill_, decode, nullptr);
    router::RequestFlow flow(workers, {});
    auto run =
        flow.Start({.request_id = 9, .prompt = prompt_, .sampling = Greedy(4), .preset = "fp16"});
    ASSERT_FALSE(run.ok());
    EXPECT_NE(run.status().message().find(file.empty() ? "no calibration" : other),
              std::string::npos)
        << run.status();
    // The reservation is freed by the refusal; the worker's gauges refresh every scheduler loop.
    for (int i = 0; i < 100 && decode.Stats().kv_pages_reserved() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(decode.Stats().kv_pages_reserved(), 0);
  }
}

TEST_F(Disaggregated, ADrainIsUndone) {
  rpc::ReserveRequest reserve;
  reserve.set_prompt_tokens(16);
  reserve.set_max_tokens(4);
  decode_->Drain();
  EXPECT_EQ(decode_->Reserve(reserve).status().code(), absl::StatusCode::kUnavailable);
  prefill_->Drain();
  rpc::PrefillRequest pre;
  pre.add_prompt(1);
  EXPECT_EQ(prefill_->Prefill(pre).status().code(), absl::StatusCode::kUnavailable);
  decode_->Drain(false);
  prefill_->Drain(false);
  auto r = decode_->Reserve(reserve);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(decode_->Release(r->reservation_id()).ok());
  auto run = Start("", Greedy(4));
  ASSERT_TRUE(run.ok()) << run.status();
  std::string reason;
  Drain(*(*run)->stream, &reason);
  run->reset();
  ExpectNothingHeld();
}

TEST_F(Disaggregated, BadRequestsNameTheProblem) {
  rpc::ReserveRequest reserve;
  reserve.set_prompt_tokens(100);
  reserve.set_max_tokens(10);
  reserve.mutable_compression()->set_preset("no-such-preset");
  EXPECT_EQ(decode_->Reserve(reserve).status().code(), absl::StatusCode::kNotFound);
  reserve.mutable_compression()->set_preset("");
  reserve.set_prompt_tokens(100000);
  EXPECT_EQ(decode_->Reserve(reserve).status().code(), absl::StatusCode::kOutOfRange);
  rpc::PrefillRequest pre;
  pre.add_prompt(1 << 30);
  pre.set_pages(1);
  pre.set_page_bytes(1);
  pre.set_state_bytes(1);
  auto r = prefill_->Prefill(pre);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("vocabulary"), std::string::npos);
  // A sampler may skip the draws a migrated request made, up to a bound.
  pre.set_prompt(0, 1);
  *pre.mutable_sampling() = Greedy(4);
  for (int skip : {-1, (1 << 20) + 1}) {
    pre.mutable_sampling()->set_skip_samples(skip);
    r = prefill_->Prefill(pre);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << skip;
    EXPECT_NE(std::string(r.status().message()).find("skip_samples"), std::string::npos);
  }
  ExpectNothingHeld();
}

}  // namespace
}  // namespace sluice
