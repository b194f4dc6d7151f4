#include "model/unicode_utf8.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace sluice::model {
namespace {

std::string Lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy(bytes, /*final=*/true, &out), bytes.size());
  return out;
}

TEST(ValidateUtf8, AcceptsWellFormedText) {
  EXPECT_TRUE(ValidateUtf8("").ok());
  EXPECT_TRUE(ValidateUtf8("plain ASCII\n").ok());
  EXPECT_TRUE(ValidateUtf8("é 日本 😀 \xF4\x8F\xBF\xBF").ok());  // up to U+10FFFF
}

TEST(ValidateUtf8, NamesTheOffendingByteOffset) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"ab\xFF"
       "cd",
       "unexpected byte 0xFF at byte offset 2"},
      {"\xC3(", "unexpected byte 0x28 at byte offset 1"},             // lead without continuation
      {"x\xC0\xAF", "unexpected byte 0xC0 at byte offset 1"},         // overlong '/'
      {"\xED\xA0\x80", "unexpected byte 0xA0 at byte offset 1"},      // surrogate U+D800
      {"\xF4\x90\x80\x80", "unexpected byte 0x90 at byte offset 1"},  // past U+10FFFF
      {"ok\x80", "unexpected byte 0x80 at byte offset 2"},            // stray continuation
      {"abc\xE2\x82", "ends inside the multi-byte sequence that starts at byte offset 3"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateUtf8(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string_view::npos) << s.message();
  }
}

TEST(AppendUtf8Lossy, ReplacesEachMaximalSubpartOnce) {
  EXPECT_EQ(Lossy("a\x80\x80"
                  "b"),
            "a\uFFFD\uFFFDb");
  EXPECT_EQ(Lossy("\xE2\x82("), "\uFFFD(");                // E2 82 is one maximal subpart
  EXPECT_EQ(Lossy("\xF0\x9F\x98"), "\uFFFD");              // cut off at the end
  EXPECT_EQ(Lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // ED cannot be followed by A0
  EXPECT_EQ(Lossy("é😀"), "é😀");
}

TEST(AppendUtf8Lossy, HoldsBackACutOffSequenceUnlessFinal) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x9F", /*final=*/false, &out), 2);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("ab\xFF", /*final=*/false, &out), 3);  // can never complete
  EXPECT_EQ(out, "ab\uFFFD");
}

// Converting in pieces, carrying over what each call did not consume, gives what one call
// over all the bytes gives: the contract StreamDecoder relies on.
TEST(AppendUtf8Lossy, PiecewiseEqualsWhole) {
  std::mt19937 rng(7);
  const std::string alphabet = "a\x80\xBF\xC3\xA9\xE2\x82\xAC\xED\xA0\xF0\x9F\x98\x80\xF4\x90\xFF";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes;
    const int len = rng() % 12;
    for (int i = 0; i < len; ++i) bytes += alphabet[rng() % alphabet.size()];
    std::string pieced;
    std::string pending;
    size_t pos = 0;
    while (pos < bytes.size()) {
      const size_t take = 1 + rng() % 3;
      pending += bytes.substr(pos, take);
      pos += take;
      pending.erase(0, AppendUtf8Lossy(pending, /*final=*/false, &pieced));
    }
    AppendUtf8Lossy(pending, /*final=*/true, &pieced);
    EXPECT_EQ(pieced, Lossy(bytes)) << "trial " << trial;
  }
}

TEST(Utf8, EncodeDecodeRoundTrip) {
  for (char32_t cp : {U'A', U'\u00E9', U'\u65E5', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    AppendUtf8(cp, &s);
    EXPECT_TRUE(ValidateUtf8(s).ok());
    EXPECT_EQ(Utf8SequenceLength(s), s.size());
    size_t pos = 0;
    EXPECT_EQ(DecodeUtf8At(s, &pos), cp);
    EXPECT_EQ(pos, s.size());
  }
  EXPECT_EQ(Utf8SequenceLength("\xE2\x82"), 0);
}

}  // namespace
}  // namespace sluice::model
