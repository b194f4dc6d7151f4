#include "router/openai_api.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/sampling.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace sluice::router {
namespace {

using Json = nlohmann::json;
// Responses keep OpenAI's key order.
using OJson = nlohmann::ordered_json;

// Status payloads carrying the error object's `param` and `code`.
constexpr char kParamPayload[] = "type.sluice.dev/router.openai.param";
constexpr char kCodePayload[] = "type.sluice.dev/router.openai.code";

// Deeper bodies are rejected before parsing; real requests nest 5 levels at most.
constexpr int kMaxNesting = 64;
constexpr int kMaxStop = 4;
constexpr int kMaxTopLogprobsChat = 20;
constexpr int kMaxLogprobsCompletions = 5;

// Abseil here is built with its own string_view type.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A status carrying the error object's `param` and `code` (each omitted when empty).
absl::Status ParamError(absl::StatusCode code, absl::string_view param, absl::string_view message,
                        absl::string_view api_code = "") {
  absl::Status status(code, message);
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  if (!api_code.empty()) status.SetPayload(kCodePayload, absl::Cord(api_code));
  return status;
}

absl::Status Invalid(absl::string_view param, absl::string_view message,
                     absl::string_view api_code = "") {
  return ParamError(absl::StatusCode::kInvalidArgument, param, message, api_code);
}

// ---- Reading fields --------------------------------------------------------------------

std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "an unexpected value";
  }
}

// The value as sent, shortened for messages.
std::string Shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

absl::Status TypeError(absl::string_view param, absl::string_view expected, const Json& got) {
  return Invalid(param, absl::StrCat("Invalid type for '", param, "': expected ", expected,
                                     ", but got ", Describe(got), " instead."));
}

absl::Status ValueError(absl::string_view param, absl::string_view expected, const Json& got) {
  return Invalid(param, absl::StrCat("Invalid '", param, "': expected ", expected, ", but got ",
                                     Shown(got), " instead."));
}

absl::Status MissingError(absl::string_view param) {
  return Invalid(param, absl::StrCat("Missing required parameter: '", param, "'."));
}

absl::Status UnsupportedError(absl::string_view param, absl::string_view what) {
  return Invalid(param, absl::StrCat("'", param, "' ", what), "unsupported_parameter");
}

// The field, or nullptr when it is absent or null (OpenAI treats both as "not given").
const Json* Find(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status ReadBool(const Json& obj, const char* key, bool* out) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return TypeError(key, "a boolean", *v);
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& obj, const char* key, std::string* out) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return TypeError(key, "a string", *v);
  *out = v->get<std::string>();
  return absl::OkStatus();
}

// An interval of accepted numbers; `hi` = infinity leaves it open above.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;

  bool Contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string Describe() const {
    if (std::isinf(hi)) return absl::StrFormat("a value %s %g", lo_open ? ">" : ">=", lo);
    return absl::StrFormat("a value in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
                           hi_open ? ')' : ']');
  }
};

absl::Status ReadNumber(const Json& obj, const char* key, const Range& range, float* out) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return TypeError(key, "a number", *v);
  const double x = v->get<double>();
  // The float the workers get must be in range too: 1e-50 rounds to 0, 0.99999999999 to 1,
  // 1e300 to infinity.
  const float f = static_cast<float>(x);
  if (!range.Contains(x) || !range.Contains(f)) return ValueError(key, range.Describe(), *v);
  *out = f;
  return absl::OkStatus();
}

// An integer (a float with no fraction counts, as in pydantic), or nullopt when `v` is not.
std::optional<int64_t> AsInteger(const Json& v) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::numeric_limits<int64_t>::max();
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9.2e18) {
      return static_cast<int64_t>(x);
    }
  }
  return std::nullopt;
}

