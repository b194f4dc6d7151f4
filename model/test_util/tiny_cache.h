// A paged KV cache shaped for a TinyLlamaSpec model, on any backend.
#ifndef SLUICE_MODEL_TEST_UTIL_TINY_CACHE_H_
#define SLUICE_MODEL_TEST_UTIL_TINY_CACHE_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "model/test_util/tiny_llama.h"

namespace sluice::model::testing {

// `preset`'s pages (kvstore::FindKvPreset) behind a residual window of `residual` fp32 tokens;
// by default fp16 pages behind a window longer than any test sequence, so that every token
// stays in fp32 and results compare exactly.
absl::StatusOr<std::unique_ptr<kvstore::PagedKvCache>> MakeTinyCache(
    const TinyLlamaSpec& spec, kernels::Backend& backend, std::string_view preset = "fp16",
    int32_t residual = 1024, int64_t pages = 512);

}  // namespace sluice::model::testing

#endif  // SLUICE_MODEL_TEST_UTIL_TINY_CACHE_H_
