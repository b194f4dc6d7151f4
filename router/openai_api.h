// OpenAI-compatible request parsing and response building for /v1/completions and
// /v1/chat/completions, with the field names, object types and shapes of OpenAI's API and
// vLLM's OpenAI-compatible server. No networking: bodies in, typed requests out; typed
// results in, JSON bodies and server-sent events out.
//
//   absl::StatusOr<ApiRequest> req = ParseRequest(Endpoint::kChatCompletions, body);
//   if (!req.ok()) {
//     ApiError err = FromStatus(req.status());
//     return Reply(err.http_status, ErrorBody(err));
//   }
//   ...
//   StreamInfo s{NewRequestId(req->endpoint), now, req->model, req->include_usage_in_stream};
//   Send(ChunkEvent(req->endpoint, s, {.first = true}));
//   Send(ChunkEvent(req->endpoint, s, {.text = "Hello"}));
//   Send(ChunkEvent(req->endpoint, s, {.finish_reason = FinishReason::kStop}));
//   if (s.include_usage) Send(UsageEvent(req->endpoint, s, usage));
//   Send(DoneEvent());
//
// Every body is valid UTF-8 JSON: bytes in texts that are not valid UTF-8 become U+FFFD.
#ifndef SLUICE_ROUTER_OPENAI_API_H_
#define SLUICE_ROUTER_OPENAI_API_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/chat_template.h"

namespace sluice::router {

enum class Endpoint { kCompletions, kChatCompletions };

// ---- Requests --------------------------------------------------------------------------

// A validated request. Optional fields hold their defaults when the body leaves them out
// or sets them to null.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty when the request names none: the served model

  // Completions: exactly one of `prompt` (non-empty text) and `prompt_token_ids`
  // (non-empty; ids are >= 0 but not checked against a vocabulary).
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  // Chat: at least one message; roles are "system", "user" or "assistant" ("developer"
  // arrives as "system"); a content given as parts is their texts joined by "\n", as vLLM
  // does.
  std::vector<model::ChatMessage> messages;

  bool stream = false;
  bool include_usage_in_stream = false;  // stream_options.include_usage

  // max_tokens, or for chat max_completion_tokens (which wins when both are given);
  // -1 when neither is given, for the server to choose.
  int max_tokens = -1;
  float temperature = 1.f;              // [0, 2]; 0 = greedy
  float top_p = 1.f;                    // (0, 1]
  int top_k = 0;                        // vLLM extension; 0 = off (-1 in a body also means off)
  float min_p = 0.f;                    // vLLM extension; [0, 1)
  float repetition_penalty = 1.f;       // vLLM extension; > 0, 1 = off
  std::optional<uint64_t> seed;         // a negative seed in the body wraps to uint64
  std::vector<std::string> stop;        // up to 4 non-empty strings
  std::vector<int32_t> stop_token_ids;  // vLLM extension
  bool ignore_eos = false;              // vLLM extension

  // Chat: `logprobs` (bool) and `top_logprobs` (0..20). Completions: `logprobs` (0..5)
  // turns logprobs on with that many alternatives per token.
  bool logprobs = false;
  int top_logprobs = 0;

  // Sluice extension: a KV compression preset spec such as "kivi4" or
  // "leankv-k8v4:alpha_high=2", passed on unchecked; empty = the server's default.
  std::string kv_compression;
  std::string user;
  // Choices generated from the prompt, 1 to kMaxChoices (`best_of`, completions only, may be
  // given equal to n).
  int n = 1;
};

// Parses and validates a request body for `endpoint`. Errors are InvalidArgument with a
// message naming the field and what is wrong with it; FromStatus turns them into the
// error object, with `param` set to the field ("temperature", "messages[1].role").
//
// Unknown fields are ignored. Fields that would change the output but cannot be honoured
// are rejected rather than ignored: n and best_of other than 1, echo, non-zero
// presence/frequency penalties, logit_bias, tools, a response_format other than text, and
// a completions suffix.
absl::StatusOr<ApiRequest> ParseRequest(Endpoint endpoint, std::string_view body);

// ---- Errors ----------------------------------------------------------------------------

// OpenAI's error object, with the HTTP status it is sent with.
struct ApiError {
  int http_status = 500;
  std::string type;  // "invalid_request_error", "rate_limit_error", "server_error"
  std::string message;
  std::string param;  // the request field at fault; empty = null
  std::string code;   // machine-readable code ("model_not_found"); empty = null
};

