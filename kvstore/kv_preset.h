// Named KV compression presets: the page format of each tier and the full-precision window.
//
//   fp16   K and V in fp16 (the uncompressed baseline; the 2x of fp32 aside)
//   int8   K and V int8 per token (asymmetric, fp16 scale/zero per token and head)
//   kivi4  KIVI: K int4 per channel in groups of 32 tokens, V int4 per token in groups of 32
//          channels, the most recent 128 tokens in full precision
//   kivi2  the same with 2-bit codes
//   kvcomp KVComp: K per channel in groups of 32 tokens with 5 levels, V per token with 7
//          levels, both Huffman-coded with per-layer codebooks built from the prefill's codes
//          (about 2.2 and 2.5 bits per value on SmolLM2); the most recent 128 tokens in full
//          precision
//   sinks  StreamingLLM: fp16 K and V; the first 4 tokens (attention sinks) and the most recent
//          ones stay, everything between is evicted as the sequence grows, keeping 25%
//   snapkv SnapKV: fp16 K and V; at the end of the prompt, the attention of its last 32 tokens
//          (the observation window), summed over each kv-head's query heads and max-pooled
//          over 7 neighbouring keys, picks the 25% of the prompt's tokens that stay (the
//          window among them); generated tokens all stay
//   pyramid PyramidKV: snapkv's selection with per-layer budgets, 25% of the prompt on average,
//          more in lower layers (MiniKV's schedule, δ = 7)
//   h2o    H2O: fp16 K and V; after every step each (layer, kv-head) keeps 25% of the tokens:
//          the most recent half of that, and the heavy hitters with the largest cumulative
//          attention (summed over the kv-head's query heads) among the older ones
//   minikv MiniKV: at the end of the prompt, pyramid budgets (50% of the prompt on average)
//          of persistent heavy hitters, scored by the attention of all the prompt's queries
//          divided by how many saw each key, plus the last 32 prompt tokens; then 2-bit KIVI
//          pages (K per channel in 32-token groups, V per token), residual 128; generated
//          tokens all stay
//   leankv-k8v4, leankv-k4v2
//          LeanKV: two tiers per (layer, kv-head) plus eviction. A token's significance is its
//          mean attention per query that saw it, the max over the kv-head's query heads;
//          against alpha_high / N and alpha_low / N (N: the sequence's length) it goes to the
//          high tier (K8V4, or K4V2), the low tier (K4V2, or K2V2) or is evicted, at the end of
//          the prompt and for each token leaving the 64-token full-precision window, where
//          Algorithm 1 then demotes or evicts the tier's least significant token. Both tiers
//          per token (K in groups of 32 channels below 8 bits, V in groups of 32).
//   sluice KIVI-4 with a 32-token full-precision window instead of 128: the best this model
//          allowed within +1% perplexity (README, Measured). Every eviction policy, leankv's
//          calibrated thresholds included, and every key code coarser than 4 bits per channel
//          cost more; Huffman coding of KIVI-4's codes saves under 2% of the bits, which page
//          and unit overheads take back
#ifndef SLUICE_KVSTORE_KV_PRESET_H_
#define SLUICE_KVSTORE_KV_PRESET_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kv_format.h"

namespace sluice::kvstore {

// Which tokens a preset evicts (kvstore/cache/paged_kv_cache.h applies it).
enum class KvPolicyKind { kNone, kSinks, kSnapKv, kH2o, kPyramid, kMiniKv, kLeanKv };

struct KvPolicy {
  KvPolicyKind kind = KvPolicyKind::kNone;
  // Fraction of the tokens kept: of the whole sequence (sinks, h2o), of the prompt (snapkv).
  float budget = 1.f;
  int32_t sinks = 4;          // sinks: leading tokens always kept
  int32_t observation = 32;   // snapkv: the prompt's last tokens, whose attention scores keys
  int32_t pool = 7;           // snapkv: max-pooling width over neighbouring keys (odd)
  int32_t pyramid_depth = 7;  // pyramid: the top layer keeps budget / depth (MiniKV's δ)
  // leankv: a token whose significance (mean attention per query that saw it, max over the
  // kv-head's query heads) is at least alpha_high / N goes to the high tier, at least
  // alpha_low / N to the low tier, and is evicted below that (N: the sequence's length).
  float alpha_high = 1.f;
  float alpha_low = 0.02f;
};

// The fraction of the prompt layer `layer` of `layers` keeps under a pyramid policy: linear in
// depth from budget * (2 - 1/δ) at the bottom layer to budget / δ at the top (PyramidKV, MiniKV
// §3.1.3 with δ = 7), so that the layers keep `budget` on average; at most 1.
float PyramidBudget(const KvPolicy& policy, int layer, int layers);

struct KvPreset {
  std::string name;
  KvPolicy policy;
  kernels::KvTierFormat high;  // the tier tokens go to
  // Two-tier presets (leankv): the tier of less significant tokens; its pages come from the
  // same pool (same page size), token_group 1 and fixed-width codes in both tiers.
  std::optional<kernels::KvTierFormat> low;
  // Tokens kept in full precision after the compressed ones (KIVI's residual); tokens move to
  // pages in whole token groups once more than this many are committed.
  int32_t residual = 0;
};

// The preset named by `spec` for heads of `head_dim` channels and pages of `page_bytes`:
// a name, then optional ":key=value" settings that replace the preset's own
//   alpha_high, alpha_low  leankv thresholds, >= 0 (alpha_low above alpha_high: no low tier)
//   budget                 fraction kept by evicting presets, in (0, 1]
//   residual               full-precision window, tokens
//   k_bits, v_bits         int codes of a one-tier int preset: 2, 4 or 8 bits
//   k_group, v_group       its groups: tokens (per-channel keys) or channels (per token)
// e.g. "leankv-k8v4:alpha_high=2:alpha_low=0.05"; the preset's name is then the whole spec.
// A one-tier fixed-width preset's pages are trimmed to what their whole token groups use (its
// `high.page_bytes` is at most `page_bytes`); two-tier and Huffman-coded pages keep it.
// NotFound listing the known names for an unknown name; InvalidArgument naming a bad setting.
absl::StatusOr<KvPreset> FindKvPreset(std::string_view spec, int32_t head_dim,
                                      int32_t page_bytes = 16 * 1024);
std::vector<std::string> KvPresetNames();

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_KV_PRESET_H_
