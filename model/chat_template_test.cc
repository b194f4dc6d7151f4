#include "model/chat_template.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/model_path.h"
#include "model/test_util/goldens.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

// SmolLM2-135M-Instruct's tokenizer.chat_template, byte for byte.
constexpr char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";
constexpr char kSmolLm2System[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

const std::vector<ChatMessage> kConversation = {
    {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

// Expected renderings below were produced by jinja2 with Hugging Face's settings
// (trim_blocks=True, lstrip_blocks=True).
constexpr char kConversationChatMl[] =
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";

TEST(ChatTemplate, SmolLm2InsertsItsDefaultSystemPrompt) {
  const auto chat = ChatTemplate::FromGgufTemplate(kSmolLm2Template);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->default_system_prompt(), kSmolLm2System);
  EXPECT_EQ(
      chat->Render(kConversation, /*add_generation_prompt=*/true),
      std::string("<|im_start|>system\n") + kSmolLm2System + "<|im_end|>\n" + kConversationChatMl);
  // Not when the conversation brings its own system message.
  EXPECT_EQ(chat->Render({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // Nothing to insert before when there are no messages.
  EXPECT_EQ(chat->Render({}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(chat->Render({}, false), "");
}

TEST(ChatTemplate, RecognisesChatMlWrittenOtherWays) {
  // Hugging Face's default ChatML template.
  const char* plain =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\\n' }}{% endif %}";
  // Multi-line with whitespace control, attribute access and double quotes.
  const char* multi_line = R"({%- for message in messages %}
    {%- if loop.first and messages[0].role != "system" %}
        {{- "<|im_start|>system\nYou are helpful.<|im_end|>\n" }}
    {%- endif %}
    {{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>" + "\n" }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|im_start|>assistant\n" }}
{%- endif %}
)";
  // Literal text between tags, with trim_blocks eating the newline after each block tag.
  const char* textual =
      "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
      "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
      "<|im_start|>assistant\n{% endif %}";
  // The system check before the loop (Qwen2 style), output split over several tags.
  const char* prelude =
      "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe kind.<|im_end|>\\n' "
      "}}{% endif %}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' "
      "}}{{ message['content'] }}{{ '<|im_end|>\\n' }}{% endfor %}{# comment #}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  struct Case {
    const char* jinja;
    std::string system;
  };
  for (const Case& c : {Case{plain, ""}, Case{multi_line, "You are helpful."}, Case{textual, ""},
                        Case{prelude, "Be kind."}}) {
    const auto chat = ChatTemplate::FromGgufTemplate(c.jinja);
    ASSERT_TRUE(chat.ok()) << chat.status() << "\n" << c.jinja;
    EXPECT_EQ(chat->default_system_prompt(), c.system);
    const std::string system =
        c.system.empty() ? "" : "<|im_start|>system\n" + c.system + "<|im_end|>\n";
    EXPECT_EQ(chat->Render(kConversation, true), system + kConversationChatMl) << c.jinja;
  }
}

TEST(ChatTemplate, RejectsWhatItCannotRenderExactly) {
  const char* llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
      "message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}";
  // ChatML-like, but jinja2 renders an extra newline after each message.
  const char* extra_newline =
      "{% for message in messages %}\n{{'<|im_start|>' + message['role'] + '\\n'}}"
      "{{ message['content'] }}{{ '<|im_end|>\\n' }}\n{% endfor %}";
  // ChatML with a filter on the content.
  const char* trimmed =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] | trim + '<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt "
      "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const char* unterminated = "<|im_start|><|im_end|>{% for message in messages ";
  for (const char* jinja : {llama3, extra_newline, trimmed, unterminated, ""}) {
    const auto chat = ChatTemplate::FromGgufTemplate(jinja);
    EXPECT_EQ(chat.status().code(), absl::StatusCode::kUnimplemented) << jinja;
    EXPECT_NE(chat.status().message().find("chat template is not supported"),
              std::string_view::npos)
        << chat.status();
  }
  // The message points at where the template departs from ChatML.
  const auto chat = ChatTemplate::FromGgufTemplate(trimmed);
  EXPECT_NE(chat.status().message().find("| trim"), std::string_view::npos) << chat.status();
}

TEST(ChatTemplate, ChatMlWithoutTemplate) {
  EXPECT_EQ(ChatTemplate::ChatMl().Render(kConversation, true), kConversationChatMl);
  EXPECT_EQ(ChatTemplate::ChatMl("Sys").Render({{"user", "x"}}, false),
            "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
}

// ---- the real model ---------------------------------------------------------------------

class SmolLm2Chat : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = DefaultModelPath();
    if (!std::filesystem::exists(path)) {
      GTEST_SKIP() << "model file " << path << " is absent (set SLUICE_MODEL or run ./sluice test)";
    }
    auto gguf = GgufFile::Open(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto jinja = (*gguf)->GetString("tokenizer.chat_template");
    ASSERT_TRUE(jinja.ok()) << jinja.status();
    auto chat = ChatTemplate::FromGgufTemplate(*jinja);
    ASSERT_TRUE(chat.ok()) << chat.status();
    chat_ = std::make_unique<ChatTemplate>(*std::move(chat));
    auto spec = VocabFromGguf(**gguf);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto tokenizer = Tokenizer::Create(*std::move(spec));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  std::unique_ptr<ChatTemplate> chat_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SmolLm2Chat, TemplateFromTheModelFile) {
  EXPECT_EQ(chat_->default_system_prompt(), kSmolLm2System);
  const std::string prompt = chat_->Render({{"user", "Hi"}}, true);
  const auto ids = tokenizer_->Encode(prompt, /*parse_special=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // <|im_start|> system \n ... <|im_end|> \n <|im_start|> user \n Hi <|im_end|> \n <|im_start|>
  // assistant \n
  EXPECT_EQ(ids->front(), tokenizer_->bos_id());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tokenizer_->bos_id()), 3);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tokenizer_->eos_id()), 2);
  EXPECT_EQ(tokenizer_->Decode(*ids), prompt);
}

// The chat prompts of the model goldens: rendered by transformers' apply_chat_template
// (add_generation_prompt=True) and tokenized with add_special_tokens=False.
TEST_F(SmolLm2Chat, MatchesHuggingFaceChatGoldens) {
  const std::string path = testing::GoldenPath("model_goldens.json");
  ASSERT_TRUE(std::filesystem::exists(path)) << "no golden file at " << path;
  std::ifstream in(path);
  const nlohmann::json goldens = nlohmann::json::parse(in);
  int chats = 0;
  for (const nlohmann::json& p : goldens.at("prompts")) {
    if (!p.contains("chat_messages")) continue;
    ++chats;
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : p["chat_messages"]) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    const std::string prompt = chat_->Render(messages, /*add_generation_prompt=*/true);
    EXPECT_EQ(prompt, p.at("text").get<std::string>()) << p.at("name");
    const auto ids = tokenizer_->Encode(prompt, /*parse_special=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, p.at("prompt_tokens").get<std::vector<int32_t>>()) << p.at("name");
  }
  EXPECT_GE(chats, 2);
}

}  // namespace
}  // namespace sluice::model
