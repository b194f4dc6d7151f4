// Fitting a model's transform-codec bases (kv_transform.h) on a calibration text, and the RoPE
// the codec takes off keys before coding them and puts back after.
#ifndef SLUICE_KVSTORE_WIRE_KV_TRANSFORM_CALIBRATION_H_
#define SLUICE_KVSTORE_WIRE_KV_TRANSFORM_CALIBRATION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kvstore/cache/recording_kv_cache.h"
#include "kvstore/wire/kv_transform.h"
#include "model/gguf.h"
#include "model/llama.h"

namespace sluice::kvstore {

// Every layer's key (before RoPE) and value bases from one forward pass over `tokens` (at
// least 2, at most the model's context) with full-precision KV, on a host-memory backend.
// Values are fitted under the metric of the output projection: a value error e of kv-head h
// costs the sum over h's query heads g of |W_o[:, g] e|^2 in the layer's output (W_o from
// `gguf`'s attn_output weights). Keys are fitted under the metric of the queries that meet
// them (KvKeyMetric): a key error costs what it changes in the attention logits.
// With `cross_layer`, each layer after the first also gets a linear predictor from the layer
// before (ridge least squares on the calibration rows) and its bases are fitted on what the
// predictor misses.
absl::StatusOr<KvTransformCalibration> CalibrateKvTransform(model::LlamaModel& llama,
                                                            kernels::Backend& backend,
                                                            const model::GgufFile& gguf,
                                                            const std::vector<int32_t>& tokens,
                                                            bool cross_layer = false);

// The metric values are fitted under: the sum over the query heads g of kv-head h of
// W_o[:, g]^T W_o[:, g] (W_o: `layer`'s attn_output weights), block-diagonal over the kv-heads,
// [kv_heads * head_dim]^2. NotFound or InvalidArgument for a model without those weights or of
// other shapes, naming the tensor.
absl::StatusOr<std::vector<double>> KvValueMetric(const model::GgufFile& gguf,
                                                  const model::LlamaConfig& config, int layer);

// The metric keys are fitted under: a key error e (before RoPE) of kv-head h at position p
// changes query g's logit by (R(-p) q_g) . e, q_g the query after RoPE (R(x): RoPE at position
// x). The metric is the mean of (R(-p) q_g)(R(-p) q_g)^T over h's query heads g, over up to 512
// of the pass's query positions m, and over 8 key positions p spread evenly over [0, m]:
// block-diagonal over the kv-heads, [kv_heads * head_dim]^2. `queries` [n, heads, head_dim]
// (n >= 1) as RecordingKvCache keeps them.
std::vector<double> KvKeyMetric(const model::LlamaConfig& config, absl::Span<const float> queries,
                                int64_t n);

// out [n, dim] = the prediction bias + W prev[t] of `predict` (a KvTransformCalibration
// predictor of dim) for the rows prev [n, dim].
void PredictKvRows(absl::Span<const float> predict, const float* prev, int64_t n, int64_t dim,
                   float* out);

// One forward pass over `tokens` (one sequence, at most the model's context) with every key and
// value kept in fp32 and recorded (post-RoPE keys), and with `queries` every query too, on a
// host-memory backend.
absl::StatusOr<std::unique_ptr<RecordingKvCache>> RecordFullPrecisionKv(
    model::LlamaModel& llama, kernels::Backend& backend, absl::Span<const int32_t> tokens,
    bool queries = false);

// Key rows [tokens, kv_heads, head_dim] on the host at positions first .. first + tokens - 1:
// takes RoPE off (inverse) or puts it on, as the model applies it.
void RotateKeyRows(const model::LlamaConfig& config, float* rows, int64_t tokens, int64_t first,
                   bool inverse);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_KV_TRANSFORM_CALIBRATION_H_
