#include "model/unicode_utf8.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace sluice::model {
namespace {

enum class Scan { kValid, kInvalid, kTruncated };

struct ScanResult {
  Scan kind;
  size_t length;  // kValid: the sequence; kInvalid: the maximal subpart; kTruncated: the rest
};

// Classifies the bytes at the start of `b` (non-empty) per Unicode Table 3-7.
ScanResult ScanSequence(std::string_view b) {
  const uint8_t lead = static_cast<uint8_t>(b[0]);
  if (lead < 0x80) return {Scan::kValid, 1};
  size_t need;        // continuation bytes after the lead
  uint8_t lo = 0x80;  // allowed range of the first continuation byte
  uint8_t hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {Scan::kInvalid, 1};  // 80..C1 and F5..FF never start a sequence
  }
  for (size_t i = 1; i <= need; ++i) {
    if (i >= b.size()) return {Scan::kTruncated, b.size()};
    const uint8_t c = static_cast<uint8_t>(b[i]);
    if (c < lo || c > hi) return {Scan::kInvalid, i};
    lo = 0x80;
    hi = 0xBF;
  }
  return {Scan::kValid, need + 1};
}

}  // namespace

size_t Utf8SequenceLength(std::string_view bytes) {
  if (bytes.empty()) return 0;
  const ScanResult r = ScanSequence(bytes);
  return r.kind == Scan::kValid ? r.length : 0;
}

absl::Status ValidateUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const ScanResult r = ScanSequence(text.substr(pos));
    if (r.kind == Scan::kValid) {
      pos += r.length;
      continue;
    }
    if (r.kind == Scan::kTruncated) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "text is not valid UTF-8: it ends inside the multi-byte sequence that starts at byte "
          "offset %d",
          pos));
    }
    // The offending byte: the lead itself when it can start no sequence, else the first
    // byte that does not continue it.
    const uint8_t lead = static_cast<uint8_t>(text[pos]);
    const bool bad_lead = lead >= 0x80 && (lead < 0xC2 || lead > 0xF4);
    const size_t at = bad_lead ? pos : pos + r.length;
    return absl::InvalidArgumentError(
        absl::StrFormat("text is not valid UTF-8: unexpected byte 0x%02X at byte offset %d",
                        static_cast<uint8_t>(text[at]), at));
  }
  return absl::OkStatus();
}

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  size_t pos = 0;
  size_t valid_start = 0;  // start of the pending run of valid bytes, appended in one go
  while (pos < bytes.size()) {
    const ScanResult r = ScanSequence(bytes.substr(pos));
    if (r.kind == Scan::kValid) {
      pos += r.length;
      continue;
    }
    out->append(bytes.substr(valid_start, pos - valid_start));
    if (r.kind == Scan::kTruncated && !final) return pos;
    out->append(kUtf8Replacement);
    pos += r.length;
    valid_start = pos;
  }
  out->append(bytes.substr(valid_start, pos - valid_start));
  return pos;
}

char32_t DecodeUtf8At(std::string_view text, size_t* pos) {
  const uint8_t lead = static_cast<uint8_t>(text[*pos]);
  if (lead < 0x80) {
    ++*pos;
    return lead;
  }
  size_t len;
  char32_t cp;
  if (lead < 0xE0) {
    len = 2;
    cp = lead & 0x1F;
  } else if (lead < 0xF0) {
    len = 3;
    cp = lead & 0x0F;
  } else {
    len = 4;
    cp = lead & 0x07;
  }
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[*pos + i]) & 0x3F);
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace sluice::model
