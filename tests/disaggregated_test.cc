// A prefill worker and a decode worker in one process, joined by the loopback transport, on the
// real model: generation split across them gives exactly the tokens one process gives with the
// same preset; reservations expire, cancellation and damaged pages free everything.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/worker_runtime.h"
#include "decode/decode_worker.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/kv_preset.h"
#include "kvstore/paged_kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "prefill/prefill_worker.h"
#include "transport/transport.h"

namespace sluice {
namespace {

class Disaggregated : public testing::Test {
 protected:
  void SetUp() override {
    path_ = model::DefaultModelPath();
    if (!std::filesystem::exists(path_)) GTEST_SKIP() << "no model at " << path_;
    transport_ = transport::CreateLoopbackTransport();
    auto p = WorkerRuntime::Create({.model_path = path_,
                                    .threads = 1,
                                    .kv_pages = 4096,
                                    .default_preset = "sluice",
                                    .max_presets = 8},
                                   transport_.get());
    ASSERT_TRUE(p.ok()) << p.status();
    auto d = WorkerRuntime::Create({.model_path = path_,
                                    .threads = 1,
                                    .kv_pages = 4096,
                                    .default_preset = "sluice",
                                    .max_presets = 8,
                                    .expose_pools = true},
                                   transport_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    prefill_rt_ = *std::move(p);
    decode_rt_ = *std::move(d);
    prefill_ = std::make_unique<prefill::PrefillWorker>(*prefill_rt_, *transport_, registry_,
                                                        prefill::PrefillWorkerOptions{});
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

  // Reserve on decode, prefill into the reservation; the generate request that follows.
  absl::StatusOr<rpc::GenerateRequest> PrefillFor(const std::string& preset,
                                                  const rpc::SamplingParams& sampling) {
    rpc::ReserveRequest reserve;
    reserve.mutable_compression()->set_preset(preset);
    reserve.set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
    reserve.set_max_tokens(sampling.max_tokens());
    auto reserved = decode_->Reserve(reserve);
    if (!reserved.ok()) return reserved.status();
    rpc::PrefillRequest pre;
    pre.mutable_prompt()->Add(prompt_.begin(), prompt_.end());
    *pre.mutable_sampling() = sampling;
    pre.mutable_compression()->set_preset(preset);
    pre.set_decode_worker("decode-0");
    pre.set_region(reserved->region());
    *pre.mutable_page_ids() = reserved->page_ids();
    pre.set_page_bytes(reserved->page_bytes());
    auto prefilled = prefill_->Prefill(pre);
    if (!prefilled.ok()) return prefilled.status();
    rpc::GenerateRequest gen;
    gen.set_reservation_id(reserved->reservation_id());
    gen.mutable_prompt()->Add(prompt_.begin(), prompt_.end());
    *gen.mutable_sampling() = sampling;
    gen.mutable_compression()->set_preset(preset);
    gen.set_kv_state(prefilled->kv_state());
    *gen.mutable_first() = prefilled->first();
    return gen;
  }

  // Every token of a stream until it ends.
  static std::vector<int32_t> Drain(decode::TokenStream& stream, std::string* reason) {
    std::vector<int32_t> out;
    for (;;) {
      std::vector<rpc::GeneratedToken> tokens;
      absl::Status error;
      const bool done = stream.Take(&tokens, reason, &error, absl::Milliseconds(100));
      for (const auto& t : tokens) out.push_back(t.token());
      if (done) return out;
    }
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

  void ExpectNothingHeld() {
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
  }

  std::string path_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<WorkerRuntime> prefill_rt_, decode_rt_;
  prometheus::Registry registry_;
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::vector<int32_t> prompt_;
  int32_t eos_ = 0;
};

TEST_F(Disaggregated, SplitGenerationGivesTheSameTokensAsOneProcess) {
  for (const char* preset : {"fp16", "sluice", "kvcomp", "leankv-k8v4", "h2o", "snapkv"}) {
    SCOPED_TRACE(preset);
    auto gen = PrefillFor(preset, Greedy(12));
    ASSERT_TRUE(gen.ok()) << gen.status();
    auto stream = decode_->Generate(*gen);
    ASSERT_TRUE(stream.ok()) << stream.status();
    std::string reason;
    std::vector<int32_t> got = {gen->first().token()};
    for (int32_t t : Drain(**stream, &reason)) got.push_back(t);
    EXPECT_EQ(got, Local(preset, 12));
    // Presets without eviction send each layer's pages while the next layers compute.
    const std::string p = preset;
    if (p == "fp16" || p == "sluice")
      EXPECT_GT(Counter("sluice_kv_transfer_streamed_pages_total"), 0);
    EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
    ExpectNothingHeld();
  }
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
  EXPECT_GT(r->page_ids_size(), 0);
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
  auto gen = PrefillFor("", Greedy(400, /*stop_at_eos=*/false));
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto stream = decode_->Generate(*gen);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_GT(decode_->Stats().kv_pages_used() + 1, 0);
  std::vector<rpc::GeneratedToken> tokens;
  std::string reason;
  absl::Status error;
  while (tokens.size() < 3) (*stream)->Take(&tokens, &reason, &error, absl::Milliseconds(50));
  decode_->Cancel(*stream);
  std::vector<int32_t> rest = Drain(**stream, &reason);
  EXPECT_EQ(reason, "abort");
  EXPECT_LT(tokens.size() + rest.size(), 400u);
  ExpectNothingHeld();
}

TEST_F(Disaggregated, DamagedPagesAreRefusedAndFreed) {
  auto gen = PrefillFor("int8", Greedy(8));
  ASSERT_TRUE(gen.ok()) << gen.status();
  // A bit flips in the first page that landed in the decode worker's pool.
  kvstore::PagedKvCache& cache = *decode_rt_->caches().at("int8").cache;
  for (kvstore::PageId id = 0; id < cache.pool().num_pages(); ++id) {
    if (cache.pool().refcount(id) > 0) {
      cache.mutable_pool().data(id)[77] ^= 0x40;
      break;
    }
  }
  auto stream = decode_->Generate(*gen);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kDataLoss) << stream.status();
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
  pre.add_page_ids(0);
  auto r = prefill_->Prefill(pre);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("vocabulary"), std::string::npos);
  ExpectNothingHeld();
}

}  // namespace
}  // namespace sluice
