// libFuzzer target for the OpenAI API's request parser and the bodies and events built from a
// parsed request (tools/fuzz.sh builds it with ASan and UBSan): a request body is input from
// anyone who reaches the router. The first byte picks the endpoint (even: /v1/completions, odd:
// /v1/chat/completions); the rest is the body.
//
// Properties:
//   - ParseRequest returns a request or an InvalidArgument that FromStatus maps to a 400, and
//     its error body and error event are JSON;
//   - an accepted request holds what openai_api.h promises (ranges, prompt or messages, stop
//     strings), its sampling fields pass the workers' own check (model::SamplingParams::
//     Validate) and its kv_compression is a preset or an error (kvstore::FindKvPreset, as the
//     router checks it);
//   - every body and event built for it is one line of valid JSON ("data: ...\n\n" for events),
//     the text a completion or a stream carries reads back as sent (U+FFFD for bytes that are
//     not UTF-8), and a stream's deltas add up to the whole text.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kvstore/kv_preset.h"
#include "model/chat_template.h"
#include "model/sampler.h"
#include "model/unicode_utf8.h"
#include "nlohmann/json.hpp"
#include "router/openai_api.h"

namespace sluice::router {
namespace {

using Json = nlohmann::json;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "openai_request_fuzz: %s\n", what);
    std::abort();
  }
}

// Up to `n` bytes of `s` from `at`; none past its end.
std::string Slice(const std::string& s, size_t at, size_t n) {
  return at < s.size() ? s.substr(at, n) : "";
}

// Whether `got`, read back from JSON, is `sent`; texts that are not UTF-8 come back with U+FFFD
// in places, so only their presence is checked.
bool ReadsBack(const Json& got, const std::string& sent) {
  return got.is_string() && (!model::ValidateUtf8(sent).ok() || got.get<std::string>() == sent);
}

// One JSON document: parses, and holds no raw newline (an SSE event is one line).
Json ParseBody(const std::string& body) {
  Check(body.find('\n') == std::string::npos, "a body spans several lines");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  Check(!j.is_discarded(), "a body is not valid JSON");
  return j;
}

// One SSE event: "data: <one line of JSON>\n\n".
Json ParseEvent(const std::string& event) {
  Check(event.rfind("data: ", 0) == 0, "an event does not start with 'data: '");
  Check(event.size() >= 8 && event.compare(event.size() - 2, 2, "\n\n") == 0,
        "an event does not end with a blank line");
  return ParseBody(event.substr(6, event.size() - 8));
}

void CheckError(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kInvalidArgument,
        "a parse error is not InvalidArgument");
  const ApiError error = FromStatus(status);
  Check(error.http_status == 400, "a parse error is not a 400");
  const Json body = ParseBody(ErrorBody(error));
  if (model::ValidateUtf8(error.message).ok()) {
    Check(body.at("error").at("message") == error.message,
          "the error body does not carry the message");
  }
  (void)ParseEvent(ErrorEvent(error));
}

void CheckRequest(Endpoint endpoint, const ApiRequest& req) {
  Check(req.endpoint == endpoint, "the request names another endpoint");
  if (endpoint == Endpoint::kCompletions) {
    Check(req.prompt.empty() != req.prompt_token_ids.empty(), "not exactly one prompt");
    for (int32_t id : req.prompt_token_ids) Check(id >= 0, "a negative prompt token id");
    Check(req.messages.empty(), "a completions request with messages");
  } else {
    Check(!req.messages.empty(), "a chat request without messages");
    for (const model::ChatMessage& m : req.messages) {
      Check(m.role == "system" || m.role == "user" || m.role == "assistant", "an unknown role");
    }
  }
  Check(req.max_tokens == -1 || req.max_tokens >= 1, "max_tokens out of range");
  Check(req.top_logprobs >= 0 && req.top_logprobs <= 20, "top_logprobs out of range");
  Check(req.logprobs || req.top_logprobs == 0, "top_logprobs without logprobs");
  Check(req.stop.size() <= 4, "more than 4 stop strings");
  for (const std::string& s : req.stop) Check(!s.empty(), "an empty stop string");
  for (int32_t id : req.stop_token_ids) Check(id >= 0, "a negative stop token id");
  Check(!req.include_usage_in_stream || req.stream, "stream_options without stream");

  // What the router forwards and a worker checks again before it samples.
  model::SamplingParams sampling;
  sampling.temperature = req.temperature;
  sampling.top_k = req.top_k;
  sampling.top_p = req.top_p;
  sampling.min_p = req.min_p;
  sampling.repetition_penalty = req.repetition_penalty;
  sampling.seed = req.seed.value_or(0);
  sampling.max_tokens = req.max_tokens > 0 ? req.max_tokens : 1;
  sampling.stop_strings = req.stop;
  sampling.stop_tokens = req.stop_token_ids;
  Check(sampling.Validate().ok(), "an accepted request fails the workers' sampling check");
  if (!req.kv_compression.empty()) {
    const absl::Status preset = kvstore::FindKvPreset(req.kv_compression, 64).status();
    Check(preset.ok() || preset.code() == absl::StatusCode::kNotFound ||
              preset.code() == absl::StatusCode::kInvalidArgument,
          "kv_compression fails with an unexpected code");
  }
}

