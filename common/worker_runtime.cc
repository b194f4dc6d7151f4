#include "common/worker_runtime.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "kernels/registry.h"
#include "kvstore/kv_preset.h"
#include "model/tokenizer.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    const WorkerRuntimeOptions& options, transport::Transport* transport) {
  if (options.kv_pages <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("kv_pages=%d must be > 0", options.kv_pages));
  }
  std::unique_ptr<WorkerRuntime> rt(new WorkerRuntime(options, transport));
  SLUICE_ASSIGN_OR_RETURN(rt->gguf_, model::GgufFile::Open(options.model_path));
  SLUICE_ASSIGN_OR_RETURN(
      rt->backend_, kernels::CreateNamedBackend(options.backend, options.threads, options.device));
  SLUICE_ASSIGN_OR_RETURN(rt->model_,
                          model::LlamaModel::Load(*rt->gguf_, *rt->backend_,
                                                  {.record_steps = rt->options_.record_steps}));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*rt->gguf_));
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::Create(std::move(vocab)));
  rt->stop_tokens_ = {tokenizer->eos_id()};
  if (tokenizer->unk_id() >= 0 && tokenizer->IsSpecial(tokenizer->unk_id()) &&
      tokenizer->unk_id() != tokenizer->eos_id()) {
    rt->stop_tokens_.push_back(tokenizer->unk_id());  // <|endoftext|> ends documents
  }
  if (!options.kv_calibration.empty()) {
    SLUICE_ASSIGN_OR_RETURN(rt->kv_calibration_,
                            kvstore::ReadKvTransformCalibration(options.kv_calibration));
    const model::LlamaConfig& c = rt->model_->config();
    if (static_cast<int64_t>(rt->kv_calibration_->k.size()) != c.layers ||
        rt->kv_calibration_->k[0].dim != c.kv_heads * c.head_dim) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: a calibration of %d layers of dim %d; %s has %d layers of dim %d",
          options.kv_calibration, rt->kv_calibration_->k.size(), rt->kv_calibration_->k[0].dim,
          options.model_path, c.layers, c.kv_heads * c.head_dim));
    }
    rt->kv_calibration_checksum_ = kvstore::KvTransformCalibrationChecksum(*rt->kv_calibration_);
  }
  if (!options.wire_bits.empty()) {
    if (!rt->kv_calibration_) {
      return absl::InvalidArgumentError(
          "--wire_bits codes the wire with a calibration: give --kv_calibration FILE");
    }
    SLUICE_ASSIGN_OR_RETURN(rt->wire_bits_, kvstore::ParseKvWireBits(options.wire_bits));
  }
  // The default preset must work before the first request asks for it.
  SLUICE_RETURN_IF_ERROR(rt->CacheFor("").status());
  return rt;
}

absl::StatusOr<WorkerRuntime::Cache*> WorkerRuntime::CacheFor(const std::string& spec) {
  const std::string name = PresetName(spec);
  if (auto it = caches_.find(name); it != caches_.end()) return &it->second;
  if (static_cast<int>(caches_.size()) >= options_.max_presets) {
    std::vector<std::string> live;
    for (const auto& [n, c] : caches_) live.push_back(n);
    return absl::ResourceExhaustedError(
        absl::StrFormat("this worker already keeps %d KV presets (%s); preset '%s' is one too many",
                        caches_.size(), absl::StrJoin(live, ", "), name));
  }
  const model::LlamaConfig& c = model_->config();
  SLUICE_ASSIGN_OR_RETURN(kvstore::KvPreset preset,
                          kvstore::FindKvPreset(name, static_cast<int32_t>(c.head_dim)));
  Cache cache;
  kvstore::PagedKvCacheOptions options{.layers = c.layers,
                                       .heads = c.heads,
                                       .kv_heads = c.kv_heads,
                                       .head_dim = c.head_dim,
                                       .preset = preset,
                                       .pages = options_.kv_pages};
  const size_t bytes = static_cast<size_t>(options_.kv_pages * preset.high.page_bytes);
  SLUICE_ASSIGN_OR_RETURN(cache.cache, kvstore::PagedKvCache::Create(options, *backend_));
  if (transport_ != nullptr && !options_.receiver) {
    cache.staged = options_.stage_pools || backend_->memory_space() != kernels::MemorySpace::kHost;
    if (cache.staged) {
      cache.owned_copy.reset(new uint8_t[bytes]);  // not zeroed: pages are copied in whole
      cache.transport_pages = cache.owned_copy.get();
    } else {
      cache.transport_pages = cache.cache->mutable_pool().data(0);
    }
    SLUICE_RETURN_IF_ERROR(transport_->RegisterSource(cache.transport_pages, bytes));
  }
  if (!options_.receiver && wire_bits_.key > 0 &&
      preset.policy.kind == kvstore::KvPolicyKind::kNone) {
    cache.wire = std::make_unique<kvstore::WireEncodingKvCache>(
        cache.cache.get(), kvstore::WireEncodingKvCache::Pass::kComputed);
  }
  return &caches_.emplace(name, std::move(cache)).first->second;
}

prometheus::Gauge& PoolResidentGauge(prometheus::Registry& registry) {
  return prometheus::BuildGauge()
      .Name("sluice_kv_pool_resident_bytes")
      .Help(
          "Bytes of the KV pools and their transport copies backed by memory (each is allocated "
          "whole and grows in the RSS as its pages are first used).")
      .Register(registry)
      .Add({});
}

int64_t WorkerRuntime::PoolResidentBytes() {
  const absl::Time now = absl::Now();
  if (now - pool_resident_at_ < absl::Seconds(1)) return pool_resident_;
  pool_resident_at_ = now;
  int64_t bytes = 0;
  for (const auto& [name, c] : caches_) {
    const kvstore::PagePool& pool = c.cache->pool();
    const size_t arena = static_cast<size_t>(pool.num_pages() * pool.page_bytes());
    if (backend_->memory_space() == kernels::MemorySpace::kHost) {
      bytes += ResidentBytes(pool.data(0), arena);
    }
    if (c.owned_copy != nullptr) bytes += ResidentBytes(c.owned_copy.get(), arena);
  }
  pool_resident_ = bytes;
  return bytes;
}

absl::StatusOr<std::unique_ptr<transport::ExposedRegion>> WorkerRuntime::ReceiveWindow(
    size_t bytes) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError("this worker has no transport to receive pages through");
  }
  return transport_->AllocateAndExpose(bytes);
}

rpc::GeneratedToken TokenWithLogprobs(absl::Span<const float> logits, int32_t token, int top) {
  rpc::GeneratedToken out;
  out.set_token(token);
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  const double log_z = max + std::log(sum);
  out.set_logprob(static_cast<float>(logits[token] - log_z));
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n = std::min<size_t>(top, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 0; i < n; ++i) {
      rpc::TopLogprob* t = out.add_top();
      t->set_token(ids[i]);
      t->set_logprob(static_cast<float>(logits[ids[i]] - log_z));
    }
  }
  return out;
}

}  // namespace sluice
