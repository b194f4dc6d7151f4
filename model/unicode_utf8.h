// UTF-8 validation and lossy decoding for the tokenizer: strict validation of input text
// (Unicode Table 3-7: no overlongs, surrogates or code points past U+10FFFF) and the
// replacement of invalid bytes by U+FFFD, one per maximal subpart, as Rust's
// `String::from_utf8_lossy` (and so Hugging Face `tokenizers`) does.
#ifndef SLUICE_MODEL_UNICODE_UTF8_H_
#define SLUICE_MODEL_UNICODE_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace sluice::model {

inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at the start of `bytes`, or 0 when the first
// bytes are not one (including a sequence cut off by the end of `bytes`).
size_t Utf8SequenceLength(std::string_view bytes);

// OK when `text` is well-formed UTF-8; otherwise InvalidArgument naming the byte offset
// and value of the first byte that is not part of a well-formed sequence.
absl::Status ValidateUtf8(std::string_view text);

// Appends `bytes` to `out`, replacing each maximal ill-formed subpart by U+FFFD.
//
// With `final` false it stops before a trailing sequence that is well-formed so far but cut
// off by the end of `bytes` (more bytes may complete it) and returns how many bytes it
// consumed; the caller keeps the rest for later. Appending the consumed prefix and then the
// rest (with more bytes after it) yields what one call over all the bytes would. With
// `final` true it consumes everything; a cut-off sequence becomes one U+FFFD.
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

// Decodes the well-formed UTF-8 sequence at `text[*pos]` and advances `*pos` past it.
// Precondition: `text` passed ValidateUtf8 and `*pos < text.size()`.
char32_t DecodeUtf8At(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_UNICODE_UTF8_H_
