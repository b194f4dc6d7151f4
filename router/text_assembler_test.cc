#include "router/text_assembler.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"

namespace sluice::router {
namespace {

// Tokens: 0 "h", 1 "i", 2 "!", 3 the byte 0xC3 (half of a character), 4 "a", 5 "b".
std::unique_ptr<model::Tokenizer> Vocab() {
  model::VocabSpec spec;
  spec.tokens = {"h", "i", "!", "\xC3\x83", "a", "b"};  // GPT-2 spellings
  auto t = model::Tokenizer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

rpc::GeneratedToken Token(int32_t id) {
  rpc::GeneratedToken t;
  t.set_token(id);
  return t;
}

struct Streamed {
  std::string sent;  // what Ready let out, piece by piece
  bool stopped = false;
};

Streamed Stream(TextAssembler& a, const std::vector<int32_t>& ids) {
  Streamed r;
  for (int32_t id : ids) {
    r.stopped = a.Add(Token(id));
    r.sent += a.Ready(false);
    if (r.stopped) break;
  }
  a.End(FinishReason::kLength);
  r.sent += a.Ready(true);
  return r;
}

TEST(TextAssembler, CutsBeforeTheFirstStopStringAndHoldsBackItsStart) {
  auto tok = Vocab();
  model::SamplingParams stops;
  stops.stop_strings = {"i!"};
  rpc::SamplingParams sampling;
  TextAssembler a(*tok, stops, sampling);
  EXPECT_FALSE(a.Add(Token(0)));
  EXPECT_EQ(a.Ready(false), "h");
  EXPECT_FALSE(a.Add(Token(1)));
  EXPECT_EQ(a.Ready(false), "");  // "i" may start "i!"
  EXPECT_TRUE(a.Add(Token(2)));
  a.End(FinishReason::kLength);
  EXPECT_EQ(a.Ready(true), "");
  EXPECT_EQ(a.text(), "h");
  EXPECT_EQ(a.stop_reason(), "i!");
  EXPECT_EQ(a.finish(), FinishReason::kStop);
  EXPECT_EQ(a.tokens(), 3);
}

TEST(TextAssembler, AStopStringTheFinalFlushCompletesIsCut) {
  // The stream ends on half a character: the decoder's flush gives U+FFFD, which completes
  // the stop string "h\uFFFD"; nothing of it goes out.
  auto tok = Vocab();
  model::SamplingParams stops;
  stops.stop_strings = {"h\xEF\xBF\xBD"};
  rpc::SamplingParams sampling;
  TextAssembler a(*tok, stops, sampling);
  const Streamed r = Stream(a, {4, 0, 3});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.sent, "a");
  EXPECT_EQ(a.text(), "a");
  EXPECT_EQ(a.stop_reason(), "h\xEF\xBF\xBD");
  EXPECT_TRUE(a.stopped_at_string());
  EXPECT_EQ(a.finish(), FinishReason::kStop);
}

TEST(TextAssembler, AStopTokenEndsWithoutText) {
  auto tok = Vocab();
  model::SamplingParams stops;
  rpc::SamplingParams sampling;
  sampling.add_stop_token_ids(2);
  TextAssembler a(*tok, stops, sampling);
  const Streamed r = Stream(a, {0, 1, 2, 4});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.sent, "hi");
  EXPECT_EQ(a.finish(), FinishReason::kStop);
  EXPECT_FALSE(a.stopped_at_string());
  EXPECT_EQ(a.stop_reason(), "");
}

TEST(TextAssembler, WithoutStopsEverythingGoesOutAndTheEndNamesTheReason) {
  auto tok = Vocab();
  model::SamplingParams stops;
  rpc::SamplingParams sampling;
  sampling.set_logprobs(true);
  TextAssembler a(*tok, stops, sampling);
  const Streamed r = Stream(a, {0, 1, 3});
  EXPECT_EQ(r.sent, "hi\xEF\xBF\xBD");
  EXPECT_EQ(a.finish(), FinishReason::kLength);
  EXPECT_EQ(a.TakeLogprobs().size(), 3u);
  EXPECT_TRUE(a.TakeLogprobs().empty());
}

}  // namespace
}  // namespace sluice::router