// An InvalidArgument (400) status naming the request field at fault, with an optional
// OpenAI error code such as "context_length_exceeded".
absl::Status InvalidParamError(std::string_view param, std::string_view message,
                               std::string_view api_code = "");

// A NotFound (404) status for a model this server does not serve: param "model", code
// "model_not_found".
absl::Status ModelNotFoundError(std::string_view model);

// Maps a status to the error sent to the client:
//   InvalidArgument, OutOfRange, FailedPrecondition → 400 invalid_request_error
//   NotFound → 404 invalid_request_error
//   ResourceExhausted → 429 rate_limit_error, code "rate_limit_exceeded"
//   Unavailable → 503 server_error, code "service_unavailable"
//   DeadlineExceeded → 504 server_error, code "timeout"
//   anything else → 500 server_error
// `param` and `code` come from InvalidParamError / ModelNotFoundError when the status was
// made by them. OK maps to a 500 saying so, since it is not an error to report.
ApiError FromStatus(const absl::Status& status);

// 413 for a body over the server's limit (checked before parsing).
ApiError RequestTooLargeError(size_t body_bytes, size_t limit_bytes);

// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const ApiError& error);

// ---- Responses -------------------------------------------------------------------------

enum class FinishReason {
  kNone,    // still generating: null on the wire
  kStop,    // "stop": a stop token or stop string
  kLength,  // "length": max_tokens or the context length
  kAbort,   // "abort" (vLLM): cancelled or failed on the server
};

// "stop", "length", "abort"; "" for kNone.
std::string_view FinishReasonName(FinishReason reason);

// One generated token's log probability, with its most likely alternatives.
struct TokenLogprob {
  // The token's bytes; may be part of a UTF-8 character. Chat logprobs carry them exactly
  // in "bytes"; token texts on the wire are these bytes with invalid UTF-8 as U+FFFD.
  std::string token;
  float logprob = 0.f;  // -inf and NaN go on the wire as -9999.0, as in vLLM
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from a prefix cache (prompt_tokens_details)
};

// A finished, non-streamed result.
// One choice of a completion.
struct CompletionChoice {
  std::string text;
  FinishReason finish_reason = FinishReason::kStop;
  std::string stop_reason;  // vLLM's stop_reason: the stop string matched; empty = null
  std::optional<std::vector<TokenLogprob>> logprobs;  // set when the request asked
};

struct Completion {
  std::string id;       // NewRequestId
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::vector<CompletionChoice> choices;  // choices[i] has index i
  Usage usage;                            // of every choice together
};

// "text_completion" with choices[i].text, or "chat.completion" with choices[i].message
// {role: assistant, content}; logprobs in each endpoint's shape:
//   completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
//   chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
// and usage {prompt_tokens, completion_tokens, total_tokens}.
std::string CompletionBody(Endpoint endpoint, const Completion& completion);

// What every chunk of one stream shares.
struct StreamInfo {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool include_usage = false;  // every chunk carries "usage": null, as OpenAI does
};

// One streamed piece of the result.
struct Chunk {
  // Chat: this is the stream's first chunk, whose delta carries {"role": "assistant"}.
  bool first = false;
  std::string text;                                   // the new text
  std::optional<std::vector<TokenLogprob>> logprobs;  // the new tokens' logprobs
  // Completions logprobs: characters of completion text sent before this chunk, where
  // this chunk's text_offset values start.
  int text_offset = 0;
  FinishReason finish_reason = FinishReason::kNone;  // set on the last chunk only
  std::string stop_reason;
  int index = 0;  // the choice
};

// One SSE event, "data: {...}\n\n": a "text_completion" chunk with one choice's text, or a
// "chat.completion.chunk" with its delta ({"role": "assistant", "content": ...}
// when first, {"content": ...} after, {} for a last chunk with no text).
std::string ChunkEvent(Endpoint endpoint, const StreamInfo& stream, const Chunk& chunk);

// The final usage event of a stream that asked for it: choices [] and usage {...}.
std::string UsageEvent(Endpoint endpoint, const StreamInfo& stream, const Usage& usage);

// An error in the middle of a stream: "data: {"error": {...}}\n\n".
std::string ErrorEvent(const ApiError& error);

// "data: [DONE]\n\n".
std::string DoneEvent();

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by"}]}.
std::string ModelsBody(const std::vector<std::string>& model_ids, int64_t created,
                       std::string_view owned_by = "sluice");

// "cmpl-" or "chatcmpl-" followed by 32 random hex digits. Thread-safe.
std::string NewRequestId(Endpoint endpoint);

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_OPENAI_API_H_
