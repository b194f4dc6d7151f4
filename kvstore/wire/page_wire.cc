#include "kvstore/wire/page_wire.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "kvstore/wire/crc32c.h"

namespace sluice::kvstore {
namespace {

constexpr size_t kCrcOffset = 40;

template <typename T>
void Put(char* at, T v) {
  std::memcpy(at, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
}

template <typename T>
T Get(const char* at) {
  T v;
  std::memcpy(&v, at, sizeof(T));
  return v;
}

uint32_t PageCrc(const char* header, std::string_view payload) {
  return Crc32c(payload.data(), payload.size(), Crc32c(header, kCrcOffset));
}

}  // namespace

absl::StatusOr<std::string> EncodePage(const PageHeader& h, std::string_view payload) {
  if (h.token_count == 0) return absl::InvalidArgumentError("a page must hold at least one token");
  if (payload.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("page payload of %d bytes does not fit the wire format", payload.size()));
  }
  if (h.tier != PageTier::kHigh && h.tier != PageTier::kLow) {
    return absl::InvalidArgumentError("unknown page tier");
  }
  std::string out(kPageHeaderBytes + payload.size(), '\0');
  char* p = out.data();
  Put<uint32_t>(p + 0, kPageMagic);
  Put<uint16_t>(p + 4, kPageWireVersion);
  Put<uint8_t>(p + 6, static_cast<uint8_t>(h.tier));
  Put<uint8_t>(p + 7, 0);
  Put<uint64_t>(p + 8, h.sequence_id);
  Put<uint32_t>(p + 16, h.layer);
  Put<uint32_t>(p + 20, h.kv_head);
  Put<uint32_t>(p + 24, h.page_index);
  Put<uint32_t>(p + 28, h.token_count);
  Put<uint32_t>(p + 32, h.codebook_id);
  Put<uint32_t>(p + 36, static_cast<uint32_t>(payload.size()));
  if (!payload.empty()) std::memcpy(p + kPageHeaderBytes, payload.data(), payload.size());
  Put<uint32_t>(p + kCrcOffset, PageCrc(p, payload));
  return out;
}

absl::StatusOr<ParsedPage> ParsePage(std::string_view bytes, const PageLimits& limits) {
  if (bytes.size() < kPageHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "page truncated: %d bytes, the header alone takes %d", bytes.size(), kPageHeaderBytes));
  }
  const char* p = bytes.data();
  const uint32_t magic = Get<uint32_t>(p + 0);
  if (magic != kPageMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a sluice page: magic 0x%08x, want 0x%08x", magic, kPageMagic));
  }
  const uint16_t version = Get<uint16_t>(p + 4);
  if (version != kPageWireVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page wire version %d is not supported (this build speaks %d)", version, kPageWireVersion));
  }
  ParsedPage page;
  PageHeader& h = page.header;
  h.sequence_id = Get<uint64_t>(p + 8);
  h.layer = Get<uint32_t>(p + 16);
  h.kv_head = Get<uint32_t>(p + 20);
  h.page_index = Get<uint32_t>(p + 24);
  h.token_count = Get<uint32_t>(p + 28);
  h.codebook_id = Get<uint32_t>(p + 32);
  const std::string which = absl::StrFormat("page %d of sequence %d (layer %d, kv head %d)",
                                            h.page_index, h.sequence_id, h.layer, h.kv_head);
  const uint8_t tier = Get<uint8_t>(p + 6);
  if (tier > static_cast<uint8_t>(PageTier::kLow)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: unknown tier %d", which, tier));
  }
  h.tier = static_cast<PageTier>(tier);
  if (Get<uint8_t>(p + 7) != 0 || Get<uint32_t>(p + 44) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: reserved header bits are set", which));
  }
  const uint32_t payload_bytes = Get<uint32_t>(p + 36);
  if (payload_bytes > limits.max_payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: payload of %d bytes exceeds the %d-byte page", which, payload_bytes,
                        limits.max_payload_bytes));
  }
  if (payload_bytes != bytes.size() - kPageHeaderBytes) {
    return absl::DataLossError(absl::StrFormat("%s: header announces %d payload bytes, %d arrived",
                                               which, payload_bytes,
                                               bytes.size() - kPageHeaderBytes));
  }
  if (h.token_count == 0 || h.token_count > limits.max_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: token count %d outside [1, %d]", which,
                                                      h.token_count, limits.max_tokens));
  }
  if (limits.layers != 0 && h.layer >= limits.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: layer %d but the model has %d", which, h.layer, limits.layers));
  }
  if (limits.kv_heads != 0 && h.kv_head >= limits.kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: kv head %d but the model has %d", which, h.kv_head, limits.kv_heads));
  }
  page.payload = bytes.substr(kPageHeaderBytes);
  const uint32_t want = Get<uint32_t>(p + kCrcOffset);
  const uint32_t got = PageCrc(p, page.payload);
  if (got != want) {
    return absl::DataLossError(absl::StrFormat(
        "%s failed its CRC32C check (0x%08x, header says 0x%08x)", which, got, want));
  }
  return page;
}

}  // namespace sluice::kvstore
