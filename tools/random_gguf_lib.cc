#include "tools/random_gguf_lib.h"

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/ggml_quant.h"
#include "model/test_util/gguf_writer.h"

namespace sluice::tools {
namespace {

struct TensorSpec {
  std::string name;
  kernels::GgmlType type;
  std::vector<int64_t> dims;
};

absl::Status CopyMetadata(const model::GgufFile& like, model::testing::GgufWriter& w) {
  for (const std::string& key : like.keys()) {
    if (key == kDescribedTensorsKey) continue;
    SLUICE_RETURN_IF_ERROR(w.AddValue(key, *like.Find(key)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorSpec> ParseSpec(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '|');
  uint32_t type = 0;
  TensorSpec spec;
  if (parts.size() != 3 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &type)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("described tensor '%s' is not name|type|dims", text));
  }
  spec.name = std::string(parts[0]);
  spec.type = static_cast<kernels::GgmlType>(type);
  for (absl::string_view d : absl::StrSplit(parts[2], ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(d, &n) || n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("described tensor '%s' has a bad dimension '%s'", text, d));
    }
    spec.dims.push_back(n);
  }
  return spec;
}

}  // namespace

absl::StatusOr<model::testing::GgufWriter> DescribeGguf(const model::GgufFile& like) {
  model::testing::GgufWriter w;
  SLUICE_RETURN_IF_ERROR(CopyMetadata(like, w));
  std::vector<std::string> specs;
  for (const model::GgufTensor& t : like.tensors()) {
    specs.push_back(absl::StrFormat("%s|%d|%s", t.name, static_cast<uint32_t>(t.type),
                                    absl::StrJoin(t.dims, ",")));
  }
  w.AddStringArray(kDescribedTensorsKey, specs);
  return w;
}

absl::StatusOr<model::testing::GgufWriter> RandomGguf(const model::GgufFile& like, uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (const model::GgufTensor& t : like.tensors()) specs.push_back({t.name, t.type, t.dims});
  if (specs.empty()) {
    absl::StatusOr<const std::vector<std::string>*> listed =
        like.GetStringArray(kDescribedTensorsKey);
    if (!listed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has no tensors and no %s list to make them from", like.source(),
                          kDescribedTensorsKey));
    }
    for (const std::string& text : **listed) {
      SLUICE_ASSIGN_OR_RETURN(TensorSpec spec, ParseSpec(text));
      specs.push_back(std::move(spec));
    }
  }
  model::testing::GgufWriter w;
  SLUICE_RETURN_IF_ERROR(CopyMetadata(like, w));
  std::mt19937_64 rng(seed);
  for (const TensorSpec& t : specs) {
    const kernels::GgmlTypeTraits* traits = kernels::FindGgmlType(static_cast<uint32_t>(t.type));
    const bool writable = t.type == kernels::GgmlType::kF32 || t.type == kernels::GgmlType::kF16 ||
                          t.type == kernels::GgmlType::kBF16 ||
                          t.type == kernels::GgmlType::kQ8_0 ||
                          t.type == kernels::GgmlType::kQ4_0 || t.type == kernels::GgmlType::kQ4_1;
    if (traits == nullptr || !writable || t.dims[0] % traits->block_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %s: type %d with rows of %d cannot be written with random values",
                          t.name, static_cast<uint32_t>(t.type), t.dims[0]));
    }
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    const bool norm = t.name.find("norm") != std::string::npos;
    const float scale = norm                            ? 0.1f
                        : t.name == "token_embd.weight" ? 1.f
                                                        : 1.f / std::sqrt(float(t.dims[0]));
    std::normal_distribution<float> dist(0.f, scale);
    std::vector<float> values(n);
    for (float& v : values) v = dist(rng) + (norm ? 1.f : 0.f);
    w.AddTensorFromFloats(t.name, t.dims, t.type, values);
  }
  return w;
}

}  // namespace sluice::tools
