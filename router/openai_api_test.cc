#include "router/openai_api.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::router {
namespace {

using Json = nlohmann::json;
constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

ApiRequest ParseOk(Endpoint endpoint, std::string_view body) {
  absl::StatusOr<ApiRequest> req = ParseRequest(endpoint, body);
  EXPECT_TRUE(req.ok()) << req.status() << "\nbody: " << body;
  return req.ok() ? *std::move(req) : ApiRequest{};
}

// The event's JSON payload, after checking the SSE framing: one "data: " line ending in a
// blank line.
Json EventJson(const std::string& event) {
  EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
  EXPECT_TRUE(absl::EndsWith(event, "\n\n")) << event;
  if (event.size() < 8) return Json();
  const std::string payload = event.substr(6, event.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos) << event;
  return Json::parse(payload);
}

// ---- Parsing valid bodies ----------------------------------------------------------------

// No model: the served one (the router fills it in); vLLM's fields at the values this server
// honours pass, as do nulls.
TEST(ParseRequest, ModelIsOptionalAndVllmFieldsPassAtTheirDefaults) {
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "p"})").model, "");
  ApiRequest chat = ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "tool_choice": "none", "parallel_tool_calls": true, "add_generation_prompt": true,
      "continue_final_message": false, "echo": false, "skip_special_tokens": false,
      "min_tokens": 0, "use_beam_search": false, "length_penalty": 1.0, "store": false,
      "metadata": {}, "service_tier": "auto", "priority": 0, "function_call": null})");
  EXPECT_EQ(chat.model, "");
  EXPECT_EQ(chat.messages.size(), 1u);
  ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "include_stop_str_in_output": false,
      "user": "u", "best_of": 1})");
}

TEST(ParseRequest, SeveralChoices) {
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "p"})").n, 1);
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "p", "n": 4})").n, 4);
  EXPECT_EQ(ParseOk(kCmpl, R"({"prompt": "p", "n": 3, "best_of": 3})").n, 3);
  EXPECT_EQ(ParseOk(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 16})").n, 16);
}

TEST(ParseRequest, CompletionsStringPromptWithDefaults) {
  ApiRequest r = ParseOk(kCmpl, R"({"model": "smollm2", "prompt": "Once upon"})");
  EXPECT_EQ(r.endpoint, kCmpl);
  EXPECT_EQ(r.model, "smollm2");
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_TRUE(r.prompt_token_ids.empty());
  EXPECT_TRUE(r.messages.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage_in_stream);
  EXPECT_EQ(r.max_tokens, -1);
  EXPECT_EQ(r.temperature, 1.f);
  EXPECT_EQ(r.top_p, 1.f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.min_p, 0.f);
  EXPECT_EQ(r.repetition_penalty, 1.f);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_TRUE(r.kv_compression.empty());
}

TEST(ParseRequest, CompletionsPromptForms) {
  EXPECT_EQ(ParseOk(kCmpl, R"({"model": "m", "prompt": ["one string"]})").prompt, "one string");

  ApiRequest ids = ParseOk(kCmpl, R"({"model": "m", "prompt": [1, 2, 2147483647]})");
  EXPECT_TRUE(ids.prompt.empty());
  EXPECT_EQ(ids.prompt_token_ids, (std::vector<int32_t>{1, 2, 2147483647}));

  ApiRequest nested = ParseOk(kCmpl, R"({"model": "m", "prompt": [[7, 8]]})");
  EXPECT_EQ(nested.prompt_token_ids, (std::vector<int32_t>{7, 8}));
}

TEST(ParseRequest, CompletionsSamplingFields) {
  ApiRequest r = ParseOk(kCmpl, R"({
    "model": "m", "prompt": "p", "max_tokens": 16.0, "temperature": 0, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 42, "stop": "\n\n",
    "stop_token_ids": [2, 0], "ignore_eos": true, "kv_compression": "leankv-k8v4:alpha_high=2",
    "user": "alice"})");
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.temperature, 0.f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.repetition_penalty, 1.1f);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{2, 0}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.kv_compression, "leankv-k8v4:alpha_high=2");
  EXPECT_EQ(r.user, "alice");
}

TEST(ParseRequest, StopAsArrayAndTopKMinusOneMeansOff) {
  ApiRequest r =
      ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "stop": ["a", "b", "c", "d"], "top_k": -1})");
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(r.top_k, 0);
}

