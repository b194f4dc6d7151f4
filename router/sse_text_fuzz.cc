// libFuzzer target for the text a stream carries (tools/fuzz.sh builds it with ASan and UBSan):
// generated tokens become text through model::StreamDecoder (whole UTF-8 characters only),
// model::StopChecker cuts it at the first stop string and holds back what may start one, and
// each piece goes out as a chat chunk event. A tokenizer's pieces, the stop strings and the
// tokens all come from the input; tokens may be outside the vocabulary.
//
// The stream is the router's own TextAssembler (router/text_assembler.h).
//
// Properties:
//   - the decoder's pieces are UTF-8 and add up to Tokenizer::Decode of the same tokens;
//   - every streamed delta is UTF-8 and reads back from its event as sent; the deltas add up
//     to the final text, which is Decode of the tokens taken (without a stop string) or, cut
//     at a stop string, what precedes it; no stop string is ever sent.
//
// Input: a vocabulary (1 + b % 24 pieces, each a byte holding its kind and length, then its
// bytes: raw bytes for normal tokens, text for control ones), the stop strings (b % 5, each a
// length byte and bytes, read as UTF-8 with U+FFFD for what is not), the stop token ids
// (b % 3 bytes), then one byte per generated token (384 at most): id (b % (vocab + 2)) - 1.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/unicode_utf8.h"
#include "nlohmann/json.hpp"
#include "proto/sluice.pb.h"
#include "router/openai_api.h"
#include "router/text_assembler.h"

namespace sluice::router {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "sse_text_fuzz: %s\n", what);
    std::abort();
  }
}

bool IsUtf8(std::string_view s) { return model::ValidateUtf8(s).ok(); }

// Reads the input front to back; past its end, every byte reads as 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::string Bytes(size_t n) {
    std::string out;
    while (n-- > 0 && at_ < size_) out.push_back(static_cast<char>(data_[at_++]));
    return out;
  }
  bool done() const { return at_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

// GPT-2's spelling of raw bytes: printable Latin-1 bytes stand for themselves, the others for
// U+0100 onwards, in order (what the tokenizer reads normal tokens' spellings with).
std::string Gpt2Spelling(std::string_view bytes) {
  static const std::array<char32_t, 256> kCharOfByte = [] {
    std::array<char32_t, 256> table;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      table[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return table;
  }();
  std::string out;
  for (unsigned char b : bytes) model::AppendUtf8(kCharOfByte[b], &out);
  return out;
}

std::string Lossy(std::string_view bytes) {
  std::string out;
  model::AppendUtf8Lossy(bytes, /*final=*/true, &out);
  return out;
}

// The delta a chat chunk event carries.
std::string DeltaOf(const std::string& event) {
  Check(event.rfind("data: ", 0) == 0 && event.size() >= 8, "not an SSE event");
  const nlohmann::json j = nlohmann::json::parse(event.substr(6, event.size() - 8), nullptr,
                                                 /*allow_exceptions=*/false);
  Check(!j.is_discarded(), "an event is not JSON");
  const nlohmann::json& delta = j.at("choices").at(0).at("delta");
  return delta.contains("content") ? delta.at("content").get<std::string>() : "";
}

}  // namespace
}  // namespace sluice::router

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  using namespace sluice::router;
  Reader in(data, size);
  model::VocabSpec spec;
  const int vocab = 1 + in.Byte() % 24;
  for (int i = 0; i < vocab; ++i) {
    const uint8_t kind = in.Byte();
    const std::string bytes = in.Bytes(kind / 2 % 8);
    const bool control = kind % 2 == 1;
    spec.tokens.push_back(control ? Lossy(bytes) : Gpt2Spelling(bytes));
    spec.token_types.push_back(
        static_cast<int64_t>(control ? model::TokenType::kControl : model::TokenType::kNormal));
  }
  absl::StatusOr<std::unique_ptr<model::Tokenizer>> tokenizer = model::Tokenizer::Create(spec);
  if (!tokenizer.ok()) return 0;
  const model::Tokenizer& tok = **tokenizer;

  model::SamplingParams stops;
  for (int n = in.Byte() % 5; n > 0; --n) {
    std::string s = Lossy(in.Bytes(1 + in.Byte() % 8));
    if (!s.empty()) stops.stop_strings.push_back(std::move(s));
  }
  stops.max_tokens = 1 << 30;
  rpc::SamplingParams sampling;  // the stop token ids
  for (int n = in.Byte() % 3; n > 0; --n) sampling.add_stop_token_ids(in.Byte() % (vocab + 2) - 1);
  std::vector<int32_t> ids;  // a few hundred: the router's stop check rescans the whole text
  while (!in.done() && ids.size() < 384) ids.push_back(in.Byte() % (vocab + 2) - 1);

  // The decoder alone: whole characters, adding up to Decode.
  model::StreamDecoder decoder(tok);
  std::string pieces;
  for (int32_t id : ids) {
    const std::string piece = decoder.Push(id);
    Check(IsUtf8(piece), "the decoder let out part of a character");
    pieces += piece;
  }
  const std::string tail = decoder.Flush();
  Check(IsUtf8(tail), "the decoder's flush is not UTF-8");
  Check(pieces + tail == tok.Decode(ids), "the decoder's pieces do not add up to Decode");

  // The stream, as the router sends it.
  TextAssembler assembler(tok, stops, sampling);
  const StreamInfo stream{.id = "chatcmpl-0", .created = 1, .model = "m"};
  std::string sent = DeltaOf(ChunkEvent(Endpoint::kChatCompletions, stream, {.first = true}));
  size_t taken = 0;
  auto send = [&](const std::string& delta) {
    Check(IsUtf8(delta), "a delta is not UTF-8");
    const std::string got =
        DeltaOf(ChunkEvent(Endpoint::kChatCompletions, stream, {.text = delta}));
    Check(got == delta, "a delta reads back differently");
    sent += got;
  };
  bool stop = false;
  while (taken < ids.size() && !stop) {
    rpc::GeneratedToken token;
    token.set_token(ids[taken]);
    stop = assembler.Add(token);
    if (!stop || assembler.stopped_at_string()) ++taken;  // a stop token is not taken
    send(assembler.Ready(false));
  }
  assembler.End(FinishReason::kLength);
  send(assembler.Ready(true));
  Check(sent == assembler.text(), "the deltas do not add up to the text");

  const std::string whole = tok.Decode(std::vector<int32_t>(ids.begin(), ids.begin() + taken));
  if (assembler.stopped_at_string()) {
    const std::string& reason = assembler.stop_reason();
    Check(!reason.empty(), "stopped at a stop string without naming it");
    Check(whole.compare(0, sent.size() + reason.size(), sent + reason) == 0,
          "the text and its stop string are not how the tokens decode");
  } else {
    Check(sent == whole, "the text is not how the tokens decode");
  }
  for (const std::string& s : stops.stop_strings) {
    Check(sent.find(s) == std::string::npos, "a stop string was sent");
  }
  return 0;
}
