// Pre-tokenization for byte-level BPE: splitting text into the pieces BPE merges within,
// written by hand over code points with ICU general categories. It reproduces the GPT-2
// regex (Hugging Face ByteLevel(use_regex=true), llama.cpp's "default"/"gpt-2" pre-tokenizer)
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// including the lookahead no common regex library offers, and SmolLM's variant, which first
// isolates every \p{N} code point (Hugging Face Digits(individual_digits=true)) and then
// applies the GPT-2 regex to each remaining span on its own.
#ifndef SLUICE_MODEL_UNICODE_PRETOKENIZER_H_
#define SLUICE_MODEL_UNICODE_PRETOKENIZER_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::model {

enum class PreTokenizer {
  kGpt2,    // the GPT-2 regex alone
  kSmolLm,  // each \p{N} code point alone, then the GPT-2 regex
};

// Maps a GGUF `tokenizer.ggml.pre` name ("default", "gpt-2", "smollm") to its splitter;
// UnimplementedError naming any other.
absl::StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name);

// Appends the pieces of `text`, in order and covering it exactly, to `pieces` (views into
// `text`). Precondition: `text` is valid UTF-8 (see ValidateUtf8).
void PreTokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_UNICODE_PRETOKENIZER_H_
