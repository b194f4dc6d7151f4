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
#ifndef SLUICE_KVSTORE_KV_PRESET_H_
#define SLUICE_KVSTORE_KV_PRESET_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kv_format.h"

namespace sluice::kvstore {

// Which tokens a preset evicts (kvstore/paged_kv_cache.h applies it).
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

// The preset called `name` for heads of `head_dim` channels and pages of `page_bytes`.
// NotFound listing the known names otherwise.
absl::StatusOr<KvPreset> FindKvPreset(std::string_view name, int32_t head_dim,
                                      int32_t page_bytes = 16 * 1024);
std::vector<std::string> KvPresetNames();

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_KV_PRESET_H_
