#include "kvstore/kv_preset.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

}  // namespace

std::vector<std::string> KvPresetNames() { return {"fp16", "int8", "kivi4", "kivi2"}; }

absl::StatusOr<KvPreset> FindKvPreset(std::string_view name, int32_t head_dim, int32_t page_bytes) {
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
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown KV preset \"", std::string(name),
                     "\"; known presets: ", absl::StrJoin(KvPresetNames(), ", ")));
  }
  if (auto layout = kernels::ComputePageLayout(p.high); !layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("preset ", std::string(name), " at head_dim ",
                                                   head_dim, ": ",
                                                   std::string(layout.status().message())));
  }
  return p;
}

}  // namespace sluice::kvstore
