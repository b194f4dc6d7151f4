// Prefill and decode throughput of the model runtime on a backend (the CPU unless --backend
// says otherwise; a GPU machine runs it with --backend=cuda --random_model=smollm2, the
// model's shapes with random weights made in memory): for each batch size B and
// prompt length P, B sequences of P synthetic tokens are prefilled in one batched forward, then
// decoded greedily for D steps with all B sequences in every step. Prints a table on stderr and
// one JSON object on stdout (bench/model_bench.py compares it with llama.cpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/int_list.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/registry.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "kvstore/wire/wire_encoding_kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/test_util/tiny_llama.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "GGUF model path.");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu, cuda, ref or auto (CUDA where a GPU is usable, else CPU). The default is the CPU: "
          "the llama.cpp peer of ./sluice bench model runs there.");
ABSL_FLAG(std::string, random_model, "",
          "Instead of --model: random weights at a model's shapes, made in memory; smollm2 "
          "(SmolLM2-135M's: 30 layers, hidden 576, 9 heads, 3 kv-heads, Q4_1 weights).");
ABSL_FLAG(std::string, batches, "1,4,16", "Batch sizes.");
ABSL_FLAG(std::string, prompt_lengths, "128,1024", "Prompt lengths in tokens.");
ABSL_FLAG(int, decode_tokens, 32, "Decode steps per case.");
ABSL_FLAG(std::string, preset, "fp16", "KV cache preset (llama.cpp keeps fp16 KV).");
ABSL_FLAG(std::string, wire_bits, "",
          "Also prefill each case with its KV transform-coded for the wire at these bits per "
          "key/value value (\"1.5/3\"), alternating with the plain prefill: the codec's cost.");
ABSL_FLAG(std::string, kv_calibration, "",
          "--wire_bits: the calibration file (default: beside --model, ./sluice calibrate).");
ABSL_FLAG(int, repeats, 2, "Runs per case; the fastest is reported (this machine is noisy).");
ABSL_FLAG(bool, record_steps, true,
          "Record a step's dense ops once per row count and replay them (CUDA graphs; "
          "LlamaLoadOptions::record_steps); off, every op is launched one by one.");

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

// The synthetic prompt shared with the llama.cpp side: skips the 17 special tokens.
int32_t PromptToken(int64_t seq, int64_t i, int64_t vocab) {
  return static_cast<int32_t>(17 + (i * 7919 + seq * 104729) % (vocab - 17));
}

