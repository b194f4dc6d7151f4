// Where the model keeps each sequence's keys and values between forward passes.
//
// The forward writes the post-RoPE K and V of new tokens for one layer at a time, reads back a
// contiguous view for attention, and commits the tokens once every layer has written them.
// `ContiguousKvCache` is the plain implementation (one fp32 buffer per sequence); the
// compressed paged store in kvstore/ implements the same interface.
#ifndef SLUICE_MODEL_KV_CACHE_H_
#define SLUICE_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace sluice::model {

struct KvView {
  const float* k = nullptr;  // [tokens, kv_heads, head_dim]
  const float* v = nullptr;  // [tokens, kv_heads, head_dim]
  int64_t tokens = 0;
};

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
  // The first `tokens` tokens of `layer` (committed plus written), contiguous.
  virtual absl::StatusOr<KvView> View(int64_t seq, int layer, int64_t tokens) = 0;
  // Makes `n` written tokens part of the sequence.
  virtual absl::Status Commit(int64_t seq, int64_t n) = 0;
};

class ContiguousKvCache final : public KvCache {
 public:
  ContiguousKvCache(int layers, int64_t kv_heads, int64_t head_dim)
      : layers_(layers), row_(kv_heads * head_dim) {}

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override;
  absl::Status RemoveSequence(int64_t seq) override;
  absl::StatusOr<int64_t> Length(int64_t seq) const override;
  absl::Status Write(int64_t seq, int layer, const float* k, const float* v, int64_t n) override;
  absl::StatusOr<KvView> View(int64_t seq, int layer, int64_t tokens) override;
  absl::Status Commit(int64_t seq, int64_t n) override;

  int64_t live_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  // Bytes held by all live sequences.
  int64_t bytes() const;

 private:
  struct Seq {
    int64_t capacity = 0;
    int64_t length = 0;
    std::vector<float> k, v;  // [layers, capacity, row]
  };
  absl::StatusOr<Seq*> Find(int64_t seq);

  const int layers_;
  const int64_t row_;
  absl::flat_hash_map<int64_t, Seq> seqs_;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_KV_CACHE_H_
