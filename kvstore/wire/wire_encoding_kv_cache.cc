#include "kvstore/wire/wire_encoding_kv_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::kvstore {

absl::Status WireEncodingKvCache::StartEncoding(int64_t seq,
                                                const KvWireEncoder::Options& options) {
  if (encoders_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrFormat("sequence %d is already being coded", seq));
  }
  SLUICE_ASSIGN_OR_RETURN(const int64_t length, inner_->Length(seq));
  if (length != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence %d has %d tokens; the wire codes a prompt from its first", seq, length));
  }
  SLUICE_ASSIGN_OR_RETURN(KvWireEncoder encoder, KvWireEncoder::Create(options));
  encoders_.emplace(seq, std::make_unique<KvWireEncoder>(std::move(encoder)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> WireEncodingKvCache::FinishEncoding(int64_t seq) {
  auto it = encoders_.find(seq);
  if (it == encoders_.end()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("sequence %d has no wire stream (never started, or a step failed)", seq));
  }
  std::unique_ptr<KvWireEncoder> encoder = std::move(it->second);
  encoders_.erase(it);
  return encoder->Finish();
}

int64_t WireEncodingKvCache::EncodedFp16Bytes(int64_t seq) const {
  auto it = encoders_.find(seq);
  return it == encoders_.end() ? 0 : it->second->fp16_bytes();
}

absl::Status WireEncodingKvCache::RemoveSequence(int64_t seq) {
  SLUICE_RETURN_IF_ERROR(inner_->RemoveSequence(seq));
  encoders_.erase(seq);
  return absl::OkStatus();
}

absl::Status WireEncodingKvCache::BeginStep(absl::Span<const model::StepEntry> batch) {
  step_.clear();
  for (const model::StepEntry& e : batch) {
    Entry entry{.seq = e.seq, .tokens = e.tokens};
    if (auto it = encoders_.find(e.seq); it != encoders_.end()) {
      SLUICE_ASSIGN_OR_RETURN(entry.start, inner_->Length(e.seq));
      entry.encoder = it->second.get();
    }
    step_.push_back(entry);
  }
  return inner_->BeginStep(batch);
}

absl::Status WireEncodingKvCache::Write(int layer, const float* k, const float* v) {
  const bool coded =
      std::any_of(step_.begin(), step_.end(), [](const Entry& e) { return e.encoder != nullptr; });
  if (!coded) return inner_->Write(layer, k, v);
  int64_t rows = 0;
  for (const Entry& e : step_) rows += e.tokens;
  const bool decoded = pass_ == Pass::kDecoded;
  const float* to_k = k;
  const float* to_v = v;
  int64_t row_floats = 0;
  for (const Entry& e : step_) {
    if (e.encoder != nullptr) row_floats = e.encoder->row_floats();
  }
  if (decoded) {
    k_.assign(k, k + rows * row_floats);
    v_.assign(v, v + rows * row_floats);
    to_k = k_.data();
    to_v = v_.data();
  }
  int64_t row = 0;
  for (const Entry& e : step_) {
    if (e.encoder != nullptr) {
      const size_t at = static_cast<size_t>(row * row_floats);
      SLUICE_RETURN_IF_ERROR(e.encoder->Add(layer, e.start, e.tokens, k + at, v + at,
                                            decoded ? k_.data() + at : nullptr,
                                            decoded ? v_.data() + at : nullptr));
    }
    row += e.tokens;
  }
  return inner_->Write(layer, to_k, to_v);
}

void WireEncodingKvCache::AbortStep() {
  // A stream missing the step's rows cannot be finished: its sequence's prompt failed.
  for (const Entry& e : step_) {
    if (e.encoder != nullptr) encoders_.erase(e.seq);
  }
  step_.clear();
  inner_->AbortStep();
}

}  // namespace sluice::kvstore
