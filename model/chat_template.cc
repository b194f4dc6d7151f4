#include "model/chat_template.h"

#include <cctype>
#include <optional>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace sluice::model {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";

// ---- lexing the template into tags ------------------------------------------------------

enum class SegmentKind { kText, kStatement, kExpression, kComment };

struct Segment {
  SegmentKind kind;
  std::string body;          // text, or the inside of the tag without delimiters and markers
  bool trim_before = false;  // "{%-": strip whitespace before the tag
  bool plus_before = false;  // "{%+": no lstrip_blocks for this tag
  bool trim_after = false;   // "-%}": strip whitespace after the tag
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

// Splits `jinja` into text and tags, applying the whitespace control Hugging Face renders
// chat templates with: `-` markers, trim_blocks and lstrip_blocks.
std::optional<std::vector<Segment>> Lex(std::string_view jinja) {
  // Jinja drops one newline at the end of the template (keep_trailing_newline=False).
  if (jinja.ends_with("\r\n")) {
    jinja.remove_suffix(2);
  } else if (jinja.ends_with("\n")) {
    jinja.remove_suffix(1);
  }
  std::vector<Segment> segments;
  size_t pos = 0;
  while (pos < jinja.size()) {
    size_t open = pos;
    while (true) {
      open = jinja.find('{', open);
      if (open == std::string_view::npos || open + 1 >= jinja.size()) {
        open = std::string_view::npos;
        break;
      }
      const char c = jinja[open + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++open;
    }
    if (open == std::string_view::npos) {
      segments.push_back({SegmentKind::kText, std::string(jinja.substr(pos))});
      break;
    }
    if (open > pos)
      segments.push_back({SegmentKind::kText, std::string(jinja.substr(pos, open - pos))});
    Segment tag;
    const char kind = jinja[open + 1];
    tag.kind = kind == '{'   ? SegmentKind::kExpression
               : kind == '%' ? SegmentKind::kStatement
                             : SegmentKind::kComment;
    const char close = kind == '{' ? '}' : kind;
    size_t i = open + 2;
    if (i < jinja.size() && jinja[i] == '-') {
      tag.trim_before = true;
      ++i;
    } else if (i < jinja.size() && jinja[i] == '+') {
      tag.plus_before = true;
      ++i;
    }
    // Find the closing delimiter outside string literals.
    const size_t body_start = i;
    char quote = 0;
    size_t end = std::string_view::npos;
    for (; i + 1 < jinja.size(); ++i) {
      const char c = jinja[i];
      if (quote != 0) {
        if (c == '\\') {
          ++i;
        } else if (c == quote) {
          quote = 0;
        }
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == close && jinja[i + 1] == '}') {
        end = i;
        break;
      }
    }
    if (end == std::string_view::npos) return std::nullopt;  // unterminated tag
    size_t body_end = end;
    if (body_end > body_start && jinja[body_end - 1] == '-') {
      tag.trim_after = true;
      --body_end;
    }
    tag.body = std::string(jinja.substr(body_start, body_end - body_start));
    segments.push_back(std::move(tag));
    pos = end + 2;
  }
  // Whitespace control on the text between tags.
  for (size_t k = 0; k < segments.size(); ++k) {
    Segment& s = segments[k];
    if (s.kind != SegmentKind::kText) continue;
    const Segment* prev = k > 0 ? &segments[k - 1] : nullptr;
    const Segment* next = k + 1 < segments.size() ? &segments[k + 1] : nullptr;
    const bool block_before = prev != nullptr && prev->kind != SegmentKind::kExpression;
    const bool block_after = next != nullptr && next->kind != SegmentKind::kExpression;
    std::string& text = s.body;
    // The end first: lstrip_blocks looks for the line start in the text as written.
    if (next != nullptr && next->trim_before) {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (block_after && !next->plus_before) {
      // lstrip_blocks: spaces and tabs between a line start and a block tag go.
      const size_t newline = text.rfind('\n');
      const size_t line = newline == std::string::npos ? 0 : newline + 1;
      const bool line_start = newline != std::string::npos || k == 0;
      if (line_start && text.find_first_not_of(" \t", line) == std::string::npos) {
        text.resize(line);
      }
    }
    if (prev != nullptr && prev->trim_after) {
      size_t b = 0;
      while (b < text.size() && IsSpace(text[b])) ++b;
      text.erase(0, b);
    } else if (block_before) {  // trim_blocks: the first newline after a block tag goes
      if (absl::StartsWith(text, "\n")) {
        text.erase(0, 1);
      } else if (absl::StartsWith(text, "\r\n")) {
        text.erase(0, 2);
      }
    }
  }
  return segments;
}

// ---- expressions ------------------------------------------------------------------------

struct ExprToken {
  enum Kind { kString, kName, kNumber, kOp } kind;
  std::string text;  // strings: the decoded value
};

std::optional<std::vector<ExprToken>> LexExpression(std::string_view s) {
  std::vector<ExprToken> tokens;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpace(c)) {
      ++i;
    } else if (c == '\'' || c == '"') {
      std::string value;
      ++i;
      while (i < s.size() && s[i] != c) {
        if (s[i] == '\\' && i + 1 < s.size()) {
          const char e = s[i + 1];
          switch (e) {
            case 'n':
              value += '\n';
              break;
            case 't':
              value += '\t';
              break;
            case 'r':
              value += '\r';
              break;
            case '\\':
            case '\'':
            case '"':
              value += e;
              break;
            default:
              value += '\\';
              value += e;
              break;
          }
          i += 2;
        } else {
          value += s[i++];
        }
      }
      if (i >= s.size()) return std::nullopt;  // unterminated string
      ++i;
      tokens.push_back({ExprToken::kString, std::move(value)});
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      tokens.push_back({ExprToken::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      tokens.push_back({ExprToken::kNumber, std::string(s.substr(i, j - i))});
      i = j;
    } else {
      static constexpr std::string_view kTwoChar[] = {"==", "!=", "<=", ">=", "**", "//"};
      size_t len = 1;
      for (std::string_view op : kTwoChar) {
        if (s.substr(i).starts_with(op)) len = 2;
      }
      tokens.push_back({ExprToken::kOp, std::string(s.substr(i, len))});
      i += len;
    }
  }
  return tokens;
}

std::string QuoteString(std::string_view value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\' || c == '\'') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out + "'";
}

// One spelling per meaning for the expressions we compare: single spaces between tokens,
// single-quoted strings, and `a.b` written `a['b']`.
std::string Canonical(const std::vector<ExprToken>& tokens, size_t begin, size_t end) {
  std::vector<std::string> parts;
  for (size_t i = begin; i < end; ++i) {
    const ExprToken& t = tokens[i];
    if (t.kind == ExprToken::kOp && t.text == "." && i + 1 < end &&
        tokens[i + 1].kind == ExprToken::kName) {
      parts.insert(parts.end(), {"[", QuoteString(tokens[i + 1].text), "]"});
      ++i;
    } else if (t.kind == ExprToken::kString) {
      parts.push_back(QuoteString(t.text));
    } else {
      parts.push_back(t.text);
    }
  }
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

std::string CanonicalStatement(std::string_view body) {
  const auto tokens = LexExpression(body);
  if (!tokens.has_value()) return std::string(body);  // matches no expected statement
  return Canonical(*tokens, 0, tokens->size());
}

// A piece of output: a literal string, or an expression in canonical form.
struct Term {
  bool literal;
  std::string value;
  bool operator==(const Term&) const = default;
};

// Appends the terms of a `{{ a + 'b' ~ c }}` expression, folding adjacent literals.
bool AppendTerms(std::string_view body, std::vector<Term>* terms) {
  const auto tokens = LexExpression(body);
  if (!tokens.has_value() || tokens->empty()) return false;
  int depth = 0;
  size_t start = 0;
  auto add = [&](size_t begin, size_t end) {
    if (begin == end) return false;
    Term term;
    term.literal = end - begin == 1 && (*tokens)[begin].kind == ExprToken::kString;
    term.value = term.literal ? (*tokens)[begin].text : Canonical(*tokens, begin, end);
    if (term.literal && !terms->empty() && terms->back().literal) {
      terms->back().value += term.value;
    } else {
      terms->push_back(std::move(term));
    }
    return true;
  };
  for (size_t i = 0; i < tokens->size(); ++i) {
    const ExprToken& t = (*tokens)[i];
    if (t.kind != ExprToken::kOp) continue;
    if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
    if (t.text == ")" || t.text == "]" || t.text == "}") --depth;
    if (depth == 0 && (t.text == "+" || t.text == "~")) {
      if (!add(start, i)) return false;
      start = i + 1;
    }
  }
  return add(start, tokens->size());
}

// The template as a sequence of statements and merged runs of output.
struct Item {
  bool statement;
  std::string canonical;    // statements
  std::vector<Term> terms;  // output
  std::string source;       // for error messages
};

std::optional<std::vector<Item>> ToItems(const std::vector<Segment>& segments) {
  std::vector<Item> items;
  for (const Segment& s : segments) {
    switch (s.kind) {
      case SegmentKind::kComment:
        break;
      case SegmentKind::kStatement:
        items.push_back({true, CanonicalStatement(s.body), {}, absl::StrCat("{%", s.body, "%}")});
        break;
      case SegmentKind::kText:
      case SegmentKind::kExpression: {
        if (s.kind == SegmentKind::kText && s.body.empty()) break;
        if (items.empty() || items.back().statement) items.push_back({false, "", {}, ""});
        Item& out = items.back();
        if (s.kind == SegmentKind::kText) {
          if (!out.terms.empty() && out.terms.back().literal) {
            out.terms.back().value += s.body;
          } else {
            out.terms.push_back({true, s.body});
          }
          absl::StrAppend(&out.source, s.body);
        } else {
          if (!AppendTerms(s.body, &out.terms)) return std::nullopt;
          absl::StrAppend(&out.source, "{{", s.body, "}}");
        }
        break;
      }
    }
  }
  return items;
}

absl::Status NotSupported(absl::string_view why) {
  return absl::UnimplementedError(absl::StrCat(
      "chat template is not supported: ", why,
      ". Only ChatML templates (<|im_start|>role\\ncontent<|im_end|>\\n, optionally with a "
      "default system prompt) are recognised; pass a ChatML template or use the model's "
      "prompt format directly"));
}

// Matches the item sequence of a ChatML template, with the default system prompt.
class ChatMlMatcher {
 public:
  explicit ChatMlMatcher(const std::vector<Item>& items) : items_(items) {}

  absl::StatusOr<std::string> Match() {
    std::string system;
    const bool system_first = DefaultSystem("if messages[0]['role'] != 'system'", &system);
    if (!Statement("for message in messages")) return Mismatch();
    if (!system_first) DefaultSystem("if loop.first and messages[0]['role'] != 'system'", &system);
    const std::vector<Term> body = {{true, std::string(kImStart)},
                                    {false, "message [ 'role' ]"},
                                    {true, "\n"},
                                    {false, "message [ 'content' ]"},
                                    {true, absl::StrCat(kImEnd, "\n")}};
    if (!Output(body) || !Statement("endfor")) return Mismatch();
    if (!Statement("if add_generation_prompt") ||
        !Output({{true, absl::StrCat(kImStart, "assistant\n")}}) || !Statement("endif")) {
      return Mismatch();
    }
    if (next_ != items_.size()) return Mismatch();
    return system;
  }

 private:
  bool Statement(std::string_view jinja) {
    if (next_ >= items_.size() || !items_[next_].statement ||
        items_[next_].canonical != CanonicalStatement(jinja)) {
      return false;
    }
    ++next_;
    return true;
  }

  bool Output(const std::vector<Term>& terms) {
    if (next_ >= items_.size() || items_[next_].statement || items_[next_].terms != terms) {
      return false;
    }
    ++next_;
    return true;
  }

  // `{% <condition> %}{{ '<|im_start|>system\n...<|im_end|>\n' }}{% endif %}`
  bool DefaultSystem(std::string_view condition, std::string* prompt) {
    const size_t start = next_;
    if (!Statement(condition)) return false;
    const std::string prefix = absl::StrCat(kImStart, "system\n");
    const std::string suffix = absl::StrCat(kImEnd, "\n");
    if (next_ < items_.size() && !items_[next_].statement && items_[next_].terms.size() == 1 &&
        items_[next_].terms[0].literal) {
      absl::string_view text = items_[next_].terms[0].value;
      if (absl::ConsumePrefix(&text, prefix) && absl::ConsumeSuffix(&text, suffix) &&
          !text.empty()) {
        ++next_;
        if (Statement("endif")) {
          *prompt = std::string(text);
          return true;
        }
      }
    }
    next_ = start;
    return false;
  }

  absl::Status Mismatch() const {
    if (next_ >= items_.size()) return NotSupported("it ends before the ChatML structure does");
    std::string source = items_[next_].source;
    if (source.size() > 120) source = absl::StrCat(source.substr(0, 117), "...");
    return NotSupported(absl::StrFormat("it differs from ChatML at \"%s\"", absl::CEscape(source)));
  }

  const std::vector<Item>& items_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromGgufTemplate(std::string_view jinja_text) {
  if (jinja_text.find(kImStart) == std::string_view::npos ||
      jinja_text.find(kImEnd) == std::string_view::npos) {
    return NotSupported("it is not a ChatML template (no <|im_start|> and <|im_end|>)");
  }
  const auto segments = Lex(jinja_text);
  if (!segments.has_value()) return NotSupported("it has an unterminated tag");
  const auto items = ToItems(*segments);
  if (!items.has_value()) return NotSupported("it has an expression this reader cannot parse");
  ChatMlMatcher matcher(*items);
  auto system = matcher.Match();
  if (!system.ok()) return system.status();
  return ChatTemplate(*std::move(system));
}

ChatTemplate ChatTemplate::ChatMl(std::string default_system_prompt) {
  return ChatTemplate(std::move(default_system_prompt));
}

std::string ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && !default_system_prompt_.empty() && messages[0].role != "system") {
      absl::StrAppend(&out, kImStart, "system\n", default_system_prompt_, kImEnd, "\n");
    }
    absl::StrAppend(&out, kImStart, messages[i].role, "\n", messages[i].content, kImEnd, "\n");
  }
  if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
  return out;
}

}  // namespace sluice::model