TEST(ParseRequest, SeedsCoverTheWholeUint64Range) {
  EXPECT_EQ(*ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "seed": -1})").seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "seed": 18446744073709551615})").seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "seed": 0})").seed, 0u);
}

TEST(ParseRequest, CompletionsLogprobsIsTheNumberOfAlternatives) {
  ApiRequest three = ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "logprobs": 3})");
  EXPECT_TRUE(three.logprobs);
  EXPECT_EQ(three.top_logprobs, 3);
  ApiRequest zero = ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "logprobs": 0})");
  EXPECT_TRUE(zero.logprobs);
  EXPECT_EQ(zero.top_logprobs, 0);
  ApiRequest none = ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "logprobs": null})");
  EXPECT_FALSE(none.logprobs);
}

TEST(ParseRequest, ChatMessagesWithEveryRole) {
  ApiRequest r = ParseOk(kChat, R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi", "name": "bob"},
      {"role": "assistant", "content": "Hello!"},
      {"role": "developer", "content": "Answer in French."},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "Bye"}]})");
  EXPECT_EQ(r.endpoint, kChat);
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "Hello!");
  EXPECT_EQ(r.messages[3].role, "system");
  EXPECT_EQ(r.messages[3].content, "Answer in French.");
  EXPECT_EQ(r.messages[4].role, "assistant");
  EXPECT_EQ(r.messages[4].content, "");
  EXPECT_EQ(r.messages[5].content, "Bye");
  EXPECT_TRUE(r.prompt.empty());
}

TEST(ParseRequest, ChatContentPartsAreJoinedByNewlines) {
  ApiRequest r = ParseOk(kChat, R"({"model": "m", "messages": [{"role": "user", "content": [
      {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]})");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "first\nsecond");
}

TEST(ParseRequest, ChatLogprobsAndTopLogprobs) {
  ApiRequest r = ParseOk(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "logprobs": true, "top_logprobs": 20})");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 20);
  ApiRequest plain = ParseOk(
      kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  EXPECT_TRUE(plain.logprobs);
  EXPECT_EQ(plain.top_logprobs, 0);
}

TEST(ParseRequest, StreamOptionsIncludeUsage) {
  ApiRequest r = ParseOk(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "stream": true, "stream_options": {"include_usage": true}})");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage_in_stream);
  ApiRequest no_usage = ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "stream": true})");
  EXPECT_TRUE(no_usage.stream);
  EXPECT_FALSE(no_usage.include_usage_in_stream);
}

TEST(ParseRequest, ChatMaxCompletionTokensWinsOverMaxTokens) {
  EXPECT_EQ(ParseOk(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "max_tokens": 10, "max_completion_tokens": 20})")
                .max_tokens,
            20);
  EXPECT_EQ(ParseOk(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "max_tokens": 10})")
                .max_tokens,
            10);
}

// Unknown fields are refused (BadRequest below): none is dropped in silence.
TEST(ParseRequest, NullsAndNeutralValuesAreAccepted) {
  ApiRequest r = ParseOk(kCmpl, R"({"model": "m", "prompt": "p", "temperature": null,
      "n": 1, "best_of": 1, "echo": false, "presence_penalty": 0, "frequency_penalty": 0.0,
      "logit_bias": {}, "suffix": "", "response_format": {"type": "text"}})");
  EXPECT_EQ(r.temperature, 1.f);
  EXPECT_EQ(r.prompt, "p");
}

TEST(ParseRequest, BracketsInsideStringsDoNotCountAsNesting) {
  // In JSON, an escaped quote does not end the string.
  const std::string escaped = std::string(200, '[') + "\\\"" + std::string(200, '{');
  ApiRequest r = ParseOk(kCmpl, R"({"model": "m", "prompt": ")" + escaped + R"("})");
  EXPECT_EQ(r.prompt, std::string(200, '[') + "\"" + std::string(200, '{'));
}

// ---- Rejecting bad bodies ------------------------------------------------------------------

