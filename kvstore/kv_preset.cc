#include "kvstore/kv_preset.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace sluice::kvstore {
namespace {

using kernels::KvCodec;
using kernels::KvGrouping;
using kernels::KvQuantSpec;

KvQuantSpec PerToken(int bits, int group = 0) {
  return {.codec = KvCodec::kInt, .bits = bits, .grouping = KvGrouping::kPerToken, .group = group};
}
KvQuantSpec PerChannel(int bits, int tokens) {
  return {
      .codec = KvCodec::kInt, .bits = bits, .grouping = KvGrouping::kPerChannel, .group = tokens};
}

// kvcomp (KVComp): error-controlled quantization, then Huffman coding of the codes. The steps
// are KVComp's accuracy turning points: keys per channel over 32-token groups with a step of a
// quarter of each group's range (5 levels), values per token with a sixth (7 levels). Keys go
// per channel rather than in KVComp's 2D blocks because on SmolLM2 blocks of 32 x 32 cost more
// error at every rate (./sluice bench kvstore, section bits).
constexpr int kKvcompKeyTokens = 32;
constexpr int kKvcompKeyLevels = 5;
constexpr int kKvcompValueLevels = 7;
constexpr float kKvcompBitsHint = 2.4f;
// sluice: the full-precision window (KIVI's is 128).
constexpr int32_t kSluiceResidual = 32;

}  // namespace

float PyramidBudget(const KvPolicy& policy, int layer, int layers) {
  const float x = policy.budget, depth = static_cast<float>(policy.pyramid_depth);
  const float bottom = x * (2.f - 1.f / depth), top = x / depth;
  const float at = layers > 1 ? static_cast<float>(layer) / static_cast<float>(layers - 1) : 0.f;
  return std::min(1.f, bottom + (top - bottom) * at);
}

std::vector<std::string> KvPresetNames() {
  return {"fp16",    "int8", "kivi4",  "kivi2",       "kvcomp",      "sinks", "snapkv",
          "pyramid", "h2o",  "minikv", "leankv-k8v4", "leankv-k4v2", "sluice"};
}

