#include "model/test_util/tiny_cache.h"

#include "common/status_macros.h"

namespace sluice::model::testing {

absl::StatusOr<std::unique_ptr<kvstore::PagedKvCache>> MakeTinyCache(const TinyLlamaSpec& spec,
                                                                     kernels::Backend& backend,
                                                                     std::string_view preset,
                                                                     int32_t residual,
                                                                     int64_t pages) {
  const int64_t head_dim = spec.hidden / spec.heads;
  SLUICE_ASSIGN_OR_RETURN(kvstore::KvPreset p,
                          kvstore::FindKvPreset(preset, static_cast<int32_t>(head_dim), 4096));
  p.residual = residual;
  return kvstore::PagedKvCache::Create({.layers = spec.layers,
                                        .heads = spec.heads,
                                        .kv_heads = spec.kv_heads,
                                        .head_dim = head_dim,
                                        .preset = p,
                                        .pages = pages},
                                       backend);
}

}  // namespace sluice::model::testing
