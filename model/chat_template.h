// Chat templates: turning a conversation into the prompt text a model was trained on.
//
// There is no Jinja engine here. FromGgufTemplate recognises the ChatML family
// (`<|im_start|>role\ncontent<|im_end|>\n`, as in SmolLM2, Qwen2 and Hermes) by the
// structure of the template's tags, including an optional default system prompt inserted
// when the conversation does not start with one; anything else is UnimplementedError.
//
//   SLUICE_ASSIGN_OR_RETURN(std::string jinja, gguf->GetString("tokenizer.chat_template"));
//   SLUICE_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::FromGgufTemplate(jinja));
//   std::string prompt = chat.Render(messages, /*add_generation_prompt=*/true);
//   // then tokenizer->Encode(prompt, /*parse_special=*/true)
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Recognises `jinja_text` (tokenizer.chat_template). UnimplementedError saying the
  // template is not supported, with the first tag that did not fit, when it is not ChatML.
  static absl::StatusOr<ChatTemplate> FromGgufTemplate(std::string_view jinja_text);

  // ChatML for models without a template. A non-empty `default_system_prompt` becomes a
  // system message when the conversation does not start with one.
  static ChatTemplate ChatMl(std::string default_system_prompt = "");

  // The prompt text, with the assistant's header appended when `add_generation_prompt`.
  // Contents are inserted verbatim: special-token text inside them is not escaped.
  std::string Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;

  const std::string& default_system_prompt() const { return default_system_prompt_; }

 private:
  explicit ChatTemplate(std::string default_system_prompt)
      : default_system_prompt_(std::move(default_system_prompt)) {}

  std::string default_system_prompt_;  // empty: none
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_H_
