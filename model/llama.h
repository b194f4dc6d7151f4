// The Llama-family forward pass (Llama, Mistral, Qwen2-style, SmolLM) over GGUF weights:
// embedding, RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, (tied) output head.
//
// Weights stay in their GGUF storage types and are dequantized inside the matmul kernels;
// arithmetic is fp32. One Forward call runs a batch of sequences, each contributing any number
// of new tokens (a prompt chunk or one decode token), so prefill and decode share one path.
// Activations live in the backend's memory (device memory on CUDA, where the weights are
// uploaded once at load); only the token ids and positions go in and the logits come out.
#ifndef SLUICE_MODEL_LLAMA_H_
#define SLUICE_MODEL_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"
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

// What a forward pass runs, for the algorithms of its matmuls (kernels::MatmulRows): prompts'
// tokens (kPrompt) or a token per sequence (kDecode); kAuto: kPrompt when an entry has more
// than one token. On the host backends a sequence's logits and KV are then the same bits
// whatever else its pass holds, for passes of one kind.
enum class StepKind : uint8_t { kAuto, kDecode, kPrompt };

struct LlamaLoadOptions {
  // On a device backend: the weight matrices go to device memory as bf16 (expanded from their
  // GGUF types once, here) and every matmul runs on the matrix units with bf16 operands and
  // fp32 accumulation (MatmulPrecision::kBf16), as vLLM and SGLang serve. Off: they keep their
  // GGUF types and each matmul expands them to fp32 (exact, slower). Host backends keep the
  // GGUF types and fp32 arithmetic either way.
  bool bf16_on_device = true;
  // On a backend that records ops (CUDA graphs): the dense ops between a step's KV cache calls
  // (embedding, norms, projections, RoPE, the feed-forward) are recorded once per layer and row
  // count, for steps of at most kMaxRecordedRows rows, and replayed as one launch each; the
  // cache's writes and attention stay as they are. As vLLM captures its decode graphs per batch
  // size. Off: every op is launched one by one.
  bool record_steps = true;
};

class LlamaModel {
 public:
  // The most rows (new tokens over the batch) a step may have for its ops to be recorded: decode
  // steps of small batches, where launches cost more than the work.
  static constexpr int64_t kMaxRecordedRows = 16;

  // `gguf` must outlive the model on host backends (weights point into its mapping); on a
  // device backend the weights are copied to device memory here.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const GgufFile& gguf,
                                                          kernels::Backend& backend,
                                                          const LlamaLoadOptions& options = {});

  const LlamaConfig& config() const { return config_; }
  // How many step segments are recorded now (LlamaLoadOptions::record_steps), over all row counts.
  int64_t recorded_segments() const;

  // Runs the new tokens of every entry, appends their K/V to `cache` (a cache on the same
  // backend), and writes the logits of each entry's last token to logits [batch.size(), vocab],
  // host memory.
  absl::Status Forward(absl::Span<const ForwardEntry> batch, KvCache& cache, float* logits,
                       StepKind kind = StepKind::kAuto);

 private:
  struct Weight {
    const void* data = nullptr;
    kernels::GgmlType type = kernels::GgmlType::kF32;
    size_t bytes = 0;
    int64_t rows = 0, cols = 0;  // [rows, cols], a row per output
  };
  struct Layer {
    const float* attn_norm = nullptr;  // [hidden]
    const float* ffn_norm = nullptr;   // [hidden]
    Weight q, k, v, o, gate, up, down;
  };

  // The step's activations in the backend's memory, grown to the largest step and kept.
  struct Scratch {
    int64_t rows = 0, batch = 0;                          // what the buffers hold
    kernels::DeviceBuffer x, h, q, k, v, attn, gate, up;  // [rows, ...]
    kernels::DeviceBuffer tokens;        // [2, rows]: the token ids, then their positions
    kernels::DeviceBuffer last, logits;  // [batch, hidden], [batch, vocab]
  };

  LlamaModel(LlamaConfig config, kernels::Backend& backend)
      : config_(std::move(config)), backend_(backend) {}

  // Copies every weight into one device buffer (matrices as bf16 with `bf16`) and points the
  // model at it there.
  absl::Status UploadWeights(bool bf16);
  absl::Status EnsureScratch(int64_t rows, int64_t batch);
  absl::Status Matmul(const float* x, const Weight& w, float* y, int64_t m, int64_t n, int64_t k,
                      kernels::MatmulRows rows, bool accumulate = false);
  // Runs segment `index` of a step of `rows` rows (0: up to layer 0's attention; l + 1: layer
  // l's feed-forward and layer l + 1's attention input): replays its recording, recording it
  // first, where the step's ops are recorded (record_steps_), and issues the ops otherwise.
  absl::Status Segment(int64_t rows, int index, absl::FunctionRef<absl::Status()> ops);
  // Forward's pass once the cache's step is open; `lengths` are the entries' committed tokens.
  absl::Status RunStep(absl::Span<const ForwardEntry> batch, absl::Span<const int64_t> lengths,
                       StepKind kind, KvCache& cache, float* logits);

  LlamaConfig config_;
  kernels::Backend& backend_;
  Weight token_embd_;
  Weight output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  // Norm weights converted to fp32 when the file stores them otherwise.
  std::vector<std::vector<float>> owned_norms_;
  // On a device backend: every weight, uploaded at load.
  kernels::DeviceBuffer device_weights_;
  kernels::MatmulPrecision precision_ = kernels::MatmulPrecision::kFp32;
  Scratch scratch_;
  // Recorded segments by step row count, layers + 1 each (null: not yet recorded). They name the
  // scratch buffers, so growing those drops them. Row counts whose ops cannot be recorded (a
  // matmul through cuBLAS's workspace) run unrecorded.
  bool record_steps_ = false;
  absl::flat_hash_map<int64_t, std::vector<std::unique_ptr<kernels::Backend::Recording>>>
      recordings_;
  absl::flat_hash_set<int64_t> unrecordable_rows_;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_LLAMA_H_