struct BadCase {
  Endpoint endpoint;
  std::string body;
  std::string param;      // expected error param; empty = null
  std::string substring;  // expected somewhere in the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.body; }

class BadRequest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequest, Is400NamingTheField) {
  const BadCase& c = GetParam();
  absl::StatusOr<ApiRequest> req = ParseRequest(c.endpoint, c.body);
  ASSERT_FALSE(req.ok());
  EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument);
  const ApiError e = FromStatus(req.status());
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, c.param) << e.message;
  if (!c.param.empty()) {
    EXPECT_TRUE(absl::StrContains(e.message, "'" + c.param + "'")) << e.message;
  }
  EXPECT_TRUE(absl::StrContains(e.message, c.substring)) << e.message;
}

std::string Chat(const std::string& messages, const std::string& more = "") {
  return R"({"model": "m", "messages": )" + messages + more + "}";
}
const char kUserHi[] = R"([{"role": "user", "content": "hi"}])";
std::string Cmpl(const std::string& more) {
  return R"({"model": "m", "prompt": "p", )" + more + "}";
}

INSTANTIATE_TEST_SUITE_P(
    Bodies, BadRequest,
    ::testing::Values(
        // Not a JSON object.
        BadCase{kCmpl, R"({"model": "m", "prompt": )", "", "not valid JSON"},
        BadCase{kCmpl, "", "", "not valid JSON"},
        BadCase{kCmpl, Cmpl(R"("temperature": 1e400)"), "", "number overflow parsing '1e400'"},
        BadCase{kCmpl, Cmpl(R"("seed": -1e999)"), "", "not valid JSON"},
        BadCase{kCmpl, "[1, 2]", "", "must be a JSON object"},
        BadCase{kCmpl, std::string(100, '[') + std::string(100, ']'), "", "levels deep"},
        // model
        BadCase{kCmpl, R"({"model": "", "prompt": "p"})", "model", "a model name"},
        BadCase{kChat, R"({"model": 7, "messages": []})", "model", "expected a string"},
        // prompt
        BadCase{kCmpl, R"({"model": "m"})", "prompt", "Missing required parameter"},
        BadCase{kCmpl, R"({"model": "m", "prompt": ""})", "prompt", "non-empty"},
        BadCase{kCmpl, R"({"model": "m", "prompt": []})", "prompt", "non-empty"},
        BadCase{kCmpl, R"({"model": "m", "prompt": {"text": "p"}})", "prompt", "an object"},
        BadCase{kCmpl, R"({"model": "m", "prompt": ["a", "b"]})", "prompt", "batched"},
        BadCase{kCmpl, R"({"model": "m", "prompt": [[1], [2]]})", "prompt", "batched"},
        BadCase{kCmpl, R"({"model": "m", "prompt": [1, -2]})", "prompt[1]", "-2"},
        BadCase{kCmpl, R"({"model": "m", "prompt": [1, "a"]})", "prompt[1]", "an integer"},
        BadCase{kCmpl, R"({"model": "m", "prompt": [[]]})", "prompt[0]", "non-empty"},
        BadCase{kCmpl, R"({"model": "m", "prompt": [""]})", "prompt[0]", "non-empty"},
        // Sampling fields: wrong types and out-of-range values.
        BadCase{kCmpl, Cmpl(R"("temperature": "hot")"), "temperature",
                "expected a number, but got a string"},
        BadCase{kCmpl, Cmpl(R"("temperature": 2.5)"), "temperature", "[0, 2]"},
        BadCase{kChat, Chat(kUserHi, R"(, "temperature": -0.1)"), "temperature", "-0.1"},
        BadCase{kCmpl, Cmpl(R"("top_p": 0)"), "top_p", "(0, 1]"},
        BadCase{kCmpl, Cmpl(R"("top_p": 1.5)"), "top_p", "(0, 1]"},
        BadCase{kCmpl, Cmpl(R"("top_k": -2)"), "top_k", "-2"},
        BadCase{kCmpl, Cmpl(R"("top_k": 1.5)"), "top_k", "an integer"},
        BadCase{kCmpl, Cmpl(R"("min_p": 1)"), "min_p", "[0, 1)"},
        // In range as doubles, out of range as the floats the workers get.
        BadCase{kCmpl, Cmpl(R"("top_p": 1e-50)"), "top_p", "(0, 1]"},
        BadCase{kCmpl, Cmpl(R"("min_p": 0.99999999999)"), "min_p", "[0, 1)"},
        BadCase{kCmpl, Cmpl(R"("repetition_penalty": 1e300)"), "repetition_penalty", "> 0"},
        BadCase{kCmpl, Cmpl(R"("repetition_penalty": 0)"), "repetition_penalty", "> 0"},
        BadCase{kCmpl, Cmpl(R"("max_tokens": 0)"), "max_tokens", "got 0"},
        BadCase{kCmpl, Cmpl(R"("max_tokens": "10")"), "max_tokens", "got a string"},
        BadCase{kChat, Chat(kUserHi, R"(, "max_completion_tokens": -5)"), "max_completion_tokens",
                "-5"},
        BadCase{kCmpl, Cmpl(R"("seed": "lucky")"), "seed", "an integer"},
        BadCase{kCmpl, Cmpl(R"("seed": 1.5)"), "seed", "an integer"},
        BadCase{kCmpl, Cmpl(R"("stream": "yes")"), "stream", "a boolean"},
        BadCase{kCmpl, Cmpl(R"("ignore_eos": 1)"), "ignore_eos", "a boolean"},
        BadCase{kCmpl, Cmpl(R"("kv_compression": 4)"), "kv_compression", "a string"},
        BadCase{kCmpl, Cmpl(R"("user": ["a"])"), "user", "a string"},
        BadCase{kCmpl, Cmpl(R"("stop_token_ids": [-1])"), "stop_token_ids[0]", "-1"},
        // stop
        BadCase{kCmpl, Cmpl(R"("stop": 5)"), "stop", "a string or an array of strings"},
        BadCase{kCmpl, Cmpl(R"("stop": "")"), "stop", "non-empty"},
        BadCase{kCmpl, Cmpl(R"("stop": ["a", 1])"), "stop[1]", "a string"},
        BadCase{kCmpl, Cmpl(R"("stop": ["a", ""])"), "stop[1]", "non-empty"},
        BadCase{kCmpl, Cmpl(R"("stop": ["a", "b", "c", "d", "e"])"), "stop", "at most 4"},
        // stream_options
        BadCase{kCmpl, Cmpl(R"("stream_options": {"include_usage": true})"), "stream_options",
                "only allowed when 'stream' is true"},
        BadCase{kCmpl, Cmpl(R"("stream": true, "stream_options": true)"), "stream_options",
                "an object"},
        BadCase{kChat, Chat(kUserHi, R"(, "stream": true, "stream_options": {"include_usage": 1})"),
                "stream_options.include_usage", "a boolean"},
        // logprobs
        BadCase{kCmpl, Cmpl(R"("logprobs": 6)"), "logprobs", "[0, 5]"},
        BadCase{kCmpl, Cmpl(R"("logprobs": true)"), "logprobs", "an integer"},
        BadCase{kChat, Chat(kUserHi, R"(, "logprobs": 5)"), "logprobs", "a boolean"},
        BadCase{kChat, Chat(kUserHi, R"(, "logprobs": true, "top_logprobs": 21)"), "top_logprobs",
                "[0, 20]"},
        BadCase{kChat, Chat(kUserHi, R"(, "top_logprobs": 3)"), "top_logprobs",
                "requires 'logprobs'"},
        // What this server cannot honour.
        BadCase{kCmpl, Cmpl(R"("n": 17)"), "n", "[1, 16]"},
        BadCase{kChat, Chat(kUserHi, R"(, "n": 2.5)"), "n", "an integer"},
        BadCase{kCmpl, Cmpl(R"("n": 0)"), "n", "got 0"},
        BadCase{kCmpl, Cmpl(R"("best_of": 3)"), "best_of", "not supported"},
        BadCase{kCmpl, Cmpl(R"("n": 2, "best_of": 3)"), "best_of", "only best_of = n (2)"},
        BadCase{kCmpl, Cmpl(R"("echo": true)"), "echo", "not supported"},
        BadCase{kCmpl, Cmpl(R"("suffix": "end")"), "suffix", "not supported"},
        BadCase{kCmpl, Cmpl(R"("presence_penalty": 0.5)"), "presence_penalty", "not supported"},
        BadCase{kChat, Chat(kUserHi, R"(, "frequency_penalty": 3)"), "frequency_penalty",
                "[-2, 2]"},
        BadCase{kCmpl, Cmpl(R"("logit_bias": {"50256": -100})"), "logit_bias", "not supported"},
        BadCase{kChat, Chat(kUserHi, R"(, "tools": [{"type": "function"}])"), "tools",
                "not supported"},
        BadCase{kChat, Chat(kUserHi, R"(, "response_format": {"type": "json_object"})"),
                "response_format.type", "not supported"},
        // Fields nobody reads, and vLLM's fields at values this server does not honour.
        BadCase{kCmpl, Cmpl(R"("foo": 1)"), "foo", "Unrecognized request argument supplied: 'foo'"},
        BadCase{kCmpl, Cmpl(R"("max_completion_tokens": 5)"), "max_completion_tokens",
                "Unrecognized"},
        BadCase{kChat, Chat(kUserHi, R"(, "prompt": "p")"), "prompt", "Unrecognized"},
        BadCase{kCmpl, Cmpl(R"("min_tokens": 5)"), "min_tokens", "only 0 is"},
        BadCase{kCmpl, Cmpl(R"("skip_special_tokens": true)"), "skip_special_tokens",
                "only false is"},
        BadCase{kCmpl, Cmpl(R"("spaces_between_special_tokens": true)"),
                "spaces_between_special_tokens", "Unrecognized"},
        BadCase{kChat, Chat(kUserHi, R"(, "tool_choice": "required")"), "tool_choice",
                "\"required\" is not supported"},
        BadCase{kChat, Chat(kUserHi, R"(, "add_generation_prompt": false)"),
                "add_generation_prompt", "only true is"},
        BadCase{kChat, Chat(kUserHi, R"(, "metadata": {"a": "b"})"), "metadata",
                "only an empty object is"},
        BadCase{kCmpl, Cmpl(R"("tool_choice": "none")"), "tool_choice", "Unrecognized"},
        // messages
        BadCase{kChat, R"({"model": "m"})", "messages", "Missing required parameter"},
        BadCase{kChat, Chat("[]"), "messages", "at least one message"},
        BadCase{kChat, Chat(R"("hi")"), "messages", "an array"},
        BadCase{kChat, Chat("[1]"), "messages[0]", "an object"},
        BadCase{kChat, Chat(R"([{"content": "hi"}])"), "messages[0].role",
                "Missing required parameter"},
        BadCase{kChat, Chat(R"([{"role": "wizard", "content": "hi"}])"), "messages[0].role",
                "\"wizard\""},
        BadCase{kChat,
                Chat(R"([{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}])"),
                "messages[1].role", "not supported"},
        BadCase{kChat, Chat(R"([{"role": "user"}])"), "messages[0].content",
                "Missing required parameter"},
        BadCase{kChat, Chat(R"([{"role": "user", "content": 5}])"), "messages[0].content",
                "got an integer"},
        BadCase{kChat, Chat(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "http://x"}}]}])"),
                "messages[0].content[1].type", "image_url"},
        BadCase{kChat, Chat(R"([{"role": "user", "content": [{"type": "text"}]}])"),
                "messages[0].content[0].text", "Missing required parameter"},
        BadCase{kChat, Chat(R"([{"role": "user", "content": ["hi"]}])"), "messages[0].content[0]",
                "an object"},
        BadCase{kChat,
                Chat(R"([{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}])"),
                "messages[0].tool_calls", "not supported"}));