absl::Status ReadIntValue(const Json& v, absl::string_view param, int64_t lo, int64_t hi,
                          int* out) {
  std::optional<int64_t> x = AsInteger(v);
  if (!x.has_value()) return TypeError(param, "an integer", v);
  if (*x < lo || *x > hi) {
    return ValueError(param, absl::StrFormat("a value in [%d, %d]", lo, hi), v);
  }
  *out = static_cast<int>(*x);
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& obj, const char* key, int64_t lo, int64_t hi, int* out) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  return ReadIntValue(*v, key, lo, hi, out);
}

// Token ids: a non-empty array of integers in [0, 2^31).
absl::Status ReadTokenIds(const Json& v, absl::string_view param, std::vector<int32_t>* out) {
  if (!v.is_array()) return TypeError(param, "an array of token ids", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int id = 0;
    SLUICE_RETURN_IF_ERROR(ReadIntValue(v[i], absl::StrCat(param, "[", i, "]"), 0,
                                        std::numeric_limits<int32_t>::max(), &id));
    out->push_back(id);
  }
  return absl::OkStatus();
}

// Rejects bodies nested deeper than kMaxNesting before a parser recurses into them.
absl::Status CheckNesting(std::string_view body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) {
        return Invalid("", absl::StrCat("The request body nests arrays and objects more than ",
                                        kMaxNesting, " levels deep."));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

// ---- Request parts ---------------------------------------------------------------------

absl::Status ParsePrompt(const Json& body, ApiRequest* req) {
  const Json* p = Find(body, "prompt");
  if (p == nullptr) return MissingError("prompt");
  auto set_text = [&](const Json& s, absl::string_view param) -> absl::Status {
    req->prompt = s.get<std::string>();
    if (req->prompt.empty()) return ValueError(param, "a non-empty prompt", s);
    return absl::OkStatus();
  };
  if (p->is_string()) return set_text(*p, "prompt");
  const absl::string_view kExpected = "a string, an array of token ids, or an array of one of them";
  if (!p->is_array()) return TypeError("prompt", kExpected, *p);
  if (p->empty()) return ValueError("prompt", "a non-empty prompt", *p);
  const Json& first = (*p)[0];
  if (first.is_number()) return ReadTokenIds(*p, "prompt", &req->prompt_token_ids);
  if (!first.is_string() && !first.is_array()) return TypeError("prompt[0]", kExpected, first);
  if (p->size() > 1) {
    return UnsupportedError("prompt",
                            "holds several prompts; batched prompts are not supported, send one "
                            "prompt per request.");
  }
  if (first.is_string()) return set_text(first, "prompt[0]");
  SLUICE_RETURN_IF_ERROR(ReadTokenIds(first, "prompt[0]", &req->prompt_token_ids));
  if (req->prompt_token_ids.empty()) return ValueError("prompt[0]", "a non-empty prompt", first);
  return absl::OkStatus();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts joined
// by "\n" (as vLLM joins them).
absl::Status ParseContent(const Json& content, const std::string& param, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return absl::OkStatus();
  }
  if (!content.is_array()) {
    return TypeError(param, "a string or an array of content parts", content);
  }
  std::vector<std::string> texts;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string part_param = absl::StrCat(param, "[", i, "]");
    if (!part.is_object()) return TypeError(part_param, "an object", part);
    const Json* type = Find(part, "type");
    if (type == nullptr) return MissingError(part_param + ".type");
    if (!type->is_string()) return TypeError(part_param + ".type", "a string", *type);
    if (type->get<std::string>() != "text") {
      return UnsupportedError(
          part_param + ".type",
          absl::StrCat("= ", Shown(*type), " is not supported: only \"text\" content parts are."));
    }
    const Json* text = Find(part, "text");
    if (text == nullptr) return MissingError(part_param + ".text");
    if (!text->is_string()) return TypeError(part_param + ".text", "a string", *text);
    texts.push_back(text->get<std::string>());
  }
  *out = absl::StrJoin(texts, "\n");
  return absl::OkStatus();
}

