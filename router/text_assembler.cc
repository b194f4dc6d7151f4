#include "router/text_assembler.h"

#include <algorithm>
#include <utility>

namespace sluice::router {

TextAssembler::TextAssembler(const model::Tokenizer& tokenizer, const model::SamplingParams& stops,
                             const rpc::SamplingParams& sampling)
    : tokenizer_(tokenizer),
      decoder_(tokenizer),
      stops_(stops),
      checker_(stops),
      sampling_(sampling) {}

bool TextAssembler::Add(const rpc::GeneratedToken& t) {
  ++tokens_;
  const bool stop_token =
      std::find(sampling_.stop_token_ids().begin(), sampling_.stop_token_ids().end(), t.token()) !=
      sampling_.stop_token_ids().end();
  if (stop_token) {
    finish_ = FinishReason::kStop;
    return true;
  }
  if (sampling_.logprobs()) {
    TokenLogprob lp{.token = std::string(tokenizer_.TokenBytes(t.token())), .logprob = t.logprob()};
    for (const rpc::TopLogprob& top : t.top()) {
      lp.top.emplace_back(std::string(tokenizer_.TokenBytes(top.token())), top.logprob());
    }
    logprobs_.push_back(std::move(lp));
  }
  text_ += decoder_.Push(t.token());
  return CutAtStopString(t.token());
}

void TextAssembler::End(FinishReason reason) {
  if (!stopped_) {
    // The flush may complete a stop string (a cut-off character comes out as U+FFFD).
    text_ += decoder_.Flush();
    CutAtStopString(-1);
  }
  if (finish_ == FinishReason::kNone) finish_ = reason;
}

std::string TextAssembler::Ready(bool ended) {
  const size_t end = ended ? text_.size() : text_.size() - checker_.HoldBack(text_);
  std::string out = end > sent_ ? text_.substr(sent_, end - sent_) : "";
  sent_ = std::max(sent_, end);
  return out;
}

std::vector<TokenLogprob> TextAssembler::TakeLogprobs() { return std::exchange(logprobs_, {}); }

bool TextAssembler::CutAtStopString(int32_t token) {
  size_t end = 0;
  if (checker_.Check(token, tokens_, text_, &end) != model::StopChecker::Reason::kStopString) {
    return false;
  }
  for (const std::string& s : stops_.stop_strings) {
    if (text_.compare(end, s.size(), s) == 0) stop_reason_ = s;
  }
  text_.resize(end);
  finish_ = FinishReason::kStop;
  stopped_ = true;
  return true;
}

}  // namespace sluice::router
