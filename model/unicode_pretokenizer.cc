#include "model/unicode_pretokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "model/unicode_utf8.h"

namespace sluice::model {
namespace {

// The four classes the GPT-2 regex tells apart. White_Space (\s), L and N are disjoint.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass ClassifySlow(char32_t cp) {
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(static_cast<UChar32>(cp));
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

CharClass Classify(char32_t cp) {
  static const std::array<CharClass, 128> kAscii = [] {
    std::array<CharClass, 128> table;
    for (char32_t c = 0; c < 128; ++c) table[c] = ClassifySlow(c);
    return table;
  }();
  return cp < 128 ? kAscii[cp] : ClassifySlow(cp);
}

// The text as code points: cps[i] starts at byte offs[i]; offs[n] == text.size().
struct CodePoints {
  std::vector<char32_t> cps;
  std::vector<CharClass> cls;
  std::vector<size_t> offs;
};

CodePoints Decode(std::string_view text) {
  CodePoints cp;
  cp.cps.reserve(text.size());
  cp.cls.reserve(text.size());
  cp.offs.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    cp.offs.push_back(pos);
    const char32_t c = DecodeUtf8At(text, &pos);
    cp.cps.push_back(c);
    cp.cls.push_back(Classify(c));
  }
  cp.offs.push_back(text.size());
  return cp;
}

// The GPT-2 regex over code points [begin, end), with `end` acting as the end of the text
// (Hugging Face runs the regex on each span the Digits step leaves; llama.cpp does the same).
void SplitGpt2(const CodePoints& t, size_t begin, size_t end, std::string_view text,
               std::vector<std::string_view>* pieces) {
  auto emit = [&](size_t a, size_t b) {
    pieces->push_back(text.substr(t.offs[a], t.offs[b] - t.offs[a]));
  };
  size_t i = begin;
  while (i < end) {
    const char32_t c = t.cps[i];
    // 's|'t|'re|'ve|'m|'ll|'d  (lowercase only, as in GPT-2's regex)
    if (c == U'\'' && i + 1 < end) {
      const char32_t c1 = t.cps[i + 1];
      if (c1 == U's' || c1 == U't' || c1 == U'm' || c1 == U'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < end) {
        const char32_t c2 = t.cps[i + 2];
        if ((c1 == U'r' && c2 == U'e') || (c1 == U'v' && c2 == U'e') ||
            (c1 == U'l' && c2 == U'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': an optional ASCII space, then a run of one class.
    const size_t k = (c == U' ' && i + 1 < end) ? i + 1 : i;
    const CharClass run = t.cls[k];
    if (run != CharClass::kSpace) {
      size_t j = k + 1;
      while (j < end && t.cls[j] == run) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // \s+(?!\S)|\s+ : a whitespace run ending the span is one piece; one followed by
    // something else leaves its last code point to start the next piece (which takes it
    // only when it is ' ' and a letter, number or symbol follows; else it stands alone).
    size_t j = i + 1;
    while (j < end && t.cls[j] == CharClass::kSpace) ++j;
    if (j < end && j - i >= 2) --j;
    emit(i, j);
    i = j;
  }
}

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name) {
  if (name == "default" || name == "gpt-2") return PreTokenizer::kGpt2;
  if (name == "smollm") return PreTokenizer::kSmolLm;
  return absl::UnimplementedError(absl::StrFormat(
      "pre-tokenizer \"%s\" is not supported (supported: \"default\", \"gpt-2\", \"smollm\")",
      name));
}

void PreTokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* pieces) {
  if (text.empty()) return;
  const CodePoints t = Decode(text);
  const size_t n = t.cps.size();
  if (kind == PreTokenizer::kGpt2) {
    SplitGpt2(t, 0, n, text, pieces);
    return;
  }
  // kSmolLm: every \p{N} code point is a piece of its own; the spans between go to GPT-2.
  size_t span = 0;
  for (size_t i = 0; i < n; ++i) {
    if (t.cls[i] != CharClass::kNumber) continue;
    SplitGpt2(t, span, i, text, pieces);
    pieces->push_back(text.substr(t.offs[i], t.offs[i + 1] - t.offs[i]));
    span = i + 1;
  }
  SplitGpt2(t, span, n, text, pieces);
}

}  // namespace sluice::model
