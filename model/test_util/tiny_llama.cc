#include "model/test_util/tiny_llama.h"

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "model/test_util/gguf_writer.h"

namespace sluice::model::testing {

std::string BuildTinyLlamaGguf(const TinyLlamaSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random = [&](int64_t n, float scale) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  auto ones = [&](int64_t n) {
    std::vector<float> v = random(n, 0.1f);
    for (float& x : v) x += 1.f;
    return v;
  };
  const int64_t head_dim = s.hidden / s.heads;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", s.layers);
  w.AddUint32("llama.embedding_length", s.hidden);
  w.AddUint32("llama.feed_forward_length", s.ffn);
  w.AddUint32("llama.attention.head_count", s.heads);
  w.AddUint32("llama.attention.head_count_kv", s.kv_heads);
  w.AddUint32("llama.context_length", 512);
  w.AddUint32("llama.rope.dimension_count", head_dim);
  w.AddFloat32("llama.rope.freq_base", s.rope_theta);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  const float scale = 1.f / std::sqrt(static_cast<float>(s.hidden));
  w.AddTensorFromFloats("token_embd.weight", {s.hidden, s.vocab}, kernels::GgmlType::kQ8_0,
                        random(s.hidden * s.vocab, 1.f));
  if (!s.tied_output) {
    w.AddTensorFromFloats("output.weight", {s.hidden, s.vocab}, s.weight_type,
                          random(s.hidden * s.vocab, scale));
  }
  w.AddTensorFromFloats("output_norm.weight", {s.hidden}, kernels::GgmlType::kF32, ones(s.hidden));
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrFormat("blk.%d.", i);
    const int64_t q = s.heads * head_dim, kv = s.kv_heads * head_dim;
    w.AddTensorFromFloats(p + "attn_norm.weight", {s.hidden}, kernels::GgmlType::kF32,
                          ones(s.hidden));
    w.AddTensorFromFloats(p + "ffn_norm.weight", {s.hidden}, kernels::GgmlType::kF32,
                          ones(s.hidden));
    w.AddTensorFromFloats(p + "attn_q.weight", {s.hidden, q}, s.weight_type,
                          random(s.hidden * q, scale));
    w.AddTensorFromFloats(p + "attn_k.weight", {s.hidden, kv}, s.weight_type,
                          random(s.hidden * kv, scale));
    w.AddTensorFromFloats(p + "attn_v.weight", {s.hidden, kv}, s.weight_type,
                          random(s.hidden * kv, scale));
    w.AddTensorFromFloats(p + "attn_output.weight", {q, s.hidden}, s.weight_type,
                          random(q * s.hidden, scale));
    w.AddTensorFromFloats(p + "ffn_gate.weight", {s.hidden, s.ffn}, s.weight_type,
                          random(s.hidden * s.ffn, scale));
    w.AddTensorFromFloats(p + "ffn_up.weight", {s.hidden, s.ffn}, s.weight_type,
                          random(s.hidden * s.ffn, scale));
    w.AddTensorFromFloats(p + "ffn_down.weight", {s.ffn, s.hidden}, s.weight_type,
                          random(s.ffn * s.hidden, 1.f / std::sqrt(static_cast<float>(s.ffn))));
  }
  return w.Build();
}

}  // namespace sluice::model::testing
