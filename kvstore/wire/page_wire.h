// The page wire format: how one compressed KV page travels between workers.
//
// A 48-byte little-endian header followed by the page bytes:
//   offset  field         type  meaning
//        0  magic         u32   "SLPG"
//        4  version       u16   1
//        6  tier          u8    0 = high precision, 1 = low precision
//        7  flags         u8    reserved, 0
//        8  sequence_id   u64
//       16  layer         u32
//       20  kv_head       u32
//       24  page_index    u32   position in the (sequence, layer, kv_head) page table
//       28  token_count   u32   tokens held, >= 1
//       32  codebook_id   u32   Huffman codebook of the page's layer; 0 = not entropy coded
//       36  payload_bytes u32   bytes after the header
//       40  crc32c        u32   CRC32C of bytes [0, 40) followed by the payload
//       44  reserved      u32   0
// The receiver checks every field against its limits and the checksum before using a page;
// no input from the network can crash it.
#ifndef SLUICE_KVSTORE_WIRE_PAGE_WIRE_H_
#define SLUICE_KVSTORE_WIRE_PAGE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sluice::kvstore {

inline constexpr uint32_t kPageMagic = 0x47504c53;  // "SLPG" little-endian
inline constexpr uint16_t kPageWireVersion = 1;
inline constexpr size_t kPageHeaderBytes = 48;

enum class PageTier : uint8_t { kHigh = 0, kLow = 1 };

struct PageHeader {
  uint64_t sequence_id = 0;
  uint32_t layer = 0;
  uint32_t kv_head = 0;
  uint32_t page_index = 0;
  PageTier tier = PageTier::kHigh;
  uint32_t token_count = 0;
  uint32_t codebook_id = 0;

  bool operator==(const PageHeader&) const = default;
};

// What a receiver accepts. Zero for layers/kv_heads means "not checked".
struct PageLimits {
  uint32_t max_payload_bytes = 16 * 1024;
  uint32_t max_tokens = 16 * 1024;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
};

struct ParsedPage {
  PageHeader header;
  std::string_view payload;  // points into the parsed bytes
};

// Header + payload. InvalidArgument for a token count of 0 or a payload over 4 GiB.
absl::StatusOr<std::string> EncodePage(const PageHeader& header, std::string_view payload);

// Validates and splits a received page. DataLoss for truncation and checksum mismatches,
// InvalidArgument for fields outside `limits`; messages name the page once its ids are read.
absl::StatusOr<ParsedPage> ParsePage(std::string_view bytes, const PageLimits& limits);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_PAGE_WIRE_H_
