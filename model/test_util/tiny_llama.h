// A tiny Llama-architecture GGUF with random weights, for fast forward-pass tests.
#ifndef SLUICE_MODEL_TEST_UTIL_TINY_LLAMA_H_
#define SLUICE_MODEL_TEST_UTIL_TINY_LLAMA_H_

#include <cstdint>
#include <string>

#include "kernels/ggml_quant.h"

namespace sluice::model::testing {

struct TinyLlamaSpec {
  int layers = 2;
  int64_t hidden = 128;  // head_dim 32, the smallest the KV page formats take
  int64_t ffn = 96;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t vocab = 128;
  float rope_theta = 10000.f;
  kernels::GgmlType weight_type = kernels::GgmlType::kQ4_1;
  bool tied_output = true;
};

// The bytes of a GGUF file (v3) holding the model.
std::string BuildTinyLlamaGguf(const TinyLlamaSpec& spec, uint64_t seed);

}  // namespace sluice::model::testing

#endif  // SLUICE_MODEL_TEST_UTIL_TINY_LLAMA_H_
