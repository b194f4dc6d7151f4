// Where the model keeps each sequence's keys and values between forward passes.
//
// The forward writes the post-RoPE K and V of new tokens for one layer at a time, asks the cache
// for those tokens' attention (the cache decides how its keys and values are stored and read),
// and commits the tokens once every layer has written them. kvstore::PagedKvCache implements it
// over compressed pages.
#ifndef SLUICE_MODEL_KV_CACHE_H_
#define SLUICE_MODEL_KV_CACHE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace sluice::model {

class KvCache {
 public:
  virtual ~KvCache() = default;

  // Starts sequence `seq` with room for `max_tokens`; AlreadyExists if it is live.
  virtual absl::Status AddSequence(int64_t seq, int64_t max_tokens) = 0;
  // Releases everything the sequence holds; NotFound if it is not live.
  virtual absl::Status RemoveSequence(int64_t seq) = 0;
  // Committed tokens of `seq`.
  virtual absl::StatusOr<int64_t> Length(int64_t seq) const = 0;
  // Stores `n` new tokens of `layer` after the committed ones. k and v: [n, kv_heads, head_dim].
  // ResourceExhausted when the sequence would outgrow its room.
  virtual absl::Status Write(int64_t seq, int layer, const float* k, const float* v, int64_t n) = 0;
  // Attention of the `n` tokens just written to `layer`: query t (RoPE applied) sits at position
  // Length(seq) + t and attends to every token before it and itself, grouped-query.
  // q and out: [n, heads, head_dim].
  virtual absl::Status Attend(int64_t seq, int layer, const float* q, int64_t n, float* out) = 0;
  // Makes `n` written tokens part of the sequence.
  virtual absl::Status Commit(int64_t seq, int64_t n) = 0;
  // Says that every sequence of the pass has attended in `layer`: its `n` new tokens' K and V
  // in that layer are final. Caches that stream a prompt's KV layer by layer act on it; the
  // default does nothing.
  virtual absl::Status LayerDone(int64_t seq, int layer, int64_t n) { return absl::OkStatus(); }
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_KV_CACHE_H_
