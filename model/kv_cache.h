// Where the model keeps each sequence's keys and values between forward passes.
//
// The forward writes the post-RoPE K and V of a batch's new tokens for one layer at a time, asks
// the cache for those tokens' attention (the cache decides how its keys and values are stored
// and read), and commits the tokens once every layer has written them. kvstore::PagedKvCache
// implements it over compressed pages.
#ifndef SLUICE_MODEL_KV_CACHE_H_
#define SLUICE_MODEL_KV_CACHE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::model {

// One sequence's part of a forward pass: its `tokens` new tokens.
struct StepEntry {
  int64_t seq = 0;
  int64_t tokens = 0;
};

// A forward pass is one step: BeginStep plans it for the whole batch, then each layer writes
// the batch's new K and V (Write) and attends once for the whole batch (Attend), and Commit
// ends it (AbortStep instead when the pass fails). The step's rows are the entries' new tokens,
// entry after entry. One step at a time; one owner thread.
class KvCache {
 public:
  virtual ~KvCache() = default;

  // Starts sequence `seq` with room for `max_tokens`; AlreadyExists if it is live.
  virtual absl::Status AddSequence(int64_t seq, int64_t max_tokens) = 0;
  // Releases everything the sequence holds; NotFound if it is not live, FailedPrecondition if
  // the open step holds it.
  virtual absl::Status RemoveSequence(int64_t seq) = 0;
  // Committed tokens of `seq`.
  virtual absl::StatusOr<int64_t> Length(int64_t seq) const = 0;

  // Plans a forward pass over `batch`: distinct live sequences with at least one new token
  // each. InvalidArgument for an empty entry or a sequence named twice, NotFound for an unknown
  // one, ResourceExhausted when one would outgrow its room, FailedPrecondition while another
  // step is open.
  virtual absl::Status BeginStep(absl::Span<const StepEntry> batch) = 0;
  // Stores the step's new tokens of `layer` after the committed ones. k and v: [rows, kv_heads,
  // head_dim], post-RoPE.
  virtual absl::Status Write(int layer, const float* k, const float* v) = 0;
  // Attention of the step's rows in `layer`, written first: row t of an entry sits at position
  // Length(seq) + t and attends to every token of its sequence before it and itself,
  // grouped-query. q and out: [rows, heads, head_dim], RoPE applied to q.
  virtual absl::Status Attend(int layer, const float* q, float* out) = 0;
  // Says that the step has attended in `layer`: its new K and V there are final. Caches that
  // stream a prompt's KV layer by layer act on it; the default does nothing.
  virtual absl::Status LayerDone(int layer) { return absl::OkStatus(); }
  // Ends the step: the new tokens become part of their sequences. FailedPrecondition if a
  // layer was not written.
  virtual absl::Status Commit() = 0;
  // Ends the step without committing (the pass failed): what it wrote is dropped. Does nothing
  // when no step is open.
  virtual void AbortStep() = 0;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_KV_CACHE_H_
