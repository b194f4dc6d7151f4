// Writes the seed corpus of gguf_fuzz into the directory named by argv[1]: small valid files
// with metadata of every type and tensors of every element type, written by the tests' GGUF
// writer.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/ggml_quant.h"
#include "model/test_util/gguf_writer.h"

int main(int argc, char** argv) {
  using namespace sluice;
  using kernels::GgmlType;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  for (int i = 0; i < 3; ++i) {
    model::testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.block_count", 2 + i);
    w.AddInt32("signed", -7 * i);
    w.AddUint64("big", uint64_t{1} << (20 + i));
    w.AddFloat32("llama.rope.freq_base", 10000.f);
    w.AddBool("tokenizer.ggml.add_bos_token", i % 2 == 0);
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>", ""});
    w.AddInt32Array("tokenizer.ggml.token_type", {1, 1, 3, 1});
    w.AddFloat32Array("scores", {0.5f, -1.f});
    std::vector<float> ramp(128);
    for (size_t j = 0; j < ramp.size(); ++j) ramp[j] = 0.25f * float(j) - 7.f;
    const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                              GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1};
    for (GgmlType t : types) {
      w.AddTensorFromFloats("t" + std::to_string(int(t)), {64, 2}, t, ramp);
    }
    std::ofstream(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary)
        << w.Build(3, i == 2 ? 64 : 32);
  }
  return 0;
}
