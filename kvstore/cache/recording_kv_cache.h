// A KvCache decorator that keeps an fp32 copy of every key and value row the model writes, per
// layer, and (when asked) of every query row it attends with, and forwards everything to the
// cache it wraps. For measuring and calibrating codecs on real KV (tests, the kvstore benchmark,
// the wire's calibration); it records every Write, so it suits one sequence at a time.
#ifndef SLUICE_KVSTORE_CACHE_RECORDING_KV_CACHE_H_
#define SLUICE_KVSTORE_CACHE_RECORDING_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/kv_cache.h"

namespace sluice::kvstore {

class RecordingKvCache final : public model::KvCache {
 public:
  // row = kv_heads * head_dim floats per token; q_row = heads * head_dim, or 0 to keep no
  // queries.
  RecordingKvCache(std::unique_ptr<model::KvCache> inner, int layers, int64_t row,
                   int64_t q_row = 0)
      : inner_(std::move(inner)), k_(layers), v_(layers), q_(layers), row_(row), q_row_(q_row) {}

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override {
    return inner_->AddSequence(seq, max_tokens);
  }
  absl::Status RemoveSequence(int64_t seq) override { return inner_->RemoveSequence(seq); }
  absl::StatusOr<int64_t> Length(int64_t seq) const override { return inner_->Length(seq); }
  absl::Status BeginStep(absl::Span<const model::StepEntry> batch) override {
    rows_ = 0;
    for (const model::StepEntry& e : batch) rows_ += e.tokens;
    return inner_->BeginStep(batch);
  }
  absl::Status Write(int layer, const float* k, const float* v) override {
    k_[layer].insert(k_[layer].end(), k, k + rows_ * row_);
    v_[layer].insert(v_[layer].end(), v, v + rows_ * row_);
    return inner_->Write(layer, k, v);
  }
  absl::Status Attend(int layer, const float* q, float* out) override {
    if (q_row_ > 0) q_[layer].insert(q_[layer].end(), q, q + rows_ * q_row_);
    return inner_->Attend(layer, q, out);
  }
  absl::Status LayerDone(int layer) override { return inner_->LayerDone(layer); }
  absl::Status Commit() override { return inner_->Commit(); }
  void AbortStep() override { inner_->AbortStep(); }

  // Every row written to `layer`: [tokens, kv_heads, head_dim].
  const std::vector<float>& k(int layer) const { return k_[layer]; }
  const std::vector<float>& v(int layer) const { return v_[layer]; }
  // Every query row `layer` attended with (after RoPE), when kept: [tokens, heads, head_dim].
  const std::vector<float>& q(int layer) const { return q_[layer]; }

 private:
  std::unique_ptr<model::KvCache> inner_;
  std::vector<std::vector<float>> k_, v_, q_;
  const int64_t row_, q_row_;
  int64_t rows_ = 0;  // the open step's
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_CACHE_RECORDING_KV_CACHE_H_