namespace {

// Applies "key=value" settings to a preset (FindKvPreset's spec after the name).
absl::Status ApplyKvPresetSetting(std::string_view setting, KvPreset& p) {
  const std::vector<std::string> kv = absl::StrSplit(std::string(setting), absl::MaxSplits('=', 1));
  const std::string& key = kv[0];
  double value = 0;
  if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("preset ", p.name, ": setting \"",
                                                   std::string(setting), "\" is not key=number"));
  }
  const bool leankv = p.policy.kind == KvPolicyKind::kLeanKv;
  if ((key == "alpha_high" || key == "alpha_low") && !leankv) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset ", p.name, ": ", key, " applies to leankv presets only"));
  }
  if (key == "alpha_high" || key == "alpha_low") {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("preset ", p.name, ": ", key, " < 0"));
    }
    (key == "alpha_high" ? p.policy.alpha_high : p.policy.alpha_low) = static_cast<float>(value);
  } else if (key == "budget") {
    if (p.policy.kind == KvPolicyKind::kNone || p.policy.kind == KvPolicyKind::kLeanKv) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", p.name, ": budget applies to evicting presets only"));
    }
    if (!(value > 0 && value <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", p.name, ": budget ", value, " outside (0, 1]"));
    }
    p.policy.budget = static_cast<float>(value);
  } else if (key == "residual") {
    if (value < 0 || value != std::floor(value) || value > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", p.name, ": residual ", value, " is not a token count"));
    }
    p.residual = static_cast<int32_t>(value);
  } else if (key == "k_bits" || key == "v_bits" || key == "k_group" || key == "v_group") {
    // The codes of a preset with one int-coded tier, as llama.cpp's --cache-type-k/v choose
    // them: bits 2, 4 or 8; the group in tokens for per-channel keys, in channels otherwise
    // (ComputePageLayout checks the combination).
    const bool fixed_int = !p.low && p.high.huffman_bits == 0.f &&
                           p.high.k.codec == kernels::KvCodec::kInt &&
                           p.high.v.codec == kernels::KvCodec::kInt;
    if (!fixed_int) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset ", p.name, ": ", key,
          " applies to presets with one tier of fixed-width int codes (int8, kivi4, kivi2, "
          "minikv, sluice)"));
    }
    if (value != std::floor(value) || value < 1 || value > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", p.name, ": ", key, " ", value, " is not a count in [1, 1024]"));
    }
    kernels::KvQuantSpec& spec = key[0] == 'k' ? p.high.k : p.high.v;
    (key.ends_with("_bits") ? spec.bits : spec.group) = static_cast<int32_t>(value);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "preset ", p.name, ": unknown setting \"", key,
        "\"; settings: alpha_high, alpha_low (leankv), budget (evicting presets), residual, "
        "k_bits, k_group, v_bits, v_group (one int tier)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvPreset> FindKvPreset(std::string_view spec, int32_t head_dim, int32_t page_bytes) {
  const std::vector<std::string> parts = absl::StrSplit(std::string(spec), ':');
  const std::string_view name = parts[0];
  KvPreset p;
  p.name = std::string(name);
  p.high.head_dim = head_dim;
  p.high.page_bytes = page_bytes;
  if (name == "fp16") {
    // defaults: f16 K and V
  } else if (name == "int8") {
    p.high.k = PerToken(8);
    p.high.v = PerToken(8);
  } else if (name == "kivi4" || name == "kivi2") {
    const int bits = name == "kivi4" ? 4 : 2;
    p.high.k = PerChannel(bits, 32);
    p.high.v = PerToken(bits, 32);
    p.residual = 128;
  } else if (name == "kvcomp") {
    p.high.k = PerChannel(8, kKvcompKeyTokens);
    p.high.k.levels = kKvcompKeyLevels;
    p.high.v = PerToken(8);
    p.high.v.levels = kKvcompValueLevels;
    p.high.huffman_bits = kKvcompBitsHint;
    p.residual = 128;
  } else if (name == "sinks") {
    p.policy = {.kind = KvPolicyKind::kSinks, .budget = 0.25f};
  } else if (name == "h2o") {
    p.policy = {.kind = KvPolicyKind::kH2o, .budget = 0.25f};
  } else if (name == "pyramid") {
    p.policy = {.kind = KvPolicyKind::kPyramid, .budget = 0.25f};
  } else if (name == "snapkv") {
    p.policy = {.kind = KvPolicyKind::kSnapKv, .budget = 0.25f};
  } else if (name == "minikv") {
    // MiniKV: pyramid selection of persistent heavy hitters at the end of the prompt (half of
    // it on average), then 2-bit KIVI codes; generated tokens all stay.
    p.policy = {.kind = KvPolicyKind::kMiniKv, .budget = 0.5f, .pool = 1};
    p.high.k = PerChannel(2, 32);
    p.high.v = PerToken(2, 32);
    p.residual = 128;
  } else if (name == "sluice") {
    // KIVI-4 with a shorter full-precision window: SmolLM2 keeps fp16's quality only with
    // 4-bit keys per channel or finer, and every eviction policy (leankv's calibrated
    // thresholds included) costs more than +1% perplexity (README, Measured).
    p.high.k = PerChannel(4, 32);
    p.high.v = PerToken(4, 32);
    p.residual = kSluiceResidual;
  } else if (name == "leankv-k8v4" || name == "leankv-k4v2") {
    // LeanKV: significant tokens in the high tier, less significant ones in the low tier, the
    // rest evicted; the most recent 64 in full precision. K8V4 pairs with K4V2 (LeanKV's
    // example); K4V2 with K2V2, since values have no 1-bit codes here.
    const bool k8 = name == "leankv-k8v4";
    p.policy = {.kind = KvPolicyKind::kLeanKv, .alpha_high = 1.f, .alpha_low = 0.02f};
    p.high.k = k8 ? PerToken(8) : PerToken(4, 32);
    p.high.v = k8 ? PerToken(4, 32) : PerToken(2, 32);
    p.low = p.high;
    p.low->k = k8 ? PerToken(4, 32) : PerToken(2, 32);
    p.low->v = PerToken(2, 32);
    p.residual = 64;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown KV preset \"", std::string(name),
                     "\"; known presets: ", absl::StrJoin(KvPresetNames(), ", ")));
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(ApplyKvPresetSetting(parts[i], p));
  }
  p.name = std::string(spec);
  int32_t high_bytes_used = 0;
  for (const kernels::KvTierFormat* f : {&p.high, p.low ? &*p.low : nullptr}) {
    if (f == nullptr) continue;
    const absl::StatusOr<kernels::KvPageLayout> layout = kernels::ComputePageLayout(*f);
    if (!layout.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("preset ", std::string(name), " at head_dim ",
                                                     head_dim, ": ",
                                                     std::string(layout.status().message())));
    }
    if (f == &p.high) high_bytes_used = layout->bytes_used;
  }
  // A page of one fixed-width tier is as large as the whole token groups that fit `page_bytes`
  // need, as vLLM sizes a block by its tokens: the tail no group fits is not allocated (6% of
  // `sluice`'s 16 KiB pages at head_dim 64). Two tiers share their pages' size, and a
  // Huffman-coded page's tail is room for longer codes.
  if (!p.low && p.high.huffman_bits == 0.f) {
    const int32_t fitted = (high_bytes_used + 63) / 64 * 64;
    if (fitted >= 1024) p.high.page_bytes = fitted;
  }
  return p;
}

}  // namespace sluice::kvstore
