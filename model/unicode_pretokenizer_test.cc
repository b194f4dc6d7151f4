#include "model/unicode_pretokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::model {
namespace {

std::vector<std::string> Split(PreTokenizer kind, std::string_view text) {
  std::vector<std::string_view> pieces;
  PreTokenize(kind, text, &pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

struct SplitCase {
  std::string text;
  std::vector<std::string> gpt2;
  std::vector<std::string> smollm;
};

// Expected pieces checked against Python's `regex` module running the GPT-2 pattern
// (and, for SmolLM, \p{N} first).
const SplitCase kCases[] = {
    {"Hello world", {"Hello", " world"}, {"Hello", " world"}},
    {"I'm you're they've we'll he'd it's don't",
     {"I", "'m", " you", "'re", " they", "'ve", " we", "'ll", " he", "'d", " it", "'s", " don",
      "'t"},
     {"I", "'m", " you", "'re", " they", "'ve", " we", "'ll", " he", "'d", " it", "'s", " don",
      "'t"}},
    // Contractions are lowercase only.
    {"I'M SHE'LL", {"I", "'", "M", " SHE", "'", "LL"}, {"I", "'", "M", " SHE", "'", "LL"}},
    {"''s", {"''", "s"}, {"''", "s"}},
    {" 's", {" '", "s"}, {" '", "s"}},
    // Digits: one run for GPT-2, one piece each for SmolLM (and the space stays behind).
    {"abc 12345 x", {"abc", " 12345", " x"}, {"abc", " ", "1", "2", "3", "4", "5", " x"}},
    {"3.14", {"3", ".", "14"}, {"3", ".", "1", "4"}},
    {"price: $100!", {"price", ":", " $", "100", "!"}, {"price", ":", " $", "1", "0", "0", "!"}},
    {"\u0663 and \u216B", {"\u0663", " and", " \u216B"}, {"\u0663", " and", " ", "\u216B"}},
    // A whitespace run before a word leaves its last space to the word (\s+(?!\S)).
    {"a   b", {"a", "  ", " b"}, {"a", "  ", " b"}},
    {"  leading", {" ", " leading"}, {" ", " leading"}},
    {"x  \t\n  y", {"x", "  \t\n ", " y"}, {"x", "  \t\n ", " y"}},
    // ... but a digit ends SmolLM's span, so there the run ends the text.
    {"  1", {" ", " 1"}, {"  ", "1"}},
    // Trailing whitespace is one piece.
    {"a  ", {"a", "  "}, {"a", "  "}},
    {"Hello\n\n", {"Hello", "\n\n"}, {"Hello", "\n\n"}},
    // Newlines: a lone one before a word stands alone; only ' ' joins the word.
    {"\n\nHello", {"\n", "\n", "Hello"}, {"\n", "\n", "Hello"}},
    {"a\n\n b", {"a", "\n\n", " b"}, {"a", "\n\n", " b"}},
    {"tab\tsep", {"tab", "\t", "sep"}, {"tab", "\t", "sep"}},
    {"a\u00A0b", {"a", "\u00A0", "b"}, {"a", "\u00A0", "b"}},  // NBSP is \s, not ' '
    {"日本語テキスト", {"日本語テキスト"}, {"日本語テキスト"}},
    {"emoji 😀😀 ok", {"emoji", " 😀😀", " ok"}, {"emoji", " 😀😀", " ok"}},
    {"", {}, {}},
};

TEST(PreTokenize, Gpt2) {
  for (const SplitCase& c : kCases) EXPECT_EQ(Split(PreTokenizer::kGpt2, c.text), c.gpt2) << c.text;
}

TEST(PreTokenize, SmolLm) {
  for (const SplitCase& c : kCases) {
    EXPECT_EQ(Split(PreTokenizer::kSmolLm, c.text), c.smollm) << c.text;
  }
}

TEST(PreTokenizerFromName, KnowsTheSupportedNames) {
  EXPECT_EQ(*PreTokenizerFromName("smollm"), PreTokenizer::kSmolLm);
  EXPECT_EQ(*PreTokenizerFromName("default"), PreTokenizer::kGpt2);
  EXPECT_EQ(*PreTokenizerFromName("gpt-2"), PreTokenizer::kGpt2);
  const auto unknown = PreTokenizerFromName("llama-bpe");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(unknown.status().message().find("llama-bpe"), std::string_view::npos);
}

}  // namespace
}  // namespace sluice::model
