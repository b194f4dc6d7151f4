#include "model/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::model {

absl::Status ContiguousKvCache::AddSequence(int64_t seq, int64_t max_tokens) {
  if (max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("max_tokens=%d must be > 0", max_tokens));
  }
  if (seqs_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrFormat("sequence %d already has a KV cache", seq));
  }
  Seq& s = seqs_[seq];
  s.capacity = max_tokens;
  s.k.resize(layers_ * max_tokens * row_);
  s.v.resize(layers_ * max_tokens * row_);
  return absl::OkStatus();
}

absl::Status ContiguousKvCache::RemoveSequence(int64_t seq) {
  if (seqs_.erase(seq) == 0) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<ContiguousKvCache::Seq*> ContiguousKvCache::Find(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  return &it->second;
}

absl::StatusOr<int64_t> ContiguousKvCache::Length(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrFormat("sequence %d has no KV cache", seq));
  }
  return it->second.length;
}

absl::Status ContiguousKvCache::Write(int64_t seq, int layer, const float* k, const float* v,
                                      int64_t n) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (layer < 0 || layer >= layers_) {
    return absl::InvalidArgumentError(absl::StrFormat("layer %d out of [0, %d)", layer, layers_));
  }
  if (n < 0 || s->length + n > s->capacity) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "sequence %d: %d + %d tokens exceed its KV room of %d", seq, s->length, n, s->capacity));
  }
  const int64_t at = (layer * s->capacity + s->length) * row_;
  std::copy(k, k + n * row_, s->k.begin() + at);
  std::copy(v, v + n * row_, s->v.begin() + at);
  return absl::OkStatus();
}

absl::StatusOr<KvView> ContiguousKvCache::View(int64_t seq, int layer, int64_t tokens) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (layer < 0 || layer >= layers_ || tokens < 0 || tokens > s->capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("view of layer %d, %d tokens, of sequence %d", layer, tokens, seq));
  }
  const int64_t at = layer * s->capacity * row_;
  return KvView{s->k.data() + at, s->v.data() + at, tokens};
}

absl::Status ContiguousKvCache::Commit(int64_t seq, int64_t n) {
  SLUICE_ASSIGN_OR_RETURN(Seq * s, Find(seq));
  if (n < 0 || s->length + n > s->capacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("sequence %d: cannot commit %d tokens", seq, n));
  }
  s->length += n;
  return absl::OkStatus();
}

int64_t ContiguousKvCache::bytes() const {
  int64_t total = 0;
  for (const auto& [id, s] : seqs_) total += (s.k.size() + s.v.size()) * sizeof(float);
  return total;
}

}  // namespace sluice::model
