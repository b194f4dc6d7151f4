// What a prefill or decode worker process holds: the model on its backend (the CPU, or a GPU
// with --backend=cuda|auto), its tokenizer's stop tokens, and one compressed KV cache per preset
// it has been asked for, each with its own page pool. A sender's pools are registered with the
// transport as put sources; a pool in device memory reaches the transport through a host copy of
// the same layout (the transport has no CUDA memory type yet), which pages go to before a put.
// A receiver's pools are never exposed: each reservation receives through a window of its own
// (ReceiveWindow), whose pages the receiver moves into its pool once they are checked.
//
// Not thread-safe: the worker's scheduler thread owns it (model, caches and pools alike).
#ifndef SLUICE_COMMON_WORKER_RUNTIME_H_
#define SLUICE_COMMON_WORKER_RUNTIME_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "kvstore/wire/wire_encoding_kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/sluice.pb.h"
#include "transport/transport.h"

namespace sluice {

struct WorkerRuntimeOptions {
  std::string model_path;       // GGUF
  std::string backend = "cpu";  // kernels::CreateNamedBackend: auto, cpu, cuda or ref
  int device = 0;               // the GPU, for cuda and auto
  // On CUDA: a small step's dense ops replayed as graphs (LlamaLoadOptions::record_steps); off,
  // every op is launched one by one (vLLM's --enforce-eager).
  bool record_steps = true;
  int threads = 0;             // CPU threads; 0 = one per core
  int64_t kv_pages = 0;        // pages of each preset's pool
  std::string default_preset;  // for requests that name none
  int max_presets = 4;         // caches alive at once
  // Decode workers: peers write into per-reservation windows (ReceiveWindow), never into a
  // pool. Otherwise the pools are registered as put sources.
  bool receiver = false;
  // Senders: a host copy between each pool and the transport even when the pool is host
  // memory: the path a device pool takes, checkable without a GPU (tests).
  bool stage_pools = false;
  // The transform-coded wire (kvstore/wire/kv_wire_codec.h): the calibration file both ends
  // load ("" = none; `./sluice calibrate` writes it beside the model). A sender with
  // `wire_bits` ("K/V" entropy-coded bits per value; "" = pages) codes the prompts of presets that
  // keep every token with it; a receiver decodes whatever arrives coded with the same file.
  std::string kv_calibration;
  std::string wire_bits;
};

// A worker's sluice_kv_pool_resident_bytes gauge (WorkerRuntime::PoolResidentBytes), registered
// in `registry`.
prometheus::Gauge& PoolResidentGauge(prometheus::Registry& registry);

class WorkerRuntime {
 public:
  // Loads the model; InvalidArgument / NotFound naming the file when it cannot.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(const WorkerRuntimeOptions& options,
                                                               transport::Transport* transport);

  model::LlamaModel& model() { return *model_; }
  // The backend's name as it reports it ("cpu (avx512, 8 threads)", "cuda (NVIDIA H100 ...)").
  std::string backend_name() const { return backend_->name(); }
  const model::LlamaConfig& config() const { return model_->config(); }
  const std::string& model_name() const { return model_name_; }
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }

  struct Cache {
    std::unique_ptr<kvstore::PagedKvCache> cache;
    // Senders: where the transport reads the pool's pages, page id i at i * page_bytes: the
    // pool itself, or a host copy of it (`staged`: the pool is device memory, or stage_pools)
    // held in `owned_copy`. Receivers: nullptr.
    uint8_t* transport_pages = nullptr;
    std::unique_ptr<uint8_t[]> owned_copy;
    bool staged = false;

    const uint8_t* TransportPage(kvstore::PageId id) const {
      return transport_pages + static_cast<size_t>(id) * cache->pool().page_bytes();
    }
    // Senders with a transform-coded wire, for presets that keep every token: the cache the
    // model runs on, which codes the prompts it is told to (kvstore/wire/
    // wire_encoding_kv_cache.h); null otherwise (pages cross).
    std::unique_ptr<kvstore::WireEncodingKvCache> wire;
    model::KvCache& model_cache() const {
      return wire ? static_cast<model::KvCache&>(*wire) : *cache;
    }
    // Pages to the transport's copy before they are put (nothing when unstaged).
    absl::Status ToTransport(absl::Span<const kvstore::PageId> ids) const {
      return staged ? cache->CopyPagesToHost(ids, transport_pages) : absl::OkStatus();
    }
  };
  // Memory of `bytes` bytes that peers may put into, for one reservation; unexposed (and freed)
  // when the region is destroyed. FailedPrecondition without a transport.
  absl::StatusOr<std::unique_ptr<transport::ExposedRegion>> ReceiveWindow(size_t bytes);
  // "ucx", "loopback", or "" without a transport.
  std::string transport_name() const {
    return transport_ == nullptr ? "" : std::string(transport_->name());
  }
  // The cache of `spec` (the default preset when empty), made on first use: NotFound /
  // InvalidArgument for a bad spec, ResourceExhausted beyond max_presets caches.
  absl::StatusOr<Cache*> CacheFor(const std::string& spec);
  // Bytes of host memory behind the KV pools and their transport copies that are backed now:
  // each is allocated at its full size and grows in the RSS as its pages are first used (a pool
  // in device memory counts 0). A page-table walk: walked again at most once a second, so the
  // workers may ask on every turn of their loops.
  int64_t PoolResidentBytes();
  // Every cache made so far, by preset name.
  const std::map<std::string, Cache>& caches() const { return caches_; }
  std::map<std::string, Cache>& caches() { return caches_; }
  // The transform-coded wire's calibration (null without --kv_calibration), its checksum and
  // file, and a sender's code bits (key 0: pages cross).
  const kvstore::KvTransformCalibration* kv_calibration() const {
    return kv_calibration_ ? &*kv_calibration_ : nullptr;
  }
  uint32_t kv_calibration_checksum() const { return kv_calibration_checksum_; }
  const std::string& kv_calibration_path() const { return options_.kv_calibration; }
  kvstore::KvWireBits wire_bits() const { return wire_bits_; }
  // The preset name `spec` resolves to (the default preset for an empty one).
  std::string PresetName(const std::string& spec) const {
    return spec.empty() ? options_.default_preset : spec;
  }

 private:
  WorkerRuntime(WorkerRuntimeOptions options, transport::Transport* transport)
      : options_(std::move(options)), transport_(transport) {}

  WorkerRuntimeOptions options_;
  transport::Transport* transport_;
  std::unique_ptr<model::GgufFile> gguf_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::LlamaModel> model_;
  std::string model_name_;
  std::vector<int32_t> stop_tokens_;
  std::map<std::string, Cache> caches_;
  int64_t pool_resident_ = 0;  // PoolResidentBytes as last walked, at pool_resident_at_
  absl::Time pool_resident_at_ = absl::InfinitePast();
  std::optional<kvstore::KvTransformCalibration> kv_calibration_;
  uint32_t kv_calibration_checksum_ = 0;
  kvstore::KvWireBits wire_bits_;
};

// The logprob of `token` under logits [vocab] (log-softmax of the raw logits) and, when
// `top` > 0, the `top` most likely tokens with theirs.
rpc::GeneratedToken TokenWithLogprobs(absl::Span<const float> logits, int32_t token, int top);

}  // namespace sluice

#endif  // SLUICE_COMMON_WORKER_RUNTIME_H_