absl::Status Run() {
  SLUICE_ASSIGN_OR_RETURN(std::vector<int> batches,
                          bench::ParseIntList(absl::GetFlag(FLAGS_batches)));
  SLUICE_ASSIGN_OR_RETURN(std::vector<int> prompts,
                          bench::ParseIntList(absl::GetFlag(FLAGS_prompt_lengths)));
  const int decode = absl::GetFlag(FLAGS_decode_tokens);
  std::unique_ptr<model::GgufFile> gguf;
  const std::string random_model = absl::GetFlag(FLAGS_random_model);
  if (random_model.empty()) {
    SLUICE_ASSIGN_OR_RETURN(gguf, model::GgufFile::Open(absl::GetFlag(FLAGS_model)));
  } else if (random_model == "smollm2") {
    const model::testing::TinyLlamaSpec smollm2 = {.layers = 30,
                                                   .hidden = 576,
                                                   .ffn = 1536,
                                                   .heads = 9,
                                                   .kv_heads = 3,
                                                   .vocab = 49152,
                                                   .rope_theta = 100000.f};
    SLUICE_ASSIGN_OR_RETURN(
        gguf, model::GgufFile::FromBytes(model::testing::BuildTinyLlamaGguf(smollm2, /*seed=*/1)));
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("--random_model=%s: the only one is smollm2", random_model));
  }
  SLUICE_ASSIGN_OR_RETURN(auto backend, kernels::CreateNamedBackend(absl::GetFlag(FLAGS_backend),
                                                                    absl::GetFlag(FLAGS_threads)));
  SLUICE_ASSIGN_OR_RETURN(
      auto llama, model::LlamaModel::Load(*gguf, *backend,
                                          {.record_steps = absl::GetFlag(FLAGS_record_steps)}));
  const model::LlamaConfig& c = llama->config();

  SLUICE_ASSIGN_OR_RETURN(
      kvstore::KvPreset preset,
      kvstore::FindKvPreset(absl::GetFlag(FLAGS_preset), static_cast<int32_t>(c.head_dim)));
  // A cache with room for `seqs` sequences of `tokens` tokens.
  auto make_cache = [&](int64_t seqs,
                        int64_t tokens) -> absl::StatusOr<std::unique_ptr<kvstore::PagedKvCache>> {
    SLUICE_ASSIGN_OR_RETURN(int64_t pages,
                            kvstore::PagesForSequence(preset, c.layers, c.kv_heads, tokens));
    return kvstore::PagedKvCache::Create({.layers = c.layers,
                                          .heads = c.heads,
                                          .kv_heads = c.kv_heads,
                                          .head_dim = c.head_dim,
                                          .preset = preset,
                                          .pages = pages * seqs},
                                         *backend);
  };
  // The transform-coded wire, when asked: the codec a prefill worker runs on its prompts.
  std::optional<kvstore::KvTransformCalibration> calibration;
  kvstore::KvWireBits wire_bits;
  uint32_t calibration_checksum = 0;
  if (!absl::GetFlag(FLAGS_wire_bits).empty()) {
    SLUICE_ASSIGN_OR_RETURN(wire_bits, kvstore::ParseKvWireBits(absl::GetFlag(FLAGS_wire_bits)));
    const std::string file = absl::GetFlag(FLAGS_kv_calibration).empty()
                                 ? model::KvCalibrationPath(absl::GetFlag(FLAGS_model))
                                 : absl::GetFlag(FLAGS_kv_calibration);
    SLUICE_ASSIGN_OR_RETURN(calibration, kvstore::ReadKvTransformCalibration(file));
    calibration_checksum = kvstore::KvTransformCalibrationChecksum(*calibration);
  }
  // One prefill of `batch` with every sequence coded for the wire: seconds, and the streams'
  // bytes.
  auto wire_prefill = [&](kvstore::PagedKvCache& cache, std::vector<model::ForwardEntry>& batch,
                          std::vector<float>& logits, int64_t* bytes) -> absl::StatusOr<double> {
    kvstore::WireEncodingKvCache wire(&cache, kvstore::WireEncodingKvCache::Pass::kComputed);
    const auto t0 = Clock::now();
    for (const model::ForwardEntry& e : batch) {
      const int64_t n = static_cast<int64_t>(e.tokens.size());
      SLUICE_RETURN_IF_ERROR(
          wire.StartEncoding(e.seq, {.calibration = &*calibration,
                                     .calibration_checksum = calibration_checksum,
                                     .model = c,
                                     .key_bits = wire_bits.key,
                                     .value_bits = wire_bits.value,
                                     .shape = {.tokens = n, .tail = cache.WindowAfterPrompt(n)}}));
    }
    SLUICE_RETURN_IF_ERROR(llama->Forward(batch, wire, logits.data()));
    for (const model::ForwardEntry& e : batch) {
      SLUICE_ASSIGN_OR_RETURN(const std::string stream, wire.FinishEncoding(e.seq));
      *bytes += static_cast<int64_t>(stream.size());
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  nlohmann::json cases = nlohmann::json::array();
  const auto* cpu = dynamic_cast<const kernels::CpuBackend*>(backend.get());
  std::fprintf(stderr, "sluice (%s)\n%6s %7s %14s %14s\n", backend->name().c_str(), "batch",
               "prompt", "prefill tok/s", "decode tok/s");
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  {
    // Warm-up: page the weights in and start the thread team, as the peer's warm-up does; on a
    // GPU, load the kernels of both matmul paths (a prompt longer than the skinny kernel's 16
    // rows goes to cuBLAS, whose first call loads its modules; a decode step's single row does
    // not), so that neither lands in the first case's timings.
    constexpr int kWarmupTokens = 32;
    SLUICE_ASSIGN_OR_RETURN(auto cache_owner, make_cache(1, kWarmupTokens + 1));
    kvstore::PagedKvCache& cache = *cache_owner;
    SLUICE_RETURN_IF_ERROR(cache.AddSequence(0, kWarmupTokens + 1));
    std::vector<int32_t> tokens;
    for (int i = 0; i < kWarmupTokens; ++i) tokens.push_back(PromptToken(0, i, c.vocab));
    std::vector<float> logits(c.vocab);
    SLUICE_RETURN_IF_ERROR(llama->Forward({{0, tokens}}, cache, logits.data()));
    tokens.resize(1);
    SLUICE_RETURN_IF_ERROR(llama->Forward({{0, tokens}}, cache, logits.data()));
  }
  for (int p : prompts) {
    for (int b : batches) {
      double prefill = 0, dec = 0, prefill_wire = 0;
      int64_t wire_bytes = 0;
      std::vector<double> step_ms;  // each decode step of the fastest run, in milliseconds
      for (int rep = 0; rep < repeats; ++rep) {
        SLUICE_ASSIGN_OR_RETURN(auto cache_owner, make_cache(b, p + decode + 1));
        kvstore::PagedKvCache& cache = *cache_owner;
        std::vector<std::vector<int32_t>> tokens(b);
        std::vector<model::ForwardEntry> batch;
        for (int s = 0; s < b; ++s) {
          SLUICE_RETURN_IF_ERROR(cache.AddSequence(s, p + decode + 1));
          for (int i = 0; i < p; ++i) tokens[s].push_back(PromptToken(s, i, c.vocab));
          batch.push_back({s, tokens[s]});
        }
        std::vector<float> logits(b * c.vocab);
        const auto t0 = Clock::now();
        SLUICE_RETURN_IF_ERROR(llama->Forward(batch, cache, logits.data()));
        const auto t1 = Clock::now();
        std::vector<int32_t> next(b);
        std::vector<double> steps;
        for (int step = 0; step < decode; ++step) {
          const auto s0 = Clock::now();
          for (int s = 0; s < b; ++s) {
            const float* row = logits.data() + s * c.vocab;
            next[s] = static_cast<int32_t>(std::max_element(row, row + c.vocab) - row);
            batch[s].tokens = absl::MakeConstSpan(&next[s], 1);
          }
          SLUICE_RETURN_IF_ERROR(llama->Forward(batch, cache, logits.data()));
          steps.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
        }
        const auto t2 = Clock::now();
        prefill = std::max(prefill, double(b) * p / std::chrono::duration<double>(t1 - t0).count());
        if (calibration) {
          // The same prompts again, coded as they are written, right after the plain run.
          SLUICE_ASSIGN_OR_RETURN(auto wire_owner, make_cache(b, p + 1));
          for (int s = 0; s < b; ++s) {
            SLUICE_RETURN_IF_ERROR(wire_owner->AddSequence(s, p + 1));
            batch[s].tokens = tokens[s];
          }
          wire_bytes = 0;
          SLUICE_ASSIGN_OR_RETURN(const double seconds,
                                  wire_prefill(*wire_owner, batch, logits, &wire_bytes));
          prefill_wire = std::max(prefill_wire, double(b) * p / seconds);
        }
        const double rate = double(b) * decode / std::chrono::duration<double>(t2 - t1).count();
        if (rate > dec) step_ms = std::move(steps);
        dec = std::max(dec, rate);
      }
      // Inter-token latency: the median and slowest steps (a step that moves the window's
      // tokens to pages costs more than one that only attends).
      nlohmann::json steps = nlohmann::json::object();
      if (!step_ms.empty()) {
        std::vector<double> sorted = step_ms;
        std::sort(sorted.begin(), sorted.end());
        steps = {{"p50", sorted[sorted.size() / 2]},
                 {"p90", sorted[sorted.size() * 9 / 10]},
                 {"max", sorted.back()},
                 {"max_at", std::max_element(step_ms.begin(), step_ms.end()) - step_ms.begin()}};
      }
      std::fprintf(stderr, "%6d %7d %14.1f %14.1f", b, p, prefill, dec);
      if (calibration) {
        std::fprintf(stderr,
                     "   coded for the wire: %.1f prefill tok/s (%+.1f%%), %.2fx fewer bytes",
                     prefill_wire, 100.0 * (prefill_wire / prefill - 1),
                     double(b) * p * c.layers * c.kv_heads * c.head_dim * 4 / wire_bytes);
      }
      std::fprintf(stderr, "\n");
      cases.push_back({{"batch", b},
                       {"prompt", p},
                       {"decode_steps", decode},
                       {"repeats", repeats},
                       {"prefill_tokens_per_s", prefill},
                       {"decode_tokens_per_s", dec},
                       {"decode_step_ms", steps}});
      if (calibration) {
        cases.back()["wire"] = {
            {"bits", absl::GetFlag(FLAGS_wire_bits)},
            {"prefill_tokens_per_s", prefill_wire},
            {"bytes", wire_bytes},
            {"fp16_bytes", int64_t{b} * p * c.layers * c.kv_heads * c.head_dim * 4}};
      }
    }
  }
  nlohmann::json out = {
      {"system", "sluice"},
      {"backend", backend->name()},
      {"threads", cpu != nullptr ? cpu->threads() : 0},
      {"model", random_model.empty() ? absl::GetFlag(FLAGS_model) : "random " + random_model},
      {"recorded_steps", backend->CanRecord() && absl::GetFlag(FLAGS_record_steps)},
      {"cases", cases}};
  std::cout << out.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "model_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
