// Prints every KV preset's page formats and layouts (kvstore/kv_preset.h, kernels/kv_format.h)
// as JSON, for the decode kernel's issue-bound model in tools/sass/issue_model.py:
//
//   page_layouts [--head_dim 128] [--page_bytes 16384]
//
// {"head_dim": 128, "page_bytes": 16384, "presets": [{"name": "sluice", "tiers": [{"tier":
// "high", "format": {...}, "layout": {...}, "unit_format": {...}, "unit_layout": {...}}]}]}
// unit_* appear for Huffman-coded tiers only: the fixed-width page each unit decodes into.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/kv_format.h"
#include "kvstore/kv_preset.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, head_dim, 128, "Channels per head (Llama-3-8B: 128).");
ABSL_FLAG(int, page_bytes, 16 * 1024, "Bytes per KV page.");

namespace sluice::tools {
namespace {

using nlohmann::json;

json SpecJson(const kernels::KvQuantSpec& s) {
  static constexpr const char* kCodec[] = {"f16", "int", "fp8"};
  static constexpr const char* kGrouping[] = {"token", "channel", "block"};
  return {{"codec", kCodec[static_cast<int>(s.codec)]},
          {"bits", s.bits},
          {"grouping", kGrouping[static_cast<int>(s.grouping)]},
          {"group", s.group},
          {"block_channels", s.block_channels},
          {"levels", s.levels}};
}

json FormatJson(const kernels::KvTierFormat& f) {
  return {{"name", kernels::KvTierFormatName(f)},
          {"k", SpecJson(f.k)},
          {"v", SpecJson(f.v)},
          {"head_dim", f.head_dim},
          {"page_bytes", f.page_bytes},
          {"token_meta", f.token_meta},
          {"huffman_bits", f.huffman_bits}};
}

json LayoutJson(const kernels::KvPageLayout& l) {
  return {{"tokens", l.tokens},
          {"token_group", l.token_group},
          {"k_tile", l.k_tile},
          {"k_row_bytes", l.k_row_bytes},
          {"v_row_bytes", l.v_row_bytes},
          {"k_codes", l.k_codes},
          {"k_meta", l.k_meta},
          {"v_codes", l.v_codes},
          {"v_meta", l.v_meta},
          {"valid", l.valid},
          {"bytes_used", l.bytes_used},
          {"unit_tokens", l.unit_tokens},
          {"unit_meta_bytes", l.unit_meta_bytes}};
}

// One tier; an error (a preset that does not lay out at these shapes) becomes {"error": ...}.
json TierJson(const char* tier, const kernels::KvTierFormat& f) {
  json t = {{"tier", tier}, {"format", FormatJson(f)}};
  auto layout = kernels::ComputePageLayout(f);
  if (!layout.ok()) {
    t["error"] = std::string(layout.status().message());
    return t;
  }
  t["layout"] = LayoutJson(*layout);
  if (f.huffman_bits > 0) {
    auto unit = kernels::ComputeUnitLayout(f);
    if (!unit.ok()) {
      t["error"] = std::string(unit.status().message());
      return t;
    }
    t["unit_format"] = FormatJson(kernels::KvUnitFormat(f));
    t["unit_layout"] = LayoutJson(*unit);
  }
  return t;
}

}  // namespace
}  // namespace sluice::tools

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int head_dim = absl::GetFlag(FLAGS_head_dim);
  const int page_bytes = absl::GetFlag(FLAGS_page_bytes);
  nlohmann::json out = {{"head_dim", head_dim}, {"page_bytes", page_bytes}};
  out["presets"] = nlohmann::json::array();
  for (const std::string& name : sluice::kvstore::KvPresetNames()) {
    auto preset = sluice::kvstore::FindKvPreset(name, head_dim, page_bytes);
    if (!preset.ok()) {
      std::cerr << "page_layouts: " << preset.status() << "\n";
      return 1;
    }
    nlohmann::json tiers = nlohmann::json::array();
    tiers.push_back(sluice::tools::TierJson("high", preset->high));
    if (preset->low) tiers.push_back(sluice::tools::TierJson("low", *preset->low));
    out["presets"].push_back({{"name", name}, {"tiers", tiers}});
  }
  std::cout << out.dump(1) << "\n";
  return 0;
}
