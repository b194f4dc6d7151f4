// The page wire format: round trips, and a clear error for every kind of malformed page.
#include "kvstore/wire/page_wire.h"

#include <cstring>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

using ::testing::HasSubstr;

PageHeader SampleHeader() {
  return {.sequence_id = 42,
          .layer = 7,
          .kv_head = 2,
          .page_index = 17,
          .tier = PageTier::kLow,
          .token_count = 96,
          .codebook_id = 3};
}

std::string Payload(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(PageWire, RoundTrip) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{47}, size_t{16384}}) {
    const std::string payload = Payload(n, n);
    auto bytes = EncodePage(SampleHeader(), payload);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(bytes->size(), kPageHeaderBytes + n);
    EXPECT_EQ(bytes->substr(0, 4), "SLPG");
    auto page = ParsePage(*bytes, {});
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->header, SampleHeader());
    EXPECT_EQ(page->payload, payload);
  }
}

TEST(PageWire, RejectsEveryMalformedField) {
  const std::string good = *EncodePage(SampleHeader(), Payload(100, 1));
  auto err = [](const std::string& b, PageLimits limits = {}) {
    return ParsePage(b, limits).status();
  };
  auto patch = [&](size_t at, const void* v, size_t n) {
    std::string b = good;
    std::memcpy(b.data() + at, v, n);
    return b;
  };

  EXPECT_EQ(err(good.substr(0, 47)).code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(err(good.substr(0, good.size() - 1)).message(),
              HasSubstr("page 17 of sequence 42 (layer 7, kv head 2): header announces 100"));
  EXPECT_THAT(err(good + "x").message(), HasSubstr("101 arrived"));
  EXPECT_THAT(err(patch(0, "XLPG", 4)).message(), HasSubstr("not a sluice page"));
  const uint16_t v2 = 2;
  EXPECT_THAT(err(patch(4, &v2, 2)).message(), HasSubstr("version 2 is not supported"));
  const uint8_t tier = 9;
  EXPECT_THAT(err(patch(6, &tier, 1)).message(), HasSubstr("unknown tier 9"));
  const uint8_t flags = 1;
  EXPECT_THAT(err(patch(7, &flags, 1)).message(), HasSubstr("reserved"));
  const uint32_t zero = 0, huge = 1u << 30;
  EXPECT_THAT(err(patch(28, &zero, 4)).message(), HasSubstr("token count 0"));
  EXPECT_THAT(err(patch(36, &huge, 4)).message(), HasSubstr("exceeds"));
  EXPECT_THAT(err(good, {.layers = 7}).message(), HasSubstr("layer 7 but the model has 7"));
  EXPECT_THAT(err(good, {.kv_heads = 2}).message(), HasSubstr("kv head 2 but the model has 2"));
  EXPECT_THAT(err(good, {.max_payload_bytes = 99}).message(), HasSubstr("exceeds the 99-byte"));

  // Any flipped bit in the header's checked fields or the payload fails the checksum (or an
  // earlier check): never a silently different page.
  for (size_t i = 0; i < good.size(); ++i) {
    if (i >= 40 && i < 44) continue;  // the checksum itself
    std::string b = good;
    b[i] ^= 0x10;
    auto page = ParsePage(b, {});
    ASSERT_FALSE(page.ok()) << "bit flip at byte " << i << " went unnoticed";
  }
  std::string bad_crc = good;
  bad_crc[40] ^= 1;
  const absl::Status st = err(bad_crc);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(),
              HasSubstr("page 17 of sequence 42 (layer 7, kv head 2) failed its CRC32C"));
}

TEST(PageWire, EncodeRejectsEmptyPages) {
  PageHeader h = SampleHeader();
  h.token_count = 0;
  EXPECT_EQ(EncodePage(h, "abc").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kvstore
