// sluice generate: runs the bundled model (or --model) on this machine's CPU and streams the
// continuation of a prompt to stdout; with --json prints one JSON object instead.
//
//   ./sluice generate --chat --prompt "What is the capital of France?"
//   ./sluice generate --prompt "def fib(n):" --max-tokens 64 --temperature 0 --json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/registry.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, prompt, "", "Prompt text (raw, without added special tokens).");
ABSL_FLAG(bool, chat, false, "Wrap the prompt as a user message in the model's chat template.");
ABSL_FLAG(int, max_tokens, 128, "Most tokens to generate.");
ABSL_FLAG(double, temperature, 0.8, "Sampling temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 0.95, "Nucleus sampling: keep the smallest set with this mass.");
ABSL_FLAG(int, top_k, 40, "Keep the k most likely tokens; 0 = all.");
ABSL_FLAG(double, min_p, 0.05, "Drop tokens below min_p times the best token's probability.");
ABSL_FLAG(double, repetition_penalty, 1.0, "Penalty for tokens already present; 1 = off.");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed; -1 = random.");
ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of streaming text.");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");
ABSL_FLAG(std::string, backend, "auto",
          "auto (CUDA where a GPU is usable, else CPU), cpu, cuda or ref.");
ABSL_FLAG(std::string, preset, "fp16",
          "KV cache compression preset: fp16, int8, kivi4, kivi2 or kvcomp.");

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Run() {
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  model::SamplingParams sp;
  sp.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sp.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sp.top_k = absl::GetFlag(FLAGS_top_k);
  sp.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  sp.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  sp.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  sp.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  SLUICE_RETURN_IF_ERROR(sp.Validate());
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty()) return absl::InvalidArgumentError("--prompt is required");

  SLUICE_ASSIGN_OR_RETURN(auto gguf, model::GgufFile::Open(path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*gguf));
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::Create(std::move(vocab)));
  SLUICE_ASSIGN_OR_RETURN(auto backend, kernels::CreateNamedBackend(absl::GetFlag(FLAGS_backend),
                                                                    absl::GetFlag(FLAGS_threads)));
  std::fprintf(stderr, "backend: %s\n", backend->name().c_str());
  SLUICE_ASSIGN_OR_RETURN(auto llama, model::LlamaModel::Load(*gguf, *backend));
  const model::LlamaConfig& config = llama->config();

  std::vector<int32_t> prompt_ids;
  if (absl::GetFlag(FLAGS_chat)) {
    SLUICE_ASSIGN_OR_RETURN(std::string jinja, gguf->GetString("tokenizer.chat_template"));
    SLUICE_ASSIGN_OR_RETURN(model::ChatTemplate tmpl, model::ChatTemplate::FromGgufTemplate(jinja));
    const std::vector<model::ChatMessage> messages = {{"user", prompt}};
    SLUICE_ASSIGN_OR_RETURN(prompt_ids, tokenizer->Encode(tmpl.Render(messages, true), true));
  } else {
    SLUICE_ASSIGN_OR_RETURN(prompt_ids, tokenizer->Encode(prompt, false));
  }
  if (prompt_ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  const int64_t room = static_cast<int64_t>(prompt_ids.size()) + sp.max_tokens;
  if (room > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt (%d tokens) + max tokens (%d) exceed the model's context of %d",
                        prompt_ids.size(), sp.max_tokens, config.context_length));
  }
  sp.stop_tokens = {tokenizer->eos_id()};
  if (tokenizer->unk_id() >= 0 && tokenizer->IsSpecial(tokenizer->unk_id())) {
    sp.stop_tokens.push_back(tokenizer->unk_id());  // <|endoftext|> ends documents
  }

  SLUICE_ASSIGN_OR_RETURN(
      kvstore::KvPreset preset,
      kvstore::FindKvPreset(absl::GetFlag(FLAGS_preset), static_cast<int32_t>(config.head_dim)));
  SLUICE_ASSIGN_OR_RETURN(int64_t pages,
                          kvstore::PagesForSequence(preset, config.layers, config.kv_heads, room));
  SLUICE_ASSIGN_OR_RETURN(auto cache_owner,
                          kvstore::PagedKvCache::Create({.layers = config.layers,
                                                         .heads = config.heads,
                                                         .kv_heads = config.kv_heads,
                                                         .head_dim = config.head_dim,
                                                         .preset = preset,
                                                         .pages = pages},
                                                        *backend));
  kvstore::PagedKvCache& cache = *cache_owner;
  SLUICE_RETURN_IF_ERROR(cache.AddSequence(0, room));
  model::Sampler sampler(sp);
  model::StopChecker stop(sp);
  model::StreamDecoder stream(*tokenizer);
  std::vector<float> logits(config.vocab);
  std::vector<int32_t> history = prompt_ids, generated;
  std::string text;
  const bool json = absl::GetFlag(FLAGS_json);

  const auto t0 = Clock::now();
  SLUICE_RETURN_IF_ERROR(llama->Forward({{0, prompt_ids}}, cache, logits.data()));
  const auto t1 = Clock::now();
  auto t_decode_end = t1;
  while (static_cast<int>(generated.size()) < sp.max_tokens) {
    const int32_t token = sampler.Sample(logits, history);
    generated.push_back(token);
    history.push_back(token);
    size_t end = 0;
    const std::string piece =
        std::find(sp.stop_tokens.begin(), sp.stop_tokens.end(), token) == sp.stop_tokens.end()
            ? stream.Push(token)
            : "";
    text += piece;
    if (!json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (stop.Check(token, static_cast<int>(generated.size()), text, &end) !=
        model::StopChecker::Reason::kNone) {
      break;
    }
    const int32_t next[1] = {token};
    SLUICE_RETURN_IF_ERROR(llama->Forward({{0, next}}, cache, logits.data()));
    t_decode_end = Clock::now();
  }
  const std::string tail = stream.Flush();
  text += tail;
  const kvstore::KvCacheStats kv = cache.Stats();
  SLUICE_RETURN_IF_ERROR(cache.RemoveSequence(0));

  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t_decode_end - t1).count();
  const double decode_steps = generated.empty() ? 0 : static_cast<double>(generated.size() - 1);
  const double prefill_tps = prompt_ids.size() / prefill_s;
  const double decode_tps = decode_s > 0 ? decode_steps / decode_s : 0;
  if (json) {
    nlohmann::ordered_json out = {
        {"text", text},
        {"tokens", generated},
        {"prompt_tokens", prompt_ids},
        {"timings", {{"prefill_tokens_per_s", prefill_tps}, {"decode_tokens_per_s", decode_tps}}},
        {"kv",
         {{"preset", preset.name},
          {"pages", kv.pages.pages()},
          {"page_bytes", kv.pages.bytes()},
          {"residual_tokens", kv.residual_tokens},
          {"ratio_vs_fp16", kv.ratio_vs_fp16()}}}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fprintf(stdout, "\n");
    std::fflush(stdout);
    // Short runs stay in the fp32 window (bigger than fp16); say which way the ratio goes.
    const double ratio = kv.ratio_vs_fp16();
    const std::string size =
        ratio >= 1 ? absl::StrFormat("%.2fx smaller than fp16", ratio)
                   : absl::StrFormat("%.2fx the size of fp16", ratio > 0 ? 1 / ratio : 0.0);
    std::fprintf(stderr,
                 "[%zu prompt tokens, %.1f tokens/s; %zu generated, %.1f tokens/s; KV %s: %lld "
                 "pages + %lld full-precision tokens per layer and head, %s]\n",
                 prompt_ids.size(), prefill_tps, generated.size(), decode_tps, preset.name.c_str(),
                 static_cast<long long>(kv.pages.pages()),
                 static_cast<long long>(kv.residual_tokens / (config.layers * config.kv_heads)),
                 size.c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  // Accept --max-tokens as well as --max_tokens (flag names use underscores).
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t c = 2; c < end; ++c) {
      if (a[c] == '-') a[c] = '_';
    }
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  absl::SetProgramUsageMessage("generate text: ./sluice generate --prompt TEXT [--chat] ...");
  absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  const absl::Status st = sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "sluice generate: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
