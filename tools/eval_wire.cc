#include "tools/eval_wire.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/ggml_quant.h"
#include "kvstore/wire/kv_transform_calibration.h"

namespace sluice::tools {

absl::Status TransformWireKvCache::BeginStep(absl::Span<const model::StepEntry> batch) {
  step_.clear();
  prev_k_.clear();
  prev_v_.clear();
  rows_ = 0;
  for (const model::StepEntry& e : batch) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t start, inner_->Length(e.seq));
    step_.push_back({.tokens = e.tokens, .start = start});
    rows_ += e.tokens;
  }
  return inner_->BeginStep(batch);
}

absl::Status TransformWireKvCache::CodeRows(int layer, bool keys, const Entry& e, float* rows,
                                            const float* prev, float* decoded) {
  const int64_t dim = o_.model.kv_heads * o_.model.head_dim;
  const int64_t lo = std::clamp<int64_t>(o_.sinks - e.start, 0, e.tokens);
  const int64_t hi = std::max<int64_t>(lo, e.tokens - o_.window);
  // Exact rows cross as fp16.
  for (int64_t t = 0; t < e.tokens; ++t) {
    if (t >= lo && t < hi) continue;
    for (int64_t j = 0; j < dim; ++j) {
      float& x = rows[t * dim + j];
      x = kernels::Fp16ToFloat(kernels::FloatToFp16(x));
    }
  }
  wire_bytes_ += (e.tokens - (hi - lo)) * dim * 2;
  fp16_bytes_ += e.tokens * dim * 2;
  // What the decode side holds of every row, keys without RoPE: the next layer's prediction
  // starts from it.
  std::copy(rows, rows + e.tokens * dim, decoded);
  if (keys) kvstore::RotateKeyRows(o_.model, decoded, e.tokens, e.start, /*inverse=*/true);
  if (hi == lo) return absl::OkStatus();
  float* coded = decoded + lo * dim;
  const int64_t n = hi - lo;
  const std::vector<float>* predict = nullptr;
  if (prev != nullptr) {
    const auto& table = keys ? o_.calibration->k_predict : o_.calibration->v_predict;
    if (layer < static_cast<int>(table.size()) && !table[layer].empty()) predict = &table[layer];
  }
  if (predict) kvstore::ApplyKvPrediction(*predict, prev + lo * dim, coded, n, dim, false);
  const kvstore::KvTransformBasis& basis =
      keys ? o_.calibration->k[layer] : o_.calibration->v[layer];
  SLUICE_ASSIGN_OR_RETURN(
      const std::string block,
      kvstore::EncodeKvTransformBlock(basis, coded, n, keys ? o_.key_bits : o_.value_bits));
  SLUICE_RETURN_IF_ERROR(kvstore::DecodeKvTransformBlock(basis, block, coded, n));
  wire_bytes_ += static_cast<int64_t>(block.size());
  if (predict) kvstore::ApplyKvPrediction(*predict, prev + lo * dim, coded, n, dim, true);
  float* out = rows + lo * dim;
  std::copy(coded, coded + n * dim, out);
  if (keys) kvstore::RotateKeyRows(o_.model, out, n, e.start + lo, /*inverse=*/false);
  return absl::OkStatus();
}

absl::Status TransformWireKvCache::Write(int layer, const float* k, const float* v) {
  const bool prompt =
      std::any_of(step_.begin(), step_.end(), [](const Entry& e) { return e.tokens > 1; });
  if (!prompt) return inner_->Write(layer, k, v);
  if (layer < 0 || layer >= static_cast<int>(o_.calibration->k.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer %d outside the calibration's %d layers", layer, o_.calibration->k.size()));
  }
  const int64_t dim = o_.model.kv_heads * o_.model.head_dim;
  k_.assign(k, k + rows_ * dim);
  v_.assign(v, v + rows_ * dim);
  // The previous layer's decoded rows hold for this step only; layer 0 has none.
  const bool have_prev = layer > 0 && static_cast<int64_t>(prev_k_.size()) == rows_ * dim;
  cur_k_.resize(rows_ * dim);
  cur_v_.resize(rows_ * dim);
  int64_t row = 0;
  for (const Entry& e : step_) {
    if (e.tokens > 1) {
      const size_t at = row * dim;
      SLUICE_RETURN_IF_ERROR(CodeRows(layer, true, e, k_.data() + at,
                                      have_prev ? prev_k_.data() + at : nullptr,
                                      cur_k_.data() + at));
      SLUICE_RETURN_IF_ERROR(CodeRows(layer, false, e, v_.data() + at,
                                      have_prev ? prev_v_.data() + at : nullptr,
                                      cur_v_.data() + at));
    }
    row += e.tokens;
  }
  prev_k_.swap(cur_k_);
  prev_v_.swap(cur_v_);
  return inner_->Write(layer, k_.data(), v_.data());
}

}  // namespace sluice::tools
