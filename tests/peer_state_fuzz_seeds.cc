// Writes the seed corpus of peer_state_fuzz into the directory named by argv[1] (the input
// format is in peer_state_fuzz.cc): the KV state and pages of a prompt exported by caches of
// every kind of preset (plain, grouped codes, Huffman-coded, evicting, two tiers), and request
// messages of every kind a decode or prefill worker takes.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/ref_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "proto/sluice.pb.h"

namespace sluice {
namespace {

constexpr int32_t kLayers = 2, kKvHeads = 1, kHeads = 2, kHeadDim = 32;

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// The exported state and pages of a prompt of `tokens` tokens (1 + each of `steps` decode
// steps), or "" when the preset does not fit pages of `page_bytes`.
std::string Export(kernels::Backend& backend, const std::string& spec, int32_t page_bytes,
                   int64_t tokens, int steps) {
  auto preset = kvstore::FindKvPreset(spec, kHeadDim, page_bytes);
  if (!preset.ok()) return "";
  auto cache = kvstore::PagedKvCache::Create({.layers = kLayers,
                                              .heads = kHeads,
                                              .kv_heads = kKvHeads,
                                              .head_dim = kHeadDim,
                                              .preset = *preset,
                                              .pages = 256},
                                             backend);
  if (!cache.ok() || !(*cache)->AddSequence(1, tokens + steps).ok()) return "";
  std::mt19937 rng(static_cast<uint32_t>(tokens));
  for (int s = 0; s <= steps; ++s) {
    const int64_t n = s == 0 ? tokens : 1;
    if (!(*cache)->BeginStep({{.seq = 1, .tokens = n}}).ok()) return "";
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float> k = Random(rng, n * kKvHeads * kHeadDim);
      const std::vector<float> v = Random(rng, n * kKvHeads * kHeadDim);
      const std::vector<float> q = Random(rng, n * kHeads * kHeadDim);
      std::vector<float> out(n * kHeads * kHeadDim);
      if (!(*cache)->Write(l, k.data(), v.data()).ok() ||
          !(*cache)->Attend(l, q.data(), out.data()).ok() || !(*cache)->LayerDone(l).ok()) {
        return "";
      }
    }
    if (!(*cache)->Commit().ok()) return "";
  }
  auto ex = (*cache)->ExportSequence(1);
  if (!ex.ok() || ex->state.size() > 0xFFFF) return "";
  std::string out;
  out.push_back(0);
  out.push_back(static_cast<char>(ex->state.size() & 0xFF));
  out.push_back(static_cast<char>(ex->state.size() >> 8));
  out += ex->state;
  for (kvstore::PageId id : ex->pages) {
    out.append(reinterpret_cast<const char*>((*cache)->pool().data(id)), page_bytes);
  }
  return out;
}

rpc::SamplingParams Sampling(float temperature, int top_k, float top_p, float min_p) {
  rpc::SamplingParams s;
  s.set_temperature(temperature);
  s.set_top_k(top_k);
  s.set_top_p(top_p);
  s.set_min_p(min_p);
  s.set_repetition_penalty(1.2f);
  s.set_seed(42);
  s.set_max_tokens(16);
  s.add_stop_token_ids(2);
  s.set_logprobs(true);
  s.set_top_logprobs(3);
  return s;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  using namespace sluice;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::string> seeds;
  kernels::RefBackend backend;
  const char* presets[] = {"fp16:residual=8",    "int8:residual=8",        "kivi4:residual=16",
                           "kvcomp:residual=16", "sinks:residual=8",       "h2o:residual=8",
                           "snapkv:residual=8",  "leankv-k8v4:residual=8", "minikv:residual=16"};
  for (const char* spec : presets) {
    for (int32_t page_bytes : {1024, 4096}) {
      std::string seed = Export(backend, spec, page_bytes, 56, 2);
      if (seed.empty()) continue;
      seeds.push_back(seed);
      seed[0] = 1;  // the same with the CRC32Cs made right by the fuzzer
      seeds.push_back(seed);
      break;
    }
  }
  if (seeds.size() < 2 * std::size(presets)) {
    std::fprintf(stderr, "peer_state seeds: %zu of %zu presets exported\n", seeds.size() / 2,
                 std::size(presets));
    return 1;
  }

  auto add = [&](char kind, const google::protobuf::MessageLite& m) {
    seeds.push_back(std::string(1, kind) + m.SerializeAsString());
  };
  rpc::ReserveRequest reserve;
  reserve.set_request_id(1);
  reserve.mutable_compression()->set_preset("leankv-k8v4:alpha_high=2");
  reserve.set_prompt_tokens(300);
  reserve.set_max_tokens(100);
  add(2, reserve);
  rpc::PrefillRequest prefill;
  prefill.set_request_id(1);
  for (int t : {1, 5, 9, 9, 47}) prefill.add_prompt(t);
  *prefill.mutable_sampling() = Sampling(0.7f, 40, 0.9f, 0.05f);
  prefill.mutable_compression()->set_preset("kivi2");
  prefill.set_decode_worker("localhost:50200");
  prefill.set_region("region bytes");
  prefill.set_page_bytes(16384);
  add(3, prefill);
  rpc::GenerateRequest generate;
  generate.set_request_id(1);
  generate.set_reservation_id(99);
  for (int t : {3, 3, -1, 100}) generate.add_prompt(t);
  *generate.mutable_sampling() = Sampling(0.f, 0, 1.f, 0.f);
  generate.mutable_compression()->set_preset("kvcomp:residual=64");
  generate.mutable_first()->set_token(5);
  generate.set_state_bytes(1234);
  generate.set_state_crc32c(0xDEADBEEF);
  add(4, generate);
  rpc::RenewRequest renew;
  renew.set_reservation_id(99);
  add(5, renew);
  rpc::ReleaseRequest release;
  release.set_reservation_id(99);
  add(6, release);
  add(7, rpc::DrainRequest());

  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary) << seeds[i];
  }
  return 0;
}
