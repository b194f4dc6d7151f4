// libFuzzer target for the page parser (tools/fuzz.sh builds it with ASan and UBSan).
// Property: parsing never crashes, and every page it accepts re-encodes to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvstore/wire/page_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::kvstore::ParsePage;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto page = ParsePage(bytes, {.max_payload_bytes = 1 << 16, .layers = 64, .kv_heads = 16});
  if (page.ok()) {
    auto again = sluice::kvstore::EncodePage(page->header, page->payload);
    if (!again.ok() || *again != bytes) std::abort();
  }
  return 0;
}
