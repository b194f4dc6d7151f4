// Writes the seed corpus of openai_request_fuzz into the directory named by argv[1]: request
// bodies that use every field ParseRequest reads, for both endpoints, each file the endpoint
// byte (0: completions, 1: chat) and the body.
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::vector<std::pair<char, std::string>> seeds = {
      {0, R"({"prompt": "Hello", "max_tokens": 16})"},
      {0, R"({"model": "m", "prompt": [1, 2, 3], "temperature": 0, "seed": -1})"},
      {0, R"({"prompt": [[5, 6]], "stream": true, "stream_options": {"include_usage": true}})"},
      {0, R"({"prompt": ["a \u00e9 \ud83d\ude00"], "logprobs": 5, "echo": false, "suffix": ""})"},
      {0, R"({"prompt": "x", "stop": ["\n", "END", "\ufffd", "ab"], "stop_token_ids": [2],
              "top_k": -1, "top_p": 0.5, "min_p": 0.1, "repetition_penalty": 1.3,
              "ignore_eos": true, "n": 1, "best_of": 1, "presence_penalty": 0,
              "frequency_penalty": 0.0, "logit_bias": {}, "user": "u", "min_tokens": 0,
              "skip_special_tokens": false, "include_stop_str_in_output": false,
              "kv_compression": "leankv-k8v4:alpha_high=2:alpha_low=0.05"})"},
      {0, R"({"prompt": "y", "kv_compression": "kivi4:residual=64", "seed": 18446744073709551615,
              "max_tokens": 2147483647, "use_beam_search": false, "length_penalty": 1,
              "priority": 0, "store": false, "metadata": {}, "service_tier": "auto"})"},
      {1, R"({"messages": [{"role": "user", "content": "Hi"}]})"},
      {1, R"({"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "a"},
                                           {"type": "text", "text": "b"}]},
              {"role": "assistant"}, {"role": "user", "content": "<|im_end|>"}],
              "stream": true, "stream_options": {"include_usage": false},
              "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 8,
              "max_tokens": 4, "stop": "\n\n", "tool_choice": "none", "tools": [],
              "parallel_tool_calls": true, "add_generation_prompt": true,
              "continue_final_message": false, "response_format": {"type": "text"}})"},
      {1, R"({"messages": [{"role": "system", "content": ""}], "kv_compression": "kvcomp",
              "temperature": 2, "top_p": 1, "min_p": 0, "seed": 7, "function_call": "auto"})"},
      // Refused ones, so that each error path starts covered.
      {0, R"({"prompt": "x", "n": 17})"},
      {0, R"({"prompt": "x", "n": 2, "best_of": 3})"},
      {0, R"({"prompt": "x", "temperature": 1e400})"},
      {0, R"({"prompt": "x", "top_p": 1e-50, "min_p": 0.99999999999})"},
      {1, R"({"messages": [{"role": "tool", "content": "x"}], "unknown_field": 1})"},
      {1, R"([[[[{"messages": null}]]]])"},
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary);
    out << seeds[i].first << seeds[i].second;
  }
  return 0;
}
