// The prefill-to-decode wire inside `sluice eval`: a prompt's keys and values go through the
// transform codec (kvstore/wire/kv_transform.h) before the decode side's cache holds them, as
// they would between a prefill and a decode worker, and the bytes the wire would carry are
// counted.
#ifndef SLUICE_TOOLS_EVAL_WIRE_H_
#define SLUICE_TOOLS_EVAL_WIRE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kvstore/wire/kv_transform.h"
#include "model/kv_cache.h"
#include "model/llama.h"

namespace sluice::tools {

// A KvCache decorator: the rows a prompt step writes (an entry of more than one token) reach the
// cache it wraps after a round trip through the codec, layer by layer: keys without RoPE, coded
// in the layer's key basis, RoPE put back; values in the value basis. The first `sinks` tokens of
// a sequence and its last `window` prompt tokens cross exact (fp16). Decode steps pass through.
class TransformWireKvCache final : public model::KvCache {
 public:
  struct Options {
    const kvstore::KvTransformCalibration* calibration = nullptr;
    double key_bits = 2, value_bits = 2;  // code bits per value, before entropy coding
    int64_t sinks = 4;
    int64_t window = 32;
    model::LlamaConfig model;  // shapes and RoPE
  };
  TransformWireKvCache(std::unique_ptr<model::KvCache> inner, const Options& options)
      : inner_(std::move(inner)), o_(options) {}

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override {
    return inner_->AddSequence(seq, max_tokens);
  }
  absl::Status RemoveSequence(int64_t seq) override { return inner_->RemoveSequence(seq); }
  absl::StatusOr<int64_t> Length(int64_t seq) const override { return inner_->Length(seq); }
  absl::Status BeginStep(absl::Span<const model::StepEntry> batch) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float* out) override {
    return inner_->Attend(layer, q, out);
  }
  absl::Status LayerDone(int layer) override { return inner_->LayerDone(layer); }
  absl::Status Commit() override { return inner_->Commit(); }
  void AbortStep() override { inner_->AbortStep(); }

  model::KvCache& inner() { return *inner_; }
  // Bytes the wire carried for the prompts so far, and the same KV as fp16.
  int64_t wire_bytes() const { return wire_bytes_; }
  int64_t fp16_bytes() const { return fp16_bytes_; }

 private:
  struct Entry {
    int64_t tokens = 0, start = 0;  // rows of the step; position of the first
  };
  // Codes one entry's rows of a layer in place (keys with RoPE, as written); `decoded` gets what
  // the decode side holds of them (keys without RoPE); `prev` is the previous layer's, or null.
  absl::Status CodeRows(int layer, bool keys, const Entry& e, float* rows, const float* prev,
                        float* decoded);

  std::unique_ptr<model::KvCache> inner_;
  const Options o_;
  std::vector<Entry> step_;
  int64_t rows_ = 0;
  std::vector<float> k_, v_;
  std::vector<float> prev_k_, prev_v_, cur_k_, cur_v_;  // decoded rows [rows_, dim] by layer
  int64_t wire_bytes_ = 0, fp16_bytes_ = 0;
};

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_EVAL_WIRE_H_