absl::Status ParseMessages(const Json& body, ApiRequest* req) {
  const Json* messages = Find(body, "messages");
  if (messages == nullptr) return MissingError("messages");
  if (!messages->is_array()) return TypeError("messages", "an array of messages", *messages);
  if (messages->empty()) return ValueError("messages", "at least one message", *messages);
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return TypeError(param, "an object", m);
    const Json* role = Find(m, "role");
    if (role == nullptr) return MissingError(param + ".role");
    if (!role->is_string()) return TypeError(param + ".role", "a string", *role);
    model::ChatMessage out;
    out.role = role->get<std::string>();
    if (out.role == "developer") out.role = "system";
    if (out.role == "tool" || out.role == "function") {
      return UnsupportedError(
          param + ".role",
          absl::StrCat("= ", Shown(*role), " is not supported: this server does not call tools."));
    }
    if (out.role != "system" && out.role != "user" && out.role != "assistant") {
      return ValueError(param + ".role", "one of 'system', 'developer', 'user', 'assistant'",
                        *role);
    }
    if (const Json* calls = Find(m, "tool_calls"); calls != nullptr && !calls->empty()) {
      return UnsupportedError(param + ".tool_calls",
                              "is not supported: this server does not call tools.");
    }
    const Json* content = Find(m, "content");
    if (content == nullptr) {
      // An assistant turn may leave its content out (OpenAI allows it alongside tool calls).
      if (out.role != "assistant") return MissingError(param + ".content");
    } else {
      SLUICE_RETURN_IF_ERROR(ParseContent(*content, param + ".content", &out.content));
    }
    req->messages.push_back(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& body, ApiRequest* req) {
  const Json* stop = Find(body, "stop");
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    if (stop->get<std::string>().empty()) return ValueError("stop", "a non-empty string", *stop);
    req->stop.push_back(stop->get<std::string>());
    return absl::OkStatus();
  }
  if (!stop->is_array()) return TypeError("stop", "a string or an array of strings", *stop);
  if (stop->size() > kMaxStop) {
    return ValueError("stop", absl::StrCat("at most ", kMaxStop, " stop strings"), *stop);
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    const Json& s = (*stop)[i];
    const std::string param = absl::StrCat("stop[", i, "]");
    if (!s.is_string()) return TypeError(param, "a string", s);
    if (s.get<std::string>().empty()) return ValueError(param, "a non-empty string", s);
    req->stop.push_back(s.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseLogprobs(Endpoint endpoint, const Json& body, ApiRequest* req) {
  if (endpoint == Endpoint::kCompletions) {
    const Json* v = Find(body, "logprobs");
    if (v == nullptr) return absl::OkStatus();
    SLUICE_RETURN_IF_ERROR(
        ReadIntValue(*v, "logprobs", 0, kMaxLogprobsCompletions, &req->top_logprobs));
    req->logprobs = true;
    return absl::OkStatus();
  }
  SLUICE_RETURN_IF_ERROR(ReadBool(body, "logprobs", &req->logprobs));
  SLUICE_RETURN_IF_ERROR(ReadInt(body, "top_logprobs", 0, kMaxTopLogprobsChat, &req->top_logprobs));
  if (req->top_logprobs > 0 && !req->logprobs) {
    return Invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
  }
  return absl::OkStatus();
}

absl::Status ParseStreamOptions(const Json& body, ApiRequest* req) {
  SLUICE_RETURN_IF_ERROR(ReadBool(body, "stream", &req->stream));
  const Json* options = Find(body, "stream_options");
  if (options == nullptr) return absl::OkStatus();
  if (!req->stream) {
    return Invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.");
  }
  if (!options->is_object()) return TypeError("stream_options", "an object", *options);
  if (const Json* v = Find(*options, "include_usage"); v != nullptr) {
    if (!v->is_boolean()) return TypeError("stream_options.include_usage", "a boolean", *v);
    req->include_usage_in_stream = v->get<bool>();
  }
  return absl::OkStatus();
}

// Fields that would change the output and that this server cannot honour.
absl::Status RejectUnsupported(Endpoint endpoint, const Json& body) {
  if (endpoint == Endpoint::kCompletions && Find(body, "best_of") != nullptr) {
    int n = 1, best_of = 1;
    SLUICE_RETURN_IF_ERROR(ReadInt(body, "n", 1, kMaxChoices, &n));
    SLUICE_RETURN_IF_ERROR(
        ReadInt(body, "best_of", 1, std::numeric_limits<int32_t>::max(), &best_of));
    if (best_of != n) {
      return UnsupportedError(
          "best_of", absl::StrCat("= ", best_of, " is not supported: only best_of = n (", n,
                                  ") is; every choice generated is returned."));
    }
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    float penalty = 0.f;
    SLUICE_RETURN_IF_ERROR(ReadNumber(body, key, {-2, 2}, &penalty));
    if (penalty != 0.f) {
      return UnsupportedError(key, "is not supported: only 0 is (use repetition_penalty).");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    bool echo = false;
    SLUICE_RETURN_IF_ERROR(ReadBool(body, "echo", &echo));
    if (echo) return UnsupportedError("echo", "= true is not supported.");
    std::string suffix;
    SLUICE_RETURN_IF_ERROR(ReadString(body, "suffix", &suffix));
    if (!suffix.empty()) return UnsupportedError("suffix", "is not supported.");
  }
  if (const Json* v = Find(body, "logit_bias"); v != nullptr) {
    if (!v->is_object()) return TypeError("logit_bias", "an object", *v);
    if (!v->empty()) return UnsupportedError("logit_bias", "is not supported.");
  }
  if (const Json* v = Find(body, "tools"); v != nullptr && !v->empty()) {
    return UnsupportedError("tools", "is not supported: this server does not call tools.");
  }
  if (const Json* v = Find(body, "response_format"); v != nullptr) {
    if (!v->is_object()) return TypeError("response_format", "an object", *v);
    const Json* type = Find(*v, "type");
    if (type != nullptr && *type != "text") {
      return UnsupportedError(
          "response_format.type",
          absl::StrCat("= ", Shown(*type), " is not supported: only \"text\" is."));
    }
  }
  return absl::OkStatus();
}

// The fields vLLM accepts that change nothing here at the value given: each with the values it
// may take (a request giving another is refused, naming it). No field is dropped in silence:
// a field neither parsed above nor listed here is refused as unrecognized, as OpenAI does.
struct DefaultOnlyField {
  const char* key;
  Endpoint only;        // kCompletions or kChatCompletions: that endpoint alone; else both
  bool both_endpoints;  // true: `only` is ignored
  const char* allowed;  // the values accepted, as they read in the error
  bool (*accepts)(const Json& v);
};

bool IsTrue(const Json& v) { return v.is_boolean() && v.get<bool>(); }
bool IsFalse(const Json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsBool(const Json& v) { return v.is_boolean(); }
bool IsZero(const Json& v) { return v.is_number() && v.get<double>() == 0; }
bool IsOne(const Json& v) { return v.is_number() && v.get<double>() == 1; }
bool IsEmptyObject(const Json& v) { return v.is_object() && v.empty(); }
bool IsNoTool(const Json& v) { return v == "none" || v == "auto"; }
bool IsAutoTier(const Json& v) { return v == "auto" || v == "default"; }

constexpr DefaultOnlyField kDefaultOnlyFields[] = {
    // Tools (tools itself is refused unless empty): without tools, choosing none or auto.
    {"tool_choice", Endpoint::kChatCompletions, false, "\"none\" or \"auto\"", IsNoTool},
    {"parallel_tool_calls", Endpoint::kChatCompletions, false, "a boolean", IsBool},
    {"function_call", Endpoint::kChatCompletions, false, "\"none\" or \"auto\"", IsNoTool},
    // The chat template: a generation prompt is always added, the last message never continued.
    {"add_generation_prompt", Endpoint::kChatCompletions, false, "true", IsTrue},
    {"continue_final_message", Endpoint::kChatCompletions, false, "false", IsFalse},
    {"echo", Endpoint::kChatCompletions, false, "false", IsFalse},
    // Detokenization and sampling as sluice does them: control tokens are rendered as their
    // text (Hugging Face's decode without skipping them).
    {"skip_special_tokens", Endpoint::kCompletions, true, "false", IsFalse},
    {"include_stop_str_in_output", Endpoint::kCompletions, true, "false", IsFalse},
    {"min_tokens", Endpoint::kCompletions, true, "0", IsZero},
    {"use_beam_search", Endpoint::kCompletions, true, "false", IsFalse},
    {"length_penalty", Endpoint::kCompletions, true, "1", IsOne},
    {"priority", Endpoint::kCompletions, true, "0", IsZero},
    // OpenAI's storage and billing: nothing stored, one tier.
    {"store", Endpoint::kCompletions, true, "false", IsFalse},
    {"metadata", Endpoint::kCompletions, true, "an empty object", IsEmptyObject},
    {"service_tier", Endpoint::kCompletions, true, "\"auto\" or \"default\"", IsAutoTier},
};

// The fields ParseObject and RejectUnsupported read, per endpoint.
bool Parsed(Endpoint endpoint, std::string_view key) {
  static constexpr std::string_view kBoth[] = {"model",
                                               "stream",
                                               "stream_options",
                                               "max_tokens",
                                               "temperature",
                                               "top_p",
                                               "top_k",
                                               "min_p",
                                               "repetition_penalty",
                                               "seed",
                                               "stop",
                                               "stop_token_ids",
                                               "ignore_eos",
                                               "logprobs",
                                               "n",
                                               "presence_penalty",
                                               "frequency_penalty",
                                               "logit_bias",
                                               "tools",
                                               "response_format",
                                               "kv_compression",
                                               "user"};
  static constexpr std::string_view kCompletionsOnly[] = {"prompt", "best_of", "echo", "suffix"};
  static constexpr std::string_view kChatOnly[] = {"messages", "max_completion_tokens",
                                                   "top_logprobs"};
  const auto in = [&](auto& keys) { return absl::c_linear_search(keys, key); };
  return in(kBoth) || (endpoint == Endpoint::kCompletions ? in(kCompletionsOnly) : in(kChatOnly));
}

absl::Status RejectUnknownFields(Endpoint endpoint, const Json& body) {
  for (const auto& [key, value] : body.items()) {
    if (Parsed(endpoint, key)) continue;
    const DefaultOnlyField* listed = nullptr;
    for (const DefaultOnlyField& f : kDefaultOnlyFields) {
      if (key == f.key && (f.both_endpoints || f.only == endpoint)) listed = &f;
    }
    if (listed == nullptr) {
      return Invalid(key, absl::StrCat("Unrecognized request argument supplied: '", key, "'."),
                     "unrecognized_parameter");
    }
    if (!value.is_null() && !listed->accepts(value)) {
      return UnsupportedError(key, absl::StrCat("= ", Shown(value), " is not supported: only ",
                                                listed->allowed, " is."));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ApiRequest> ParseObject(Endpoint endpoint, const Json& body) {
  ApiRequest req;
  req.endpoint = endpoint;
  SLUICE_RETURN_IF_ERROR(RejectUnknownFields(endpoint, body));
  // Optional, as in vLLM and llama.cpp's server: absent means the served model.
  if (const Json* model = Find(body, "model"); model != nullptr) {
    if (!model->is_string()) return TypeError("model", "a string", *model);
    req.model = model->get<std::string>();
    if (req.model.empty()) return ValueError("model", "a model name", *model);
  }

  if (endpoint == Endpoint::kCompletions) {
    SLUICE_RETURN_IF_ERROR(ParsePrompt(body, &req));
  } else {
    SLUICE_RETURN_IF_ERROR(ParseMessages(body, &req));
  }
  SLUICE_RETURN_IF_ERROR(ParseStreamOptions(body, &req));

  const int kIntMax = std::numeric_limits<int32_t>::max();
  SLUICE_RETURN_IF_ERROR(ReadInt(body, "max_tokens", 1, kIntMax, &req.max_tokens));
  if (endpoint == Endpoint::kChatCompletions) {
    SLUICE_RETURN_IF_ERROR(ReadInt(body, "max_completion_tokens", 1, kIntMax, &req.max_tokens));
  }
  const double kInf = std::numeric_limits<double>::infinity();
  SLUICE_RETURN_IF_ERROR(ReadNumber(body, "temperature", {0, 2}, &req.temperature));
  SLUICE_RETURN_IF_ERROR(ReadNumber(body, "top_p", {0, 1, /*lo_open=*/true}, &req.top_p));
  SLUICE_RETURN_IF_ERROR(ReadInt(body, "top_k", -1, kIntMax, &req.top_k));
  if (req.top_k == -1) req.top_k = 0;
  SLUICE_RETURN_IF_ERROR(
      ReadNumber(body, "min_p", {0, 1, /*lo_open=*/false, /*hi_open=*/true}, &req.min_p));
  SLUICE_RETURN_IF_ERROR(ReadNumber(body, "repetition_penalty",
                                    {0, kInf, /*lo_open=*/true, /*hi_open=*/true},
                                    &req.repetition_penalty));
  if (const Json* seed = Find(body, "seed"); seed != nullptr) {
    if (seed->is_number_unsigned()) {
      req.seed = seed->get<uint64_t>();
    } else if (std::optional<int64_t> s = AsInteger(*seed); s.has_value()) {
      req.seed = static_cast<uint64_t>(*s);
    } else {
      return TypeError("seed", "an integer", *seed);
    }
  }
  SLUICE_RETURN_IF_ERROR(ParseStop(body, &req));
  if (const Json* ids = Find(body, "stop_token_ids"); ids != nullptr) {
    SLUICE_RETURN_IF_ERROR(ReadTokenIds(*ids, "stop_token_ids", &req.stop_token_ids));
  }
  SLUICE_RETURN_IF_ERROR(ReadBool(body, "ignore_eos", &req.ignore_eos));
  SLUICE_RETURN_IF_ERROR(ParseLogprobs(endpoint, body, &req));
  SLUICE_RETURN_IF_ERROR(ReadInt(body, "n", 1, kMaxChoices, &req.n));
  SLUICE_RETURN_IF_ERROR(RejectUnsupported(endpoint, body));
  SLUICE_RETURN_IF_ERROR(ReadString(body, "kv_compression", &req.kv_compression));
  SLUICE_RETURN_IF_ERROR(ReadString(body, "user", &req.user));
  return req;
}

// ---- Responses -------------------------------------------------------------------------

std::string Dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

std::string Event(const OJson& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }

// The shortest decimal that reads back as `v` (-0.1f → -0.1, not -0.10000000149011612);
// values JSON cannot hold become vLLM's -9999.0.
double WireFloat(float v) {
  if (!std::isfinite(v)) return -9999.0;
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  double d = v;
  std::from_chars(buf, r.ptr, d);
  return d;
}

OJson FinishReasonJson(FinishReason reason) {
  if (reason == FinishReason::kNone) return nullptr;
  return std::string(FinishReasonName(reason));
}

OJson NullIfEmpty(const std::string& s) { return s.empty() ? OJson(nullptr) : OJson(s); }

OJson UsageJson(const Usage& usage) {
  OJson u = OJson::object();
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  u["prompt_tokens_details"] = OJson{{"cached_tokens", usage.cached_tokens}};
  return u;
}

// Characters (UTF-8 lead bytes) in `bytes`.
int CountChars(std::string_view bytes) {
  int n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
  return n;
}

// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
OJson CompletionsLogprobs(const std::vector<TokenLogprob>& tokens, int text_offset) {
  OJson text_offsets = OJson::array(), token_logprobs = OJson::array(), texts = OJson::array(),
        tops = OJson::array();
  for (const TokenLogprob& t : tokens) {
    text_offsets.push_back(text_offset);
    text_offset += CountChars(t.token);
    token_logprobs.push_back(WireFloat(t.logprob));
    texts.push_back(t.token);
    OJson top = OJson::object();
    for (const auto& [text, logprob] : t.top) top[text] = WireFloat(logprob);
    tops.push_back(std::move(top));
  }
  OJson j = OJson::object();
  j["text_offset"] = std::move(text_offsets);
  j["token_logprobs"] = std::move(token_logprobs);
  j["tokens"] = std::move(texts);
  j["top_logprobs"] = std::move(tops);
  return j;
}

OJson ChatTokenJson(const std::string& token, float logprob) {
  OJson j = OJson::object();
  j["token"] = token;
  j["logprob"] = WireFloat(logprob);
  OJson bytes = OJson::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  j["bytes"] = std::move(bytes);
  return j;
}

// {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal}.
OJson ChatLogprobs(const std::vector<TokenLogprob>& tokens) {
  OJson content = OJson::array();
  for (const TokenLogprob& t : tokens) {
    OJson j = ChatTokenJson(t.token, t.logprob);
    OJson top = OJson::array();
    for (const auto& [text, logprob] : t.top) top.push_back(ChatTokenJson(text, logprob));
    j["top_logprobs"] = std::move(top);
    content.push_back(std::move(j));
  }
  OJson j = OJson::object();
  j["content"] = std::move(content);
  j["refusal"] = nullptr;
  return j;
}

OJson LogprobsJson(Endpoint endpoint, const std::optional<std::vector<TokenLogprob>>& tokens,
                   int text_offset) {
  if (!tokens.has_value()) return nullptr;
  return endpoint == Endpoint::kCompletions ? CompletionsLogprobs(*tokens, text_offset)
                                            : ChatLogprobs(*tokens);
}

OJson Header(std::string_view id, std::string_view object, int64_t created,
             std::string_view model) {
  OJson j = OJson::object();
  j["id"] = id;
  j["object"] = object;
  j["created"] = created;
  j["model"] = model;
  return j;
}

}  // namespace

absl::StatusOr<ApiRequest> ParseRequest(Endpoint endpoint, std::string_view body) {
  SLUICE_RETURN_IF_ERROR(CheckNesting(body));
  Json parsed;
  try {
    parsed = Json::parse(body);
  } catch (const Json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 9: ..." or,
    // for a number no double holds, "[json.exception.out_of_range.406] number overflow ...".
    absl::string_view what = e.what();
    if (size_t bracket = what.find("] "); bracket != absl::string_view::npos) {
      what.remove_prefix(bracket + 2);
    }
    return Invalid("", absl::StrCat("The request body is not valid JSON: ", what));
  }
  if (!parsed.is_object()) {
    return ParamError(
        absl::StatusCode::kInvalidArgument, "",
        absl::StrCat("The request body must be a JSON object, but it is ", Describe(parsed), "."));
  }
  return ParseObject(endpoint, parsed);
}

absl::Status InvalidParamError(std::string_view param, std::string_view message,
                               std::string_view api_code) {
  return Invalid(AbslView(param), AbslView(message), AbslView(api_code));
}

absl::Status ModelNotFoundError(std::string_view model) {
  return ParamError(
      absl::StatusCode::kNotFound, "model",
      absl::StrCat("The model `", AbslView(model), "` does not exist on this server."),
      "model_not_found");
}

ApiError FromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "timeout";
      break;
    case absl::StatusCode::kOk:
      e.http_status = 500;
      e.type = "server_error";
      e.message = "internal error: an OK status was reported as an error";
      return e;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  if (auto p = status.GetPayload(kParamPayload)) e.param = std::string(*p);
  if (auto c = status.GetPayload(kCodePayload)) e.code = std::string(*c);
  return e;
}

ApiError RequestTooLargeError(size_t body_bytes, size_t limit_bytes) {
  ApiError e;
  e.http_status = 413;
  e.type = "invalid_request_error";
  e.code = "request_too_large";
  e.message = absl::StrCat("The request body is ", body_bytes,
                           " bytes; this server accepts at most ", limit_bytes, " bytes.");
  return e;
}

std::string ErrorBody(const ApiError& error) {
  OJson inner = OJson::object();
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = NullIfEmpty(error.param);
  inner["code"] = NullIfEmpty(error.code);
  OJson j = OJson::object();
  j["error"] = std::move(inner);
  return Dump(j);
}

std::string CompletionBody(Endpoint endpoint, const Completion& c) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  OJson j = Header(c.id, chat ? "chat.completion" : "text_completion", c.created, c.model);
  OJson choices = OJson::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    const CompletionChoice& one = c.choices[i];
    OJson choice = OJson::object();
    choice["index"] = i;
    if (chat) {
      OJson message = OJson::object();
      message["role"] = "assistant";
      message["content"] = one.text;
      choice["message"] = std::move(message);
    } else {
      choice["text"] = one.text;
    }
    choice["logprobs"] = LogprobsJson(endpoint, one.logprobs, 0);
    choice["finish_reason"] = FinishReasonJson(one.finish_reason);
    choice["stop_reason"] = NullIfEmpty(one.stop_reason);
    choices.push_back(std::move(choice));
  }
  j["choices"] = std::move(choices);
  j["usage"] = UsageJson(c.usage);
  return Dump(j);
}

std::string ChunkEvent(Endpoint endpoint, const StreamInfo& stream, const Chunk& chunk) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  OJson j = Header(stream.id, chat ? "chat.completion.chunk" : "text_completion", stream.created,
                   stream.model);
  OJson choice = OJson::object();
  choice["index"] = chunk.index;
  if (chat) {
    OJson delta = OJson::object();
    if (chunk.first) delta["role"] = "assistant";
    if (chunk.first || !chunk.text.empty()) delta["content"] = chunk.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = chunk.text;
  }
  choice["logprobs"] = LogprobsJson(endpoint, chunk.logprobs, chunk.text_offset);
  choice["finish_reason"] = FinishReasonJson(chunk.finish_reason);
  choice["stop_reason"] = NullIfEmpty(chunk.stop_reason);
  j["choices"] = OJson::array({std::move(choice)});
  if (stream.include_usage) j["usage"] = nullptr;
  return Event(j);
}

std::string UsageEvent(Endpoint endpoint, const StreamInfo& stream, const Usage& usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  OJson j = Header(stream.id, chat ? "chat.completion.chunk" : "text_completion", stream.created,
                   stream.model);
  j["choices"] = OJson::array();
  j["usage"] = UsageJson(usage);
  return Event(j);
}

std::string ErrorEvent(const ApiError& error) {
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

std::string DoneEvent() { return "data: [DONE]\n\n"; }

std::string ModelsBody(const std::vector<std::string>& model_ids, int64_t created,
                       std::string_view owned_by) {
  OJson data = OJson::array();
  for (const std::string& id : model_ids) {
    OJson m = OJson::object();
    m["id"] = id;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = owned_by;
    data.push_back(std::move(m));
  }
  OJson j = OJson::object();
  j["object"] = "list";
  j["data"] = std::move(data);
  return Dump(j);
}

std::string NewRequestId(Endpoint endpoint) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s%016x%016x", endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-",
                         absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "";
}

}  // namespace sluice::router
