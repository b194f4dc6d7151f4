// Preset names and specs: every name resolves to formats with a layout, settings after the name
// replace the preset's own, and bad names and settings get errors naming them.
#include "kvstore/kv_preset.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

using ::testing::HasSubstr;

TEST(KvPreset, EveryNameResolves) {
  EXPECT_THAT(KvPresetNames(), ::testing::Contains("sluice"));
  for (const std::string& name : KvPresetNames()) {
    SCOPED_TRACE(name);
    auto p = FindKvPreset(name, 64);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->name, name);
    EXPECT_EQ(p->high.head_dim, 64);
    EXPECT_TRUE(kernels::ComputePageLayout(p->high).ok());
    // A low tier exactly for the leankv policy, in the same pages.
    EXPECT_EQ(p->low.has_value(), p->policy.kind == KvPolicyKind::kLeanKv);
    if (p->low) {
      EXPECT_EQ(p->low->page_bytes, p->high.page_bytes);
      auto high = kernels::ComputePageLayout(p->high);
      auto low = kernels::ComputePageLayout(*p->low);
      ASSERT_TRUE(high.ok() && low.ok());
      EXPECT_GT(low->tokens, high->tokens);  // the low tier is the smaller one
    }
  }
}

TEST(KvPreset, OneTierPagesHoldNoTailThatNoTokenGroupFits) {
  for (const std::string& name : KvPresetNames()) {
    SCOPED_TRACE(name);
    auto p = FindKvPreset(name, 64);
    ASSERT_TRUE(p.ok()) << p.status();
    kernels::KvTierFormat full = p->high;
    full.page_bytes = 16 * 1024;
    auto layout = kernels::ComputePageLayout(p->high);
    auto full_layout = kernels::ComputePageLayout(full);
    ASSERT_TRUE(layout.ok() && full_layout.ok());
    EXPECT_EQ(layout->tokens, full_layout->tokens);  // trimmed, not one group fewer
    if (p->low || p->high.huffman_bits > 0) {
      EXPECT_EQ(p->high.page_bytes, 16 * 1024);
    } else {
      EXPECT_EQ(p->high.page_bytes % 64, 0);
      EXPECT_LE(p->high.page_bytes, 16 * 1024);
      EXPECT_GE(p->high.page_bytes, layout->bytes_used);
      EXPECT_LT(p->high.page_bytes - layout->bytes_used, 64);
    }
  }
  // sluice at head_dim 64: 192 tokens of 80 bytes and their valid bits, 15,424 of 16,384 bytes.
  auto sluice = FindKvPreset("sluice", 64);
  ASSERT_TRUE(sluice.ok());
  EXPECT_EQ(sluice->high.page_bytes, 15424);
}

TEST(KvPreset, SettingsReplaceThePresetsOwn) {
  auto p = FindKvPreset("leankv-k8v4:alpha_high=2.5:alpha_low=0.05:residual=32", 64);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->policy.alpha_high, 2.5f);
  EXPECT_FLOAT_EQ(p->policy.alpha_low, 0.05f);
  EXPECT_EQ(p->residual, 32);
  EXPECT_EQ(p->name, "leankv-k8v4:alpha_high=2.5:alpha_low=0.05:residual=32");
  auto h2o = FindKvPreset("h2o:budget=0.5", 64);
  ASSERT_TRUE(h2o.ok()) << h2o.status();
  EXPECT_FLOAT_EQ(h2o->policy.budget, 0.5f);
  auto codes = FindKvPreset("sluice:k_group=128:v_group=64:v_bits=8", 64);
  ASSERT_TRUE(codes.ok()) << codes.status();
  EXPECT_EQ(codes->high.k.bits, 4);
  EXPECT_EQ(codes->high.k.group, 128);
  EXPECT_EQ(codes->high.k.grouping, kernels::KvGrouping::kPerChannel);
  EXPECT_EQ(codes->high.v.bits, 8);
  EXPECT_EQ(codes->high.v.group, 64);
  auto layout = kernels::ComputePageLayout(codes->high);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->token_group, 128);
}

TEST(KvPreset, BadNamesAndSettingsAreNamed) {
  auto unknown = FindKvPreset("kivi3", 64);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("kivi3"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("leankv-k8v4"));
  for (const char* spec : {"kivi2:alpha_high=1",
                           "leankv-k8v4:alpha_high",
                           "leankv-k8v4:alpha_low=x",
                           "leankv-k8v4:alpha_high=-1",
                           "leankv-k8v4:alpha_low=-0.5",
                           "int8:budget=0.5",
                           "h2o:budget=0",
                           "h2o:budget=1.5",
                           "kivi4:residual=-4",
                           "kivi4:residual=2.5",
                           "kivi4:speed=3",
                           "leankv-k4v2:alpha_high=nan",
                           "kivi4:k_bits=3",
                           "kivi4:v_group=48",
                           "kivi4:k_group=0",
                           "kivi4:k_group=2048",
                           "kivi4:v_bits=4.5",
                           "fp16:k_bits=4",
                           "kvcomp:k_bits=4",
                           "leankv-k8v4:v_bits=2"}) {
    SCOPED_TRACE(spec);
    auto p = FindKvPreset(spec, 64);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(FindKvPreset("kivi4:speed=3", 64).status().message(), HasSubstr("speed"));
  EXPECT_THAT(FindKvPreset("kivi4:k_bits=3", 64).status().message(), HasSubstr("k: int codes"));
  EXPECT_THAT(FindKvPreset("fp16:v_group=32", 64).status().message(), HasSubstr("v_group"));
  // A head_dim the formats cannot lay out.
  EXPECT_FALSE(FindKvPreset("kivi2", 48).ok());
}

}  // namespace
}  // namespace sluice::kvstore
