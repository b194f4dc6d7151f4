#include "kvstore/wire/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62a8ab43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46dd794eu);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32c, HardwareMatchesPortableAndExtends) {
  std::mt19937_64 rng(std::random_device{}());
  for (int iter = 0; iter < 200; ++iter) {
    std::string s(rng() % 3000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const uint32_t whole = Crc32c(s.data(), s.size());
    ASSERT_EQ(whole, Crc32cPortable(s.data(), s.size()));
    const size_t cut = s.empty() ? 0 : rng() % s.size();
    EXPECT_EQ(Crc32c(s.data() + cut, s.size() - cut, Crc32c(s.data(), cut)), whole);
  }
}

}  // namespace
}  // namespace sluice::kvstore
