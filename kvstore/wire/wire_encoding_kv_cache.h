// A KvCache decorator that codes the prompt rows of chosen sequences into transform-coded wire
// streams (kv_wire_codec.h) as the model writes them, chunk by chunk: the prefill worker's side
// of the transform-coded wire, and `sluice eval`'s (which lets the decoded rows, not the
// computed ones, into the cache it wraps, so it measures what a decode worker would hold).
#ifndef SLUICE_KVSTORE_WIRE_WIRE_ENCODING_KV_CACHE_H_
#define SLUICE_KVSTORE_WIRE_WIRE_ENCODING_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "model/kv_cache.h"

namespace sluice::kvstore {

class WireEncodingKvCache final : public model::KvCache {
 public:
  // What the wrapped cache gets of an encoded sequence's rows: the computed ones (a prefill
  // worker: its own attention stays exact) or the decoded ones (an evaluation of the wire).
  enum class Pass { kComputed, kDecoded };
  WireEncodingKvCache(model::KvCache* inner, Pass pass) : inner_(inner), pass_(pass) {}
  WireEncodingKvCache(std::unique_ptr<model::KvCache> inner, Pass pass)
      : owned_(std::move(inner)), inner_(owned_.get()), pass_(pass) {}

  // The sequence's next `options.shape.tokens` tokens, from position 0 (it must have none
  // yet), are coded as they are written. InvalidArgument from the encoder's checks;
  // AlreadyExists when it is being coded.
  absl::Status StartEncoding(int64_t seq, const KvWireEncoder::Options& options);
  // The sequence's stream once all its prompt has been written and committed; its encoder
  // goes. FailedPrecondition if it is not being coded (or a failed step broke its stream).
  absl::StatusOr<std::string> FinishEncoding(int64_t seq);
  // The fp16 bytes of the rows coded so far of `seq` (0 when not coded).
  int64_t EncodedFp16Bytes(int64_t seq) const;

  absl::Status AddSequence(int64_t seq, int64_t max_tokens) override {
    return inner_->AddSequence(seq, max_tokens);
  }
  absl::Status RemoveSequence(int64_t seq) override;
  absl::StatusOr<int64_t> Length(int64_t seq) const override { return inner_->Length(seq); }
  absl::Status BeginStep(absl::Span<const model::StepEntry> batch) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float* out) override {
    return inner_->Attend(layer, q, out);
  }
  absl::Status LayerDone(int layer) override { return inner_->LayerDone(layer); }
  absl::Status Commit() override { return inner_->Commit(); }
  void AbortStep() override;

  model::KvCache& inner() { return *inner_; }

 private:
  struct Entry {
    int64_t seq = 0, tokens = 0, start = 0;
    KvWireEncoder* encoder = nullptr;  // null: not coded
  };
  std::unique_ptr<model::KvCache> owned_;
  model::KvCache* inner_;
  const Pass pass_;
  absl::flat_hash_map<int64_t, std::unique_ptr<KvWireEncoder>> encoders_;
  std::vector<Entry> step_;
  std::vector<float> k_, v_;  // the step's rows as the wrapped cache gets them (kDecoded)
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_WIRE_ENCODING_KV_CACHE_H_