// The text a model could have produced for this request: the prompt's or the messages' own
// text, and bytes of the body that may not be UTF-8 (as generated tokens may not be).
std::string SomeText(const ApiRequest& req, std::string_view body) {
  std::string text = req.prompt;
  for (const model::ChatMessage& m : req.messages) text += m.content;
  text.append(body.substr(body.size() / 2, 48));
  return text;
}

std::vector<TokenLogprob> SomeLogprobs(const ApiRequest& req, const std::string& text) {
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < text.size() && out.size() < 8; i += 3) {
    TokenLogprob t{.token = Slice(text, i, 3), .logprob = -0.25f * static_cast<float>(i)};
    for (int k = 0; k < req.top_logprobs; ++k) {
      // -inf and NaN go on the wire as -9999.
      const float logprob = k == 0   ? -std::numeric_limits<float>::infinity()
                            : k == 1 ? std::numeric_limits<float>::quiet_NaN()
                                     : -static_cast<float>(k);
      t.top.emplace_back(Slice(text, i + k, 2), logprob);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// A choice's text: "text" (completions), "message.content" or "delta.content" (chat; a delta
// without content has none).
Json TextOf(Endpoint endpoint, const Json& choice, bool streamed) {
  if (endpoint == Endpoint::kCompletions) return choice.at("text");
  const Json& message = choice.at(streamed ? "delta" : "message");
  return message.contains("content") ? message.at("content") : Json("");
}

void CheckResponses(Endpoint endpoint, const ApiRequest& req, std::string_view body) {
  const std::string text = SomeText(req, body);
  const std::string model = req.model.empty() ? "served" : req.model;
  const Usage usage{.prompt_tokens = static_cast<int>(text.size()), .completion_tokens = 7};
  std::optional<std::vector<TokenLogprob>> logprobs;
  if (req.logprobs) logprobs = SomeLogprobs(req, text);

  const Completion completion{.id = NewRequestId(endpoint),
                              .created = 1700000000,
                              .model = model,
                              .choices = {{.text = text,
                                           .finish_reason = FinishReason::kStop,
                                           .stop_reason = req.stop.empty() ? "" : req.stop[0],
                                           .logprobs = logprobs}},
                              .usage = usage};
  const Json j = ParseBody(CompletionBody(endpoint, completion));
  Check(ReadsBack(j.at("model"), model), "the completion names another model");
  Check(ReadsBack(TextOf(endpoint, j.at("choices").at(0), false), text),
        "the completion's text differs");
  Check(j.at("usage").at("total_tokens") == usage.prompt_tokens + usage.completion_tokens,
        "total_tokens is not the sum");
  Check(j.at("choices").at(0).at("logprobs").is_null() == !req.logprobs,
        "logprobs where none were asked");

  // The text streamed in pieces of about 5 bytes, cut between characters as the router cuts
  // its deltas, logprobs with every piece.
  const StreamInfo stream{.id = NewRequestId(endpoint),
                          .created = 1700000000,
                          .model = model,
                          .include_usage = req.include_usage_in_stream};
  std::string streamed;
  int sent_chars = 0;
  for (size_t at = 0, end = 0; at <= text.size(); at = end) {
    end = std::min(at + 5, text.size());
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    Chunk chunk{.first = at == 0, .text = text.substr(at, end - at), .text_offset = sent_chars};
    if (req.logprobs) chunk.logprobs = SomeLogprobs(req, chunk.text);
    if (end == text.size()) chunk.finish_reason = FinishReason::kLength;
    const Json event = ParseEvent(ChunkEvent(endpoint, stream, chunk));
    Check(event.contains("usage") == req.include_usage_in_stream, "usage: null out of place");
    streamed += TextOf(endpoint, event.at("choices").at(0), true).get<std::string>();
    for (unsigned char c : chunk.text) sent_chars += (c & 0xC0) != 0x80;
    if (end == text.size()) break;
  }
  if (model::ValidateUtf8(text).ok()) Check(streamed == text, "the deltas do not add up");
  const Json usage_event = ParseEvent(UsageEvent(endpoint, stream, usage));
  Check(usage_event.at("choices").empty(), "the usage event carries choices");
  Check(DoneEvent() == "data: [DONE]\n\n", "the last event is not [DONE]");
  (void)ParseBody(ModelsBody({model}, 1700000000));

  if (endpoint == Endpoint::kChatCompletions) {
    const std::string prompt = model::ChatTemplate::ChatMl().Render(req.messages, true);
    for (const model::ChatMessage& m : req.messages) {
      Check(prompt.find(m.content) != std::string::npos, "the prompt lost a message");
    }
  }
}

}  // namespace
}  // namespace sluice::router

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::router;
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] % 2 == 0 ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<ApiRequest> req = ParseRequest(endpoint, body);
  if (!req.ok()) {
    CheckError(req.status());
    return 0;
  }
  CheckRequest(endpoint, *req);
  CheckResponses(endpoint, *req, body);
  return 0;
}
