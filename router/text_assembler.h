// Turns the token stream of one request into text, as the router streams it: detokenizes
// (whole UTF-8 characters only, model::StreamDecoder), ends at a stop token or at the first
// stop string (cut before it), holds back text that may be the start of one, and keeps the
// tokens' logprobs.
//
//   TextAssembler a(tokenizer, stops, sampling);
//   for each token: if (a.Add(token)) break;   send a.Ready(false)
//   a.End(reason);                              send a.Ready(true)
#ifndef SLUICE_ROUTER_TEXT_ASSEMBLER_H_
#define SLUICE_ROUTER_TEXT_ASSEMBLER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "model/sampler.h"
#include "model/tokenizer.h"
#include "proto/sluice.pb.h"
#include "router/openai_api.h"

namespace sluice::router {

class TextAssembler {
 public:
  // `stops` holds the stop strings; `sampling` the stop token ids and whether logprobs are
  // kept. All three must outlive the assembler.
  TextAssembler(const model::Tokenizer& tokenizer, const model::SamplingParams& stops,
                const rpc::SamplingParams& sampling);

  // Adds one token; true when the text must end here (a stop token, which adds no text, or a
  // stop string).
  bool Add(const rpc::GeneratedToken& t);
  // The stream ended with `reason` (unless a stop already ended it): what the decoder held
  // back goes into the text, which a stop string may still end.
  void End(FinishReason reason);
  // Text that can go out now (all of it once ended).
  std::string Ready(bool ended);
  std::vector<TokenLogprob> TakeLogprobs();

  const std::string& text() const { return text_; }
  FinishReason finish() const { return finish_; }
  // The stop string the text ended at; empty otherwise.
  const std::string& stop_reason() const { return stop_reason_; }
  bool stopped_at_string() const { return stopped_; }
  int tokens() const { return tokens_; }

 private:
  // Ends the text before the first stop string in it, if there is one.
  bool CutAtStopString(int32_t token);

  const model::Tokenizer& tokenizer_;
  model::StreamDecoder decoder_;
  const model::SamplingParams& stops_;
  model::StopChecker checker_;
  const rpc::SamplingParams& sampling_;
  std::string text_, stop_reason_;
  size_t sent_ = 0;
  int tokens_ = 0;
  bool stopped_ = false;
  FinishReason finish_ = FinishReason::kNone;
  std::vector<TokenLogprob> logprobs_;
};

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_TEXT_ASSEMBLER_H_