// ---- Errors --------------------------------------------------------------------------------

TEST(FromStatus, MapsCanonicalCodesToHttpStatuses) {
  struct Case {
    absl::Status status;
    int http;
    std::string type, code;
  };
  for (const Case& c : std::vector<Case>{
           {absl::InvalidArgumentError("x"), 400, "invalid_request_error", ""},
           {absl::OutOfRangeError("x"), 400, "invalid_request_error", ""},
           {absl::NotFoundError("x"), 404, "invalid_request_error", ""},
           {absl::ResourceExhaustedError("x"), 429, "rate_limit_error", "rate_limit_exceeded"},
           {absl::UnavailableError("x"), 503, "server_error", "service_unavailable"},
           {absl::DeadlineExceededError("x"), 504, "server_error", "timeout"},
           {absl::InternalError("x"), 500, "server_error", ""},
           {absl::UnimplementedError("x"), 500, "server_error", ""},
       }) {
    const ApiError e = FromStatus(c.status);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.code, c.code) << c.status;
    EXPECT_EQ(e.message, "x");
    EXPECT_EQ(e.param, "");
  }
  EXPECT_EQ(FromStatus(absl::OkStatus()).http_status, 500);
}

TEST(FromStatus, CarriesParamAndCode) {
  ApiError e = FromStatus(InvalidParamError("messages", "too long", "context_length_exceeded"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.message, "too long");

  e = FromStatus(ModelNotFoundError("gpt-9"));
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_TRUE(absl::StrContains(e.message, "gpt-9"));
}

TEST(ErrorBody, HasOpenAiShapeWithNullsForEmptyFields) {
  Json j = Json::parse(ErrorBody(FromStatus(absl::InvalidArgumentError("bad body"))));
  ASSERT_TRUE(j.contains("error"));
  Json& e = j["error"];
  EXPECT_EQ(e["message"], "bad body");
  EXPECT_EQ(e["type"], "invalid_request_error");
  ASSERT_TRUE(e.contains("param"));
  EXPECT_TRUE(e["param"].is_null());
  ASSERT_TRUE(e.contains("code"));
  EXPECT_TRUE(e["code"].is_null());
  EXPECT_EQ(j.size(), 1u);
  EXPECT_EQ(e.size(), 4u);

  j = Json::parse(ErrorBody(FromStatus(ModelNotFoundError("x"))));
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
}

TEST(ErrorBody, RequestTooLarge) {
  const ApiError e = RequestTooLargeError(2'000'000, 1'048'576);
  EXPECT_EQ(e.http_status, 413);
  EXPECT_EQ(e.code, "request_too_large");
  EXPECT_TRUE(absl::StrContains(e.message, "1048576")) << e.message;
  EXPECT_EQ(Json::parse(ErrorBody(e))["error"]["type"], "invalid_request_error");
}

TEST(ErrorEvent, IsAnSseEventHoldingTheErrorObject) {
  Json j = EventJson(ErrorEvent(FromStatus(absl::UnavailableError("worker lost"))));
  EXPECT_EQ(j["error"]["message"], "worker lost");
  EXPECT_EQ(j["error"]["code"], "service_unavailable");
}

// ---- Response bodies -----------------------------------------------------------------------

Completion SampleCompletion() {
  Completion c;
  c.id = "cmpl-abc";
  c.created = 1700000000;
  c.model = "smollm2";
  c.choices = {{.text = "Hello world", .finish_reason = FinishReason::kLength}};
  c.usage = {.prompt_tokens = 7, .completion_tokens = 3, .cached_tokens = 4};
  return c;
}

TEST(CompletionBody, TextCompletion) {
  Json j = Json::parse(CompletionBody(kCmpl, SampleCompletion()));
  EXPECT_EQ(j["id"], "cmpl-abc");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smollm2");
  ASSERT_EQ(j["choices"].size(), 1u);
  Json& choice = j["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["text"], "Hello world");
  EXPECT_FALSE(choice.contains("message"));
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_TRUE(choice["stop_reason"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
  // As OpenAI reports a prompt cache: the prompt tokens it served.
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(CompletionBody, ChatCompletion) {
  Completion c = SampleCompletion();
  c.id = "chatcmpl-abc";
  c.choices[0].finish_reason = FinishReason::kStop;
  c.choices[0].stop_reason = "\n\n";
  Json j = Json::parse(CompletionBody(kChat, c));
  EXPECT_EQ(j["id"], "chatcmpl-abc");
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  Json& choice = j["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_FALSE(choice.contains("text"));
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hello world");
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["stop_reason"], "\n\n");
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
}

TEST(CompletionBody, SeveralChoicesInTheirOrder) {
  Completion c = SampleCompletion();
  c.choices.push_back({.text = "Bye", .finish_reason = FinishReason::kStop, .stop_reason = "."});
  for (Endpoint e : {kCmpl, kChat}) {
    Json j = Json::parse(CompletionBody(e, c));
    ASSERT_EQ(j["choices"].size(), 2u);
    EXPECT_EQ(j["choices"][0]["index"], 0);
    EXPECT_EQ(j["choices"][1]["index"], 1);
    const Json& second =
        e == kChat ? j["choices"][1]["message"]["content"] : j["choices"][1]["text"];
    EXPECT_EQ(second, "Bye");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
    EXPECT_EQ(j["choices"][1]["stop_reason"], ".");
    EXPECT_EQ(j["usage"]["total_tokens"], 10);
  }
}

TEST(CompletionBody, AbortedFinishReason) {
  Completion c = SampleCompletion();
  c.choices[0].finish_reason = FinishReason::kAbort;
  EXPECT_EQ(Json::parse(CompletionBody(kChat, c))["choices"][0]["finish_reason"], "abort");
}

std::vector<TokenLogprob> SampleLogprobs() {
  return {
      {"Hello", -0.1f, {{"Hello", -0.1f}, {"Hi", -2.5f}}},
      {" w\xC3\xA9", -1.25f, {{" w\xC3\xA9", -1.25f}}},
      {"rld", -std::numeric_limits<float>::infinity(), {}},
  };
}

TEST(CompletionBody, CompletionsLogprobsShape) {
  Completion c = SampleCompletion();
  c.choices[0].text = "Hello w\xC3\xA9rld";
  c.choices[0].logprobs = SampleLogprobs();
  Json j = Json::parse(CompletionBody(kCmpl, c));
  Json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json({"Hello", " w\xC3\xA9", "rld"}));
  ASSERT_EQ(lp["token_logprobs"].size(), 3u);
  // Floats go out as their shortest decimal, -inf as -9999.0.
  EXPECT_EQ(lp["token_logprobs"][0].dump(), "-0.1");
  EXPECT_EQ(lp["token_logprobs"][1].get<double>(), -1.25);
  EXPECT_EQ(lp["token_logprobs"][2].get<double>(), -9999.0);
  // Offsets count characters: "é" is two bytes and one character.
  EXPECT_EQ(lp["text_offset"], Json({0, 5, 8}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_TRUE(lp["top_logprobs"][0].is_object());
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][0]["Hi"].get<double>(), -2.5);
  EXPECT_EQ(lp["top_logprobs"][1][" w\xC3\xA9"].get<double>(), -1.25);
  EXPECT_TRUE(lp["top_logprobs"][2].empty());
}

TEST(CompletionBody, ChatLogprobsShape) {
  Completion c = SampleCompletion();
  c.choices[0].logprobs = SampleLogprobs();
  c.choices[0].logprobs->push_back({"\xC3", -3.f, {}});  // half of a two-byte character
  Json j = Json::parse(CompletionBody(kChat, c));
  Json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.contains("content"));
  Json& content = lp["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_EQ(content[0]["logprob"].dump(), "-0.1");
  EXPECT_EQ(content[0]["bytes"], Json({72, 101, 108, 108, 111}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hi");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"].get<double>(), -2.5);
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], Json({72, 105}));
  EXPECT_EQ(content[1]["bytes"], Json({32, 119, 0xC3, 0xA9}));
  EXPECT_EQ(content[2]["logprob"].get<double>(), -9999.0);
  EXPECT_TRUE(content[2]["top_logprobs"].empty());
  // The token text holds a replacement character; the bytes hold the exact byte.
  EXPECT_EQ(content[3]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(content[3]["bytes"], Json::array({0xC3}));
}

TEST(CompletionBody, InvalidUtf8TextBecomesReplacementCharacters) {
  Completion c = SampleCompletion();
  c.choices[0].text = "ok\xFF";
  Json j = Json::parse(CompletionBody(kCmpl, c));
  EXPECT_EQ(j["choices"][0]["text"], "ok\xEF\xBF\xBD");
}

// ---- Streaming -----------------------------------------------------------------------------

StreamInfo SampleStream(bool include_usage = false) {
  return {.id = "chatcmpl-1",
          .created = 1700000001,
          .model = "smollm2",
          .include_usage = include_usage};
}

TEST(ChunkEvent, ChatFirstChunkCarriesTheAssistantRole) {
  Json j = EventJson(ChunkEvent(kChat, SampleStream(), {.first = true}));
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["created"], 1700000001);
  EXPECT_EQ(j["model"], "smollm2");
  ASSERT_EQ(j["choices"].size(), 1u);
  Json& choice = j["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["delta"], Json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(choice["logprobs"].is_null());
  ASSERT_TRUE(choice.contains("finish_reason"));
  EXPECT_TRUE(choice["finish_reason"].is_null());
  EXPECT_FALSE(j.contains("usage"));
}

TEST(ChunkEvent, CarriesItsChoicesIndex) {
  for (Endpoint e : {kCmpl, kChat}) {
    Json j = EventJson(ChunkEvent(e, SampleStream(), {.text = "x", .index = 3}));
    ASSERT_EQ(j["choices"].size(), 1u);
    EXPECT_EQ(j["choices"][0]["index"], 3);
  }
}

TEST(ChunkEvent, ChatLaterChunksCarryOnlyContent) {
  Json mid = EventJson(ChunkEvent(kChat, SampleStream(), {.text = "Hel"}));
  EXPECT_EQ(mid["choices"][0]["delta"], Json({{"content", "Hel"}}));
  EXPECT_TRUE(mid["choices"][0]["finish_reason"].is_null());

  Json last = EventJson(ChunkEvent(kChat, SampleStream(), {.finish_reason = FinishReason::kStop}));
  EXPECT_TRUE(last["choices"][0]["delta"].is_object());
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  Json last_with_text = EventJson(
      ChunkEvent(kChat, SampleStream(), {.text = "!", .finish_reason = FinishReason::kLength}));
  EXPECT_EQ(last_with_text["choices"][0]["delta"]["content"], "!");
  EXPECT_EQ(last_with_text["choices"][0]["finish_reason"], "length");
}

TEST(ChunkEvent, ChatChunkLogprobs) {
  Chunk chunk{.text = "Hello"};
  chunk.logprobs = std::vector<TokenLogprob>{{"Hello", -0.5f, {{"Hello", -0.5f}}}};
  Json j = EventJson(ChunkEvent(kChat, SampleStream(), chunk));
  Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_EQ(content[0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 1u);
}

TEST(ChunkEvent, CompletionsChunkWithLogprobsContinuingTextOffsets) {
  StreamInfo s = SampleStream();
  s.id = "cmpl-1";
  Chunk chunk{.text = " world", .text_offset = 5};
  chunk.logprobs = std::vector<TokenLogprob>{{" wor", -0.25f, {}}, {"ld", -0.75f, {}}};
  Json j = EventJson(ChunkEvent(kCmpl, s, chunk));
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  Json& choice = j["choices"][0];
  EXPECT_EQ(choice["text"], " world");
  EXPECT_FALSE(choice.contains("delta"));
  EXPECT_TRUE(choice["finish_reason"].is_null());
  EXPECT_EQ(choice["logprobs"]["tokens"], Json({" wor", "ld"}));
  EXPECT_EQ(choice["logprobs"]["text_offset"], Json({5, 9}));
}

TEST(ChunkEvent, IncludeUsageAddsNullUsageThenAFinalUsageChunk) {
  const StreamInfo s = SampleStream(/*include_usage=*/true);
  Json chunk = EventJson(ChunkEvent(kChat, s, {.text = "x"}));
  ASSERT_TRUE(chunk.contains("usage"));
  EXPECT_TRUE(chunk["usage"].is_null());

  Json usage = EventJson(UsageEvent(kChat, s, {.prompt_tokens = 12, .completion_tokens = 5}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["id"], "chatcmpl-1");
  EXPECT_TRUE(usage["choices"].is_array());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  EXPECT_EQ(usage["usage"]["total_tokens"], 17);

  EXPECT_EQ(EventJson(UsageEvent(kCmpl, s, {}))["object"], "text_completion");
}

TEST(DoneEvent, IsTheSseDoneMarker) { EXPECT_EQ(DoneEvent(), "data: [DONE]\n\n"); }

// ---- Models and ids ------------------------------------------------------------------------

TEST(ModelsBody, ListsModels) {
  Json j = Json::parse(ModelsBody({"smollm2", "other"}, 1700000002));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "smollm2");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 1700000002);
  EXPECT_EQ(j["data"][0]["owned_by"], "sluice");
  EXPECT_EQ(j["data"][1]["id"], "other");
  EXPECT_TRUE(Json::parse(ModelsBody({}, 0))["data"].empty());
}

TEST(NewRequestId, PrefixAndRandomHex) {
  const std::string a = NewRequestId(kCmpl), b = NewRequestId(kCmpl);
  const std::string c = NewRequestId(kChat);
  ASSERT_TRUE(absl::StartsWith(a, "cmpl-"));
  ASSERT_TRUE(absl::StartsWith(c, "chatcmpl-"));
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(c.size(), 9u + 32u);
  EXPECT_EQ(a.substr(5).find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace sluice::router
