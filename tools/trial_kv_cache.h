// Candidate resident KV formats, emulated for `sluice eval --trial`: what a format would cost in
// quality and bytes, measured before its kernels are written.
//
// A TrialKvCache keeps every row as the format would give it back to the attention: rows leave
// the exact window (fp16, or fp32 as PagedKvCache holds it) a flush group at a time, as a
// PagedKvCache's do at a commit, and are then replaced by their coded-and-decoded values. The
// attention (Backend::Attention over the rows) is then exactly the attention a kernel reading
// the format would compute, up to float rounding: both candidates are linear in what they
// store (q . dequantized key, the weights times dequantized values). Bytes are counted as the
// format would lay them out in 16 KiB pages (whole pages, slack included).
//
// Formats:
//   kivi  int codes as the one-tier presets hold them (kernels/ref/kv_quant.h's quantizer):
//         keys per channel over `kg`-token groups, values per token over `vg`-channel groups,
//         `kb`/`vb` bits; pages exactly as the preset sluice:k_bits=..:k_group=.. lays them out.
//         With rope=pre the keys are quantized before RoPE (KVQuant) and rotated back.
//   tc    the transform codec's bases (kvstore/wire/kv_transform.h) as a resident format: a
//         token's keys (after RoPE, or before it with rope=pre) and values across all kv-heads
//         rotated into the calibration's principal components, each component a fixed width
//         chosen from the calibration's variances under a `kb`/`vb` bits-per-value budget, codes
//         clipped to the width's levels (fixed width, so a kernel finds every token). steps=calib
//         takes each component's step from the calibration's variance (nothing stored per
//         token group); steps=group stores each component's mean and step per flush group, fp16
//         (a Gaussian's optimal step for the group's variance); steps=minmax stores each
//         component's minimum and step per flush group, as KIVI does per channel (never clips).
//         After RoPE, q . k and the weighted sum of values are linear in the coefficients, so a
//         kernel attends in the coefficient domain; before RoPE it would rebuild every key.
// Settings, after the name, `:key=value`: kb, vb, kg, vg (kivi), steps (tc), rope=pre|post,
// window (exact rows kept, default 32), group (flush group, default 32), sinks (first tokens
// kept exact, default 0), exact=fp16|fp32 (the window's precision, default fp16), clip=0 (tc:
// codes not clipped to their width, as the wire's entropy-coded ones; bytes then undercounted).
#ifndef SLUICE_TOOLS_TRIAL_KV_CACHE_H_
#define SLUICE_TOOLS_TRIAL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kvstore/wire/kv_transform.h"
#include "model/gguf.h"
#include "model/kv_cache.h"
#include "model/llama.h"

namespace sluice::tools {

struct TrialFormat {
  enum class Kind { kKivi, kTransform };
  std::string spec;  // as given
  Kind kind = Kind::kKivi;
  int k_bits = 4, v_bits = 4;         // kivi
  int k_group = 32, v_group = 32;     // kivi: tokens per key scale, channels per value scale
  double k_budget = 2, v_budget = 4;  // tc: code bits per value
  enum class Steps { kCalibrated, kGroup, kMinMax };
  Steps steps = Steps::kCalibrated;  // tc
  bool clip = true;                  // tc: codes clipped to the width's levels
  bool keys_pre_rope = false;
  int64_t window = 32, group = 32, sinks = 0;
  bool fp32_exact = false;
};

// InvalidArgument naming the setting for an unknown name, setting or value.
absl::StatusOr<TrialFormat> ParseTrialFormat(std::string_view spec);

// The tc format's bases, per layer: keys before and after RoPE, values under the output
// projection's metric (kvstore::KvValueMetric), all fitted on one calibration pass.
struct TrialBases {
  std::vector<kvstore::KvTransformBasis> k_pre, k_post, v;
};
absl::StatusOr<TrialBases> FitTrialBases(model::LlamaModel& llama, kernels::Backend& backend,
                                         const model::GgufFile& gguf,
                                         const std::vector<int32_t>& tokens);

class TrialKvCache final : public model::KvCache {
 public:
  // InvalidArgument for a format the model's shapes do not take (value groups that do not
  // divide head_dim, key groups that do not divide the flush group, a tc format without bases
  // of the model's shape); Unimplemented on a backend whose memory is not the host's.
  static absl::StatusOr<std::unique_ptr<TrialKvCache>> Create(const TrialFormat& format,
                                                              const model::LlamaConfig& config,
                                                              kernels::Backend& backend,
                                                              const TrialBases* bases);

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override;
  absl::Status RemoveSequence(int64_t seq) override;
  absl::StatusOr<int64_t> Length(int64_t seq) const override;
  absl::Status BeginStep(absl::Span<const model::StepEntry> batch) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float* out) override;
  absl::Status Commit() override;
  void AbortStep() override;

  // What the live sequences would hold in the format (exact rows, whole pages), and the same
  // KV in fp16.
  int64_t held_bytes() const;
  int64_t fp16_bytes() const;
  // The format's shape in words: for tc, the components coded (bits > 0) per layer on average
  // and the code bits of a key and a value row; for kivi, the page's tokens and bytes.
  std::string Describe() const;

 private:
  struct Seq {
    int64_t max_tokens = 0, length = 0;
    int64_t coded_end = 0;                 // rows [sinks, coded_end) are coded
    std::vector<std::vector<float>> k, v;  // [layers][max_tokens * dim], as the format gives back
  };
  struct PageGeometry {
    int64_t tokens = 0, bytes = 0;  // per page of one list
  };
  TrialKvCache(const TrialFormat& format, const model::LlamaConfig& config,
               kernels::Backend& backend, const TrialBases* bases)
      : f_(format), c_(config), backend_(backend), bases_(bases) {}
  absl::Status Init();
  void CodeKivi(int layer, int64_t start, int64_t n, float* k, float* v) const;
  void CodeTransform(int layer, bool keys, int64_t start, int64_t n, float* rows) const;
  int64_t FlushCount(const Seq& s) const;

  const TrialFormat f_;
  const model::LlamaConfig c_;
  kernels::Backend& backend_;
  const TrialBases* bases_;
  int64_t dim_ = 0;
  std::vector<std::vector<uint8_t>> k_widths_, v_widths_;  // tc: [layers][dim]
  std::vector<PageGeometry> pages_;  // per layer; kivi: one list per kv-head, tc: one per layer
  absl::flat_hash_map<int64_t, Seq> seqs_;
  struct Entry {
    Seq* seq = nullptr;
    int64_t tokens = 0, row = 0;
  };
  std::vector<Entry> step_;
  int64_t step_rows_ = 0;
  bool open_ = false;
};

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_TRIAL_KV_CACHE_H_
