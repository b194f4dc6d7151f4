// The Llama-family forward pass (Llama, Mistral, Qwen2-style, SmolLM) over GGUF weights:
// embedding, RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, (tied) output head.
//
// Weights stay in their GGUF storage types and are dequantized inside the matmul kernels;
// arithmetic is fp32. One Forward call runs a batch of sequences, each contributing any number
// of new tokens (a prompt chunk or one decode token), so prefill and decode share one path.
#ifndef SLUICE_MODEL_LLAMA_H_
#define SLUICE_MODEL_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "model/gguf.h"
#include "model/kv_cache.h"

namespace sluice::model {

struct LlamaConfig {
  std::string architecture;
  int layers = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;
  float rope_theta = 10000.f;
  float rms_eps = 1e-5f;
  bool tied_output = false;

  // Reads `<arch>.*` metadata; InvalidArgument naming the key when something is missing or
  // inconsistent, Unimplemented for architectures outside the Llama family.
  static absl::StatusOr<LlamaConfig> FromGguf(const GgufFile& gguf);
};

struct ForwardEntry {
  int64_t seq = 0;                   // a live sequence of the KvCache
  absl::Span<const int32_t> tokens;  // its new tokens, at least one
};

class LlamaModel {
 public:
  // `gguf` must outlive the model (weights point into its mapping). The backend must keep its
  // buffers in host memory (ref or cpu) until the CUDA path lands.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const GgufFile& gguf,
                                                          kernels::Backend& backend);

  const LlamaConfig& config() const { return config_; }

  // Runs the new tokens of every entry, appends their K/V to `cache`, and writes the logits of
  // each entry's last token to logits [batch.size(), vocab].
  absl::Status Forward(absl::Span<const ForwardEntry> batch, KvCache& cache, float* logits);

 private:
  struct Weight {
    const void* data = nullptr;
    kernels::GgmlType type = kernels::GgmlType::kF32;
  };
  struct Layer {
    const float* attn_norm = nullptr;  // [hidden]
    const float* ffn_norm = nullptr;   // [hidden]
    Weight q, k, v, o, gate, up, down;
  };

  LlamaModel(LlamaConfig config, kernels::Backend& backend)
      : config_(std::move(config)), backend_(backend) {}

  absl::Status Matmul(const float* x, const Weight& w, float* y, int64_t m, int64_t n, int64_t k);
  // Forward's pass once the cache's step is open; `lengths` are the entries' committed tokens.
  absl::Status RunStep(absl::Span<const ForwardEntry> batch, absl::Span<const int64_t> lengths,
                       KvCache& cache, float* logits);

  LlamaConfig config_;
  kernels::Backend& backend_;
  Weight token_embd_;
  Weight output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  // Norm weights converted to fp32 when the file stores them otherwise.
  std::vector<std::vector<float>> owned_norms_;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_LLAMA_H_
