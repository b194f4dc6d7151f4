// kvstore microbenchmarks on this CPU. Prints a table per section on stderr and writes one JSON
// document (bench/results/kvstore-cpu.json through `./sluice bench kvstore`):
//   codecs       quantize and dequantize GB/s per preset; Huffman encode/decode of the codes
//   bits         bits per value of Huffman-coded codes vs fixed width on real SmolLM2 KV
//   attention    decode attention (one query, SmolLM2 shapes, all layers) vs context per preset
//   decode_step  a whole model decode step at long context per preset (the kvstore target)
//   pool         page allocate/free operations per second, batched vs one at a time
//   eviction     internal fragmentation over time under per-step H2O eviction for four ways
//                of managing the evicted slots (SpvLLM Fig. 2)
//   wire         the transform codec (kvstore/wire/kv_transform.h) on real SmolLM2 KV: bytes
//                against fp16, encode and decode MB/s on one core, against the prefill's time
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/int_list.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/huffman.h"
#include "kernels/kv_format.h"
#include "kvstore/cache/kv_codebooks.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/cache/recording_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/page_pool.h"
#include "kvstore/memory/slot_bitmap.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_transform_calibration.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "GGUF model (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, text, "/usr/share/common-licenses/GPL-3",
          "English text whose KV the bits-per-value section measures.");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");
ABSL_FLAG(std::string, contexts, "1024,2048,4096,8192,16384,32768",
          "Contexts of the attention section.");
ABSL_FLAG(int, step_context, 16384, "Context of the decode-step section.");
ABSL_FLAG(int, repeats, 5, "Timed runs per case; the fastest is reported.");
ABSL_FLAG(std::string, presets, "fp16,int8,kivi4,kivi2,kvcomp", "Presets to measure (fp16 first).");
ABSL_FLAG(std::string, sections, "codecs,bits,attention,decode_step,pool,eviction,wire",
          "Sections to run.");

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::HostView;
using kernels::KvPageLayout;
using kernels::KvTierFormat;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best of `repeats` runs of fn, in seconds.
template <class Fn>
absl::StatusOr<double> Best(int repeats, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(fn());
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best;
}

std::vector<std::string> kPresets;

// SmolLM2-135M shapes.
constexpr int kLayers = 30, kHeads = 9, kKvHeads = 3, kHeadDim = 64;

// Roughly Gaussian values (a sum of four uniforms), cheap enough to fill gigabytes of KV.
std::vector<float> Gaussian(std::mt19937_64& rng, size_t n, float sigma) {
  std::vector<float> x(n);
  uint64_t state = rng() | 1;
  const float k = sigma * 1.7320508f / 2147483648.f;  // 4 uniforms in [-2^31, 2^31): var 4/3
  for (float& v : x) {
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      sum += static_cast<float>(static_cast<int32_t>(state >> 32));
    }
    v = sum * k / 2.f;
  }
  return x;
}

// ---- codecs ----

absl::StatusOr<nlohmann::json> Codecs(kernels::Backend& cpu, int repeats) {
  std::fprintf(stderr, "\n== codecs (one kv-head's rows, %d pages per run)\n", 256);
  std::fprintf(stderr, "%-7s %14s %16s %15s %15s\n", "preset", "quantize GB/s", "dequantize GB/s",
               "huff enc Gsym/s", "huff dec Gsym/s");
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937_64 rng(1);
  for (const std::string& name : kPresets) {
    SLUICE_ASSIGN_OR_RETURN(kvstore::KvPreset preset, kvstore::FindKvPreset(name, kHeadDim));
    SLUICE_ASSIGN_OR_RETURN(KvPageLayout l, kernels::ComputePageLayout(preset.high));
    const int pages = 256;
    const int64_t n = l.tokens;
    const std::vector<float> k = Gaussian(rng, n * kHeadDim, 1.f),
                             v = Gaussian(rng, n * kHeadDim, 1.f);
    std::vector<uint8_t> arena(static_cast<size_t>(pages) * preset.high.page_bytes);
    std::vector<float> out(n * kHeadDim * 2);
    // Huffman-coded presets: codebooks from these rows; a page takes the units that fit.
    const bool coded = preset.high.huffman_bits > 0;
    kvstore::KvCodebookPair books;
    if (coded) {
      SLUICE_ASSIGN_OR_RETURN(
          books, kvstore::BuildKvCodebooks(cpu, preset.high, k.data(), v.data(), kHeadDim, n, 1));
    }
    int64_t written = n;
    SLUICE_ASSIGN_OR_RETURN(double tq, Best(repeats, [&]() -> absl::Status {
                              for (int p = 0; p < pages; ++p) {
                                SLUICE_RETURN_IF_ERROR(cpu.KvQuantize(
                                    {.k = HostView(k),
                                     .v = HostView(v),
                                     .stride = kHeadDim,
                                     .tokens = n,
                                     .format = preset.high,
                                     .layout = l,
                                     .page = HostView(arena).subview(p * preset.high.page_bytes),
                                     .codebooks = coded ? books.view() : kernels::KvCodebooks{},
                                     .tokens_written = coded ? &written : nullptr}));
                              }
                              return absl::OkStatus();
                            }));
    SLUICE_ASSIGN_OR_RETURN(double td, Best(repeats, [&]() -> absl::Status {
                              for (int p = 0; p < pages; ++p) {
                                SLUICE_RETURN_IF_ERROR(cpu.KvDequantize(
                                    {.page = HostView(arena).subview(p * preset.high.page_bytes),
                                     .format = preset.high,
                                     .layout = l,
                                     .slot = 0,
                                     .tokens = written,
                                     .k = HostView(out),
                                     .v = HostView(out).subview(n * kHeadDim),
                                     .codebooks = coded ? books.view() : kernels::KvCodebooks{}}));
                              }
                              return absl::OkStatus();
                            }));
    // Coded presets may write fewer tokens than the page's slots: rate by the tokens written.
    const double fp32_in = 2.0 * n * kHeadDim * 4 * pages;
    const double fp32_out = 2.0 * written * kHeadDim * 4 * pages;
    // Huffman over the V codes of the fixed-width int presets (one symbol per code); coded
    // presets include theirs in quantize and dequantize.
    double enc_gbs = 0, dec_gbs = 0;
    if (preset.high.v.codec == kernels::KvCodec::kInt && !coded) {
      const int bits = preset.high.v.bits;
      std::vector<uint8_t> symbols(n * kHeadDim);
      std::vector<uint64_t> hist(1 << bits);
      for (int64_t t = 0; t < n; ++t) {
        for (int c = 0; c < kHeadDim; ++c) {
          const int code =
              kernels::KvCodeAt(preset.high.v, kHeadDim, 1, arena.data() + l.v_codes, t, c);
          symbols[t * kHeadDim + c] = static_cast<uint8_t>(code);
          ++hist[code];
        }
      }
      SLUICE_ASSIGN_OR_RETURN(kernels::HuffmanCodebook cb, kernels::BuildHuffmanCodebook(1, hist));
      std::vector<uint8_t> stream(symbols.size() * 2 + 64);
      std::vector<uint32_t> offsets(n + 1);
      std::vector<uint8_t> decoded(symbols.size());
      SLUICE_ASSIGN_OR_RETURN(double te, Best(repeats, [&]() -> absl::Status {
                                return kernels::EncodeRows(cb, symbols.data(), n, kHeadDim,
                                                           stream.data(), stream.size(),
                                                           offsets.data())
                                    .status();
                              }));
      SLUICE_ASSIGN_OR_RETURN(double tdec, Best(repeats, [&]() -> absl::Status {
                                for (int64_t t = 0; t < n; ++t) {
                                  kernels::DecodeRow(cb, stream.data(), offsets[t], kHeadDim,
                                                     decoded.data() + t * kHeadDim);
                                }
                                return absl::OkStatus();
                              }));
      if (decoded != symbols) return absl::InternalError("Huffman round trip failed");
      enc_gbs = symbols.size() / te / 1e9;
      dec_gbs = symbols.size() / tdec / 1e9;
    }
    std::fprintf(stderr, "%-7s %14.2f %16.2f %15.3f %15.3f\n", name.c_str(), fp32_in / tq / 1e9,
                 fp32_out / td / 1e9, enc_gbs, dec_gbs);
    rows.push_back({{"preset", name},
                    {"quantize_gbps_fp32_in", fp32_in / tq / 1e9},
                    {"dequantize_gbps_fp32_out", fp32_out / td / 1e9},
                    {"tokens_per_page", written},
                    {"huffman_encode_gsymbols_per_s", enc_gbs},
                    {"huffman_decode_gsymbols_per_s", dec_gbs}});
  }
  return rows;
}

// ---- bits per value on real KV ----

// Squared errors and squared values of dequantized K and V.
struct ErrorSums {
  double k_err = 0, k_sq = 0, v_err = 0, v_sq = 0;
};

// The codes of `preset` for `tokens` rows of one kv-head (rows `stride` apart), unpacked, in
// the fixed-width format (the unit format of Huffman-coded presets); adds the round trip's
// errors to *err.
absl::Status CodesOf(kernels::Backend& cpu, const kvstore::KvPreset& preset, const float* k,
                     const float* v, int64_t stride, int64_t tokens, std::vector<uint8_t>* kc,
                     std::vector<uint8_t>* vc, ErrorSums* err) {
  const kernels::KvTierFormat format = kernels::KvUnitFormat(preset.high);
  SLUICE_ASSIGN_OR_RETURN(KvPageLayout l, kernels::ComputePageLayout(format));
  std::vector<uint8_t> page(format.page_bytes);
  std::vector<float> dk(l.tokens * kHeadDim), dv(l.tokens * kHeadDim);
  auto unpack = [&](const kernels::KvQuantSpec& s, int32_t codes, int32_t tile, int64_t n,
                    std::vector<uint8_t>* out) {
    for (int64_t t = 0; t < n; ++t) {
      for (int c = 0; c < kHeadDim; ++c) {
        out->push_back(
            static_cast<uint8_t>(kernels::KvCodeAt(s, kHeadDim, tile, page.data() + codes, t, c)));
      }
    }
  };
  for (int64_t t0 = 0; t0 + l.token_group <= tokens; t0 += l.tokens) {
    const int64_t n = std::min<int64_t>(l.tokens, (tokens - t0) / l.token_group * l.token_group);
    const int64_t span = (n - 1) * stride + kHeadDim;
    SLUICE_RETURN_IF_ERROR(cpu.KvQuantize({.k = HostView(k + t0 * stride, span),
                                           .v = HostView(v + t0 * stride, span),
                                           .stride = stride,
                                           .tokens = n,
                                           .format = format,
                                           .layout = l,
                                           .page = HostView(page)}));
    unpack(format.k, l.k_codes, l.k_tile, n, kc);
    unpack(format.v, l.v_codes, 1, n, vc);
    SLUICE_RETURN_IF_ERROR(cpu.KvDequantize({.page = HostView(page),
                                             .format = format,
                                             .layout = l,
                                             .tokens = n,
                                             .k = HostView(dk),
                                             .v = HostView(dv)}));
    for (int64_t t = 0; t < n; ++t) {
      for (int c = 0; c < kHeadDim; ++c) {
        const double xk = k[(t0 + t) * stride + c], xv = v[(t0 + t) * stride + c];
        err->k_err += (dk[t * kHeadDim + c] - xk) * (dk[t * kHeadDim + c] - xk);
        err->v_err += (dv[t * kHeadDim + c] - xv) * (dv[t * kHeadDim + c] - xv);
        err->k_sq += xk * xk;
        err->v_sq += xv * xv;
      }
    }
  }
  return absl::OkStatus();
}

// kvcomp with other quantization steps: K levels and block channels (1: per channel), V
// levels and channel group.
struct KvcompVariant {
  int k_levels, k_block_channels, v_levels, v_group;
};
constexpr KvcompVariant kKvcompVariants[] = {
    {9, 32, 7, 64}, {17, 32, 7, 64}, {33, 32, 16, 64}, {4, 1, 4, 32},
    {6, 1, 6, 32},  {8, 1, 8, 32},   {12, 1, 12, 32},  {16, 1, 16, 32},
};

// The model and the tokens of --text, for the sections that measure real KV.
struct RealText {
  std::unique_ptr<model::GgufFile> gguf;
  std::unique_ptr<model::LlamaModel> llama;
  std::vector<int32_t> ids;
};

absl::StatusOr<RealText> LoadRealText(kernels::CpuBackend& cpu) {
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  RealText r;
  SLUICE_ASSIGN_OR_RETURN(r.gguf, model::GgufFile::Open(path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*r.gguf));
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::Create(std::move(vocab)));
  SLUICE_ASSIGN_OR_RETURN(r.llama, model::LlamaModel::Load(*r.gguf, cpu));
  std::ifstream in(absl::GetFlag(FLAGS_text));
  if (!in) return absl::NotFoundError("cannot read --text " + absl::GetFlag(FLAGS_text));
  std::stringstream ss;
  ss << in.rdbuf();
  SLUICE_ASSIGN_OR_RETURN(r.ids, tokenizer->Encode(ss.str(), false));
  return r;
}

absl::StatusOr<nlohmann::json> Bits(kernels::CpuBackend& cpu) {
  SLUICE_ASSIGN_OR_RETURN(RealText text, LoadRealText(cpu));
  auto& llama = text.llama;
  std::vector<int32_t>& ids = text.ids;
  const model::LlamaConfig& c = llama->config();
  const int64_t n = std::min<int64_t>(2048, static_cast<int64_t>(ids.size()));
  ids.resize(n);
  SLUICE_ASSIGN_OR_RETURN(const std::unique_ptr<kvstore::RecordingKvCache> recorded,
                          kvstore::RecordFullPrecisionKv(*llama, cpu, ids));
  const kvstore::RecordingKvCache& rec = *recorded;

  std::fprintf(stderr, "\n== Huffman bits per value on SmolLM2 KV (%lld tokens of %s)\n",
               static_cast<long long>(n), absl::GetFlag(FLAGS_text).c_str());
  std::fprintf(stderr, "%-22s %6s %9s %9s %8s %9s %9s\n", "preset", "fixed", "K huffman",
               "V huffman", "saving", "K rel rms", "V rel rms");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<kvstore::KvPreset> presets;
  for (const char* name : {"int8", "kivi4", "kivi2", "kvcomp"}) {
    SLUICE_ASSIGN_OR_RETURN(presets.emplace_back(), kvstore::FindKvPreset(name, c.head_dim));
  }
  for (const KvcompVariant& kv : kKvcompVariants) {
    kvstore::KvPreset p = presets[3];
    p.high.k.levels = kv.k_levels;
    if (kv.k_block_channels > 1) {  // KVComp's 2D blocks of 32 tokens x block_channels
      p.high.k.grouping = kernels::KvGrouping::kBlock;
      p.high.k.block_channels = kv.k_block_channels;
    }
    p.high.v.levels = kv.v_levels;
    p.high.v.group = kv.v_group;
    p.name = absl::StrFormat("kvcomp k%dx%d v%dx%d", kv.k_levels, kv.k_block_channels, kv.v_levels,
                             kv.v_group);
    presets.push_back(p);
  }
  // Codebooks per layer, built from the first half (the "prefill histogram"), measured on
  // the second half.
  for (const kvstore::KvPreset& preset : presets) {
    double kbits = 0, vbits = 0, values = 0;
    ErrorSums err;
    for (int layer = 0; layer < c.layers; ++layer) {
      const int64_t half = n / 2 / 64 * 64;
      std::vector<uint64_t> kh(kernels::KvMaxCode(preset.high.k) + 1),
          vh(kernels::KvMaxCode(preset.high.v) + 1);
      std::vector<uint64_t> kh2(kh.size()), vh2(vh.size());
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        std::vector<uint8_t> kc, vc, kc2, vc2;
        const int64_t stride = c.kv_heads * c.head_dim;
        ErrorSums ignored;
        SLUICE_RETURN_IF_ERROR(CodesOf(cpu, preset, rec.k(layer).data() + h * c.head_dim,
                                       rec.v(layer).data() + h * c.head_dim, stride, half, &kc, &vc,
                                       &ignored));
        SLUICE_RETURN_IF_ERROR(CodesOf(cpu, preset,
                                       rec.k(layer).data() + (half * stride) + h * c.head_dim,
                                       rec.v(layer).data() + (half * stride) + h * c.head_dim,
                                       stride, n - half, &kc2, &vc2, &err));
        for (uint8_t s : kc) ++kh[s];
        for (uint8_t s : vc) ++vh[s];
        for (uint8_t s : kc2) ++kh2[s];
        for (uint8_t s : vc2) ++vh2[s];
      }
      SLUICE_ASSIGN_OR_RETURN(kernels::HuffmanCodebook kcb, kernels::BuildHuffmanCodebook(1, kh));
      SLUICE_ASSIGN_OR_RETURN(kernels::HuffmanCodebook vcb, kernels::BuildHuffmanCodebook(2, vh));
      double count = 0;
      for (uint64_t x : kh2) count += static_cast<double>(x);
      kbits += kernels::MeanCodeLength(kcb, kh2) * count;
      vbits += kernels::MeanCodeLength(vcb, vh2) * count;
      values += count;
    }
    // Fixed width: the bits the levels need.
    const double fixed_k = std::ceil(std::log2(kernels::KvMaxCode(preset.high.k) + 1));
    const double fixed_v = std::ceil(std::log2(kernels::KvMaxCode(preset.high.v) + 1));
    const double kb = kbits / values, vb = vbits / values;
    const double k_rms = std::sqrt(err.k_err / err.k_sq), v_rms = std::sqrt(err.v_err / err.v_sq);
    std::fprintf(stderr, "%-22s %6.1f %9.3f %9.3f %7.1f%% %9.4f %9.4f\n", preset.name.c_str(),
                 (fixed_k + fixed_v) / 2, kb, vb, 100.0 * (1 - (kb + vb) / (fixed_k + fixed_v)),
                 k_rms, v_rms);
    rows.push_back({{"preset", preset.name},
                    {"fixed_bits_k", fixed_k},
                    {"fixed_bits_v", fixed_v},
                    {"k_huffman_bits", kb},
                    {"v_huffman_bits", vb},
                    {"k_rel_rms", k_rms},
                    {"v_rel_rms", v_rms},
                    {"tokens", n},
                    {"text", absl::GetFlag(FLAGS_text)}});
  }
  return rows;
}

// ---- the transform-coded wire ----

// Bases fitted on the first 2048 tokens of --text; the next 2048 tokens are one prompt whose
// KV (keys without RoPE) every layer codes as one block per side, on one thread, at each budget
// (key bits / value bits). The prefill of that prompt is timed in the same run, so the codec's
// share of a prefill is encode time over prefill time (a prefill worker that codes each layer
// while the next computes hides it instead).
absl::StatusOr<nlohmann::json> Wire(kernels::CpuBackend& cpu, int repeats) {
  SLUICE_ASSIGN_OR_RETURN(RealText text, LoadRealText(cpu));
  auto& llama = text.llama;
  const std::vector<int32_t>& ids = text.ids;
  const model::GgufFile* gguf = text.gguf.get();
  const model::LlamaConfig& c = llama->config();
  constexpr int64_t kHalf = 2048;
  if (static_cast<int64_t>(ids.size()) < 2 * kHalf) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the wire section needs %d tokens of --text; it has %d", 2 * kHalf, ids.size()));
  }
  SLUICE_ASSIGN_OR_RETURN(
      const kvstore::KvTransformCalibration calibration,
      kvstore::CalibrateKvTransform(*llama, cpu, *gguf,
                                    std::vector<int32_t>(ids.begin(), ids.begin() + kHalf)));
  const std::vector<int32_t> prompt(ids.begin() + kHalf, ids.begin() + 2 * kHalf);
  // The prompt's prefill, timed (best of repeats), the last run recorded.
  std::unique_ptr<kvstore::RecordingKvCache> rec;
  SLUICE_ASSIGN_OR_RETURN(const double prefill_s, Best(repeats, [&]() -> absl::Status {
                            SLUICE_ASSIGN_OR_RETURN(
                                rec, kvstore::RecordFullPrecisionKv(*llama, cpu, prompt));
                            return absl::OkStatus();
                          }));
  std::vector<std::vector<float>> keys(c.layers);
  for (int layer = 0; layer < c.layers; ++layer) {
    keys[layer] = rec->k(layer);
    kvstore::RotateKeyRows(c, keys[layer].data(), kHalf, 0, /*inverse=*/true);
  }
  const double fp16_bytes = 2.0 * c.layers * kHalf * c.kv_heads * c.head_dim * 2;
  std::fprintf(stderr,
               "\n== transform-coded wire on SmolLM2 KV (%lld-token prompt of %s, bases from the "
               "%lld tokens before it; prefill %.3f s on %d threads)\n",
               static_cast<long long>(kHalf), absl::GetFlag(FLAGS_text).c_str(),
               static_cast<long long>(kHalf), prefill_s, cpu.threads());
  std::fprintf(stderr, "%-8s %9s %8s %11s %11s %10s %12s %12s\n", "bits k/v", "wire MB", "ratio",
               "enc MB/s", "dec MB/s", "enc/prefill", "dec ms", "1 GB/s ms");
  nlohmann::json rows = nlohmann::json::array();
  const int32_t dim = static_cast<int32_t>(c.kv_heads * c.head_dim);
  for (const auto& [kb, vb] : std::vector<std::pair<double, double>>{{1, 3}, {2, 4}, {3, 5}}) {
    std::vector<std::string> blocks(2 * c.layers);
    SLUICE_ASSIGN_OR_RETURN(
        const double enc_s, Best(repeats, [&]() -> absl::Status {
          for (int layer = 0; layer < c.layers; ++layer) {
            SLUICE_ASSIGN_OR_RETURN(blocks[2 * layer],
                                    kvstore::EncodeKvTransformBlock(calibration.k[layer],
                                                                    keys[layer].data(), kHalf, kb));
            SLUICE_ASSIGN_OR_RETURN(blocks[2 * layer + 1],
                                    kvstore::EncodeKvTransformBlock(
                                        calibration.v[layer], rec->v(layer).data(), kHalf, vb));
          }
          return absl::OkStatus();
        }));
    std::vector<float> out(static_cast<size_t>(kHalf) * dim);
    SLUICE_ASSIGN_OR_RETURN(
        const double dec_s, Best(repeats, [&]() -> absl::Status {
          for (int layer = 0; layer < c.layers; ++layer) {
            SLUICE_RETURN_IF_ERROR(kvstore::DecodeKvTransformBlock(
                calibration.k[layer], blocks[2 * layer], out.data(), kHalf));
            SLUICE_RETURN_IF_ERROR(kvstore::DecodeKvTransformBlock(
                calibration.v[layer], blocks[2 * layer + 1], out.data(), kHalf));
          }
          return absl::OkStatus();
        }));
    double wire = 0;
    for (const std::string& b : blocks) wire += static_cast<double>(b.size());
    const double transfer_s = wire / 1e9;
    std::fprintf(stderr, "%3g/%-4g %9.2f %7.2fx %11.1f %11.1f %9.1f%% %12.1f %12.1f\n", kb, vb,
                 wire / 1e6, fp16_bytes / wire, fp16_bytes / 1e6 / enc_s, fp16_bytes / 1e6 / dec_s,
                 100.0 * enc_s / prefill_s, 1e3 * dec_s, 1e3 * transfer_s);
    rows.push_back({{"key_bits", kb},
                    {"value_bits", vb},
                    {"tokens", kHalf},
                    {"fp16_bytes", fp16_bytes},
                    {"wire_bytes", wire},
                    {"wire_ratio", fp16_bytes / wire},
                    {"encode_fp16_mb_per_s_one_core", fp16_bytes / 1e6 / enc_s},
                    {"decode_fp16_mb_per_s_one_core", fp16_bytes / 1e6 / dec_s},
                    {"prefill_seconds", prefill_s},
                    {"prefill_threads", cpu.threads()},
                    {"encode_seconds", enc_s},
                    {"decode_seconds", dec_s},
                    {"transfer_seconds_at_1gb_per_s", transfer_s},
                    {"text", absl::GetFlag(FLAGS_text)}});
  }
  return rows;
}

// ---- decode attention vs context ----

// Fills every (layer, kv-head) of one sequence with `context` tokens of Gaussian KV.
absl::StatusOr<std::unique_ptr<kvstore::PagedKvCache>> FilledCache(kernels::Backend& cpu,
                                                                   const std::string& name,
                                                                   int64_t context,
                                                                   int64_t room = 64) {
  SLUICE_ASSIGN_OR_RETURN(kvstore::KvPreset preset, kvstore::FindKvPreset(name, kHeadDim));
  SLUICE_ASSIGN_OR_RETURN(int64_t pages,
                          kvstore::PagesForSequence(preset, kLayers, kKvHeads, context + room));
  SLUICE_ASSIGN_OR_RETURN(auto cache, kvstore::PagedKvCache::Create({.layers = kLayers,
                                                                     .heads = kHeads,
                                                                     .kv_heads = kKvHeads,
                                                                     .head_dim = kHeadDim,
                                                                     .preset = preset,
                                                                     .pages = pages},
                                                                    cpu));
  SLUICE_RETURN_IF_ERROR(cache->AddSequence(0, context + room));
  std::mt19937_64 rng(7);
  const int64_t chunk = 1024;
  for (int64_t t = 0; t < context; t += chunk) {
    const int64_t n = std::min(chunk, context - t);
    SLUICE_RETURN_IF_ERROR(cache->BeginStep({{.seq = 0, .tokens = n}}));
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float> k = Gaussian(rng, n * kKvHeads * kHeadDim, 1.f);
      const std::vector<float> v = Gaussian(rng, n * kKvHeads * kHeadDim, 1.f);
      SLUICE_RETURN_IF_ERROR(cache->Write(l, k.data(), v.data()));
    }
    SLUICE_RETURN_IF_ERROR(cache->Commit());
  }
  return cache;
}

absl::StatusOr<nlohmann::json> Attention(kernels::Backend& cpu, const std::vector<int>& contexts,
                                         int repeats) {
  std::fprintf(stderr,
               "\n== decode attention, one query over all %d layers (SmolLM2: %d heads, %d kv, "
               "d=%d)\n",
               kLayers, kHeads, kKvHeads, kHeadDim);
  std::fprintf(stderr, "%-7s %8s %12s %12s %10s %12s\n", "preset", "context", "time us",
               "KV MB read", "GB/s", "vs fp16");
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937_64 rng(3);
  const std::vector<float> q = Gaussian(rng, kHeads * kHeadDim, 1.f);
  const std::vector<float> kv = Gaussian(rng, kKvHeads * kHeadDim, 1.f);
  std::vector<float> out(kHeads * kHeadDim);
  for (int context : contexts) {
    // Every preset's cache is built first and the timed runs alternate between presets, so a
    // change in this (shared, noisy) machine's speed hits all of them alike.
    std::vector<std::unique_ptr<kvstore::PagedKvCache>> caches;
    for (const std::string& name : kPresets) {
      SLUICE_ASSIGN_OR_RETURN(auto cache, FilledCache(cpu, name, context));
      // One decode step left open: its attention is what is timed.
      SLUICE_RETURN_IF_ERROR(cache->BeginStep({{.seq = 0, .tokens = 1}}));
      for (int l = 0; l < kLayers; ++l) {
        SLUICE_RETURN_IF_ERROR(cache->Write(l, kv.data(), kv.data()));
      }
      caches.push_back(std::move(cache));
    }
    std::vector<double> best(kPresets.size(), 1e30);
    for (int r = 0; r < repeats; ++r) {
      for (size_t i = 0; i < caches.size(); ++i) {
        SLUICE_ASSIGN_OR_RETURN(
            double t, Best(1, [&]() -> absl::Status {
              for (int l = 0; l < kLayers; ++l) {
                SLUICE_RETURN_IF_ERROR(caches[i]->Attend(l, q.data(), out.data()));
              }
              return absl::OkStatus();
            }));
        best[i] = std::min(best[i], t);
      }
    }
    const double fp16_us = best[0] * 1e6;
    for (size_t i = 0; i < caches.size(); ++i) {
      const kvstore::KvCacheStats st = caches[i]->Stats();
      const double bytes = static_cast<double>(st.pages.bytes() + st.residual_bytes);
      const double us = best[i] * 1e6;
      std::fprintf(stderr, "%-7s %8d %12.0f %12.1f %10.2f %11.2fx\n", kPresets[i].c_str(), context,
                   us, bytes / 1e6, bytes / best[i] / 1e9, fp16_us / us);
      rows.push_back({{"preset", kPresets[i]},
                      {"context", context},
                      {"layers", kLayers},
                      {"time_us", us},
                      {"kv_bytes", bytes},
                      {"gbps", bytes / best[i] / 1e9},
                      {"speedup_vs_fp16", fp16_us / us},
                      {"ratio_vs_fp16", st.ratio_vs_fp16()}});
    }
  }
  return rows;
}

// ---- whole decode step ----

absl::StatusOr<nlohmann::json> DecodeStep(kernels::CpuBackend& cpu, int context, int repeats) {
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  SLUICE_ASSIGN_OR_RETURN(auto gguf, model::GgufFile::Open(path));
  SLUICE_ASSIGN_OR_RETURN(auto llama, model::LlamaModel::Load(*gguf, cpu));
  const model::LlamaConfig& c = llama->config();
  if (c.layers != kLayers || c.kv_heads != kKvHeads || c.head_dim != kHeadDim) {
    return absl::FailedPreconditionError("the decode-step section expects SmolLM2-135M");
  }
  std::fprintf(stderr, "\n== model decode step at %d tokens of context (KV synthetic)\n", context);
  std::fprintf(stderr, "%-7s %12s %12s %10s\n", "preset", "step ms", "KV MB", "vs fp16");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<float> logits(c.vocab);
  std::vector<std::unique_ptr<kvstore::PagedKvCache>> caches;
  for (const std::string& name : kPresets) {
    SLUICE_ASSIGN_OR_RETURN(auto cache, FilledCache(cpu, name, context, 4 * repeats + 4));
    caches.push_back(std::move(cache));
  }
  // Timed steps alternate between presets (see Attention); each Forward commits its token, so
  // every step sees one more token of context.
  std::vector<double> best(caches.size(), 1e30);
  const int32_t token[1] = {1000};
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < caches.size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(double t, Best(1, [&]() -> absl::Status {
                                return llama->Forward({{0, token}}, *caches[i], logits.data());
                              }));
      best[i] = std::min(best[i], t);
    }
  }
  const double fp16_ms = best[0] * 1e3;
  for (size_t i = 0; i < caches.size(); ++i) {
    const kvstore::KvCacheStats st = caches[i]->Stats();
    const double ms = best[i] * 1e3;
    std::fprintf(stderr, "%-7s %12.2f %12.1f %9.2fx\n", kPresets[i].c_str(), ms,
                 (st.pages.bytes() + st.residual_bytes) / 1e6, fp16_ms / ms);
    rows.push_back({{"preset", kPresets[i]},
                    {"context", context},
                    {"step_ms", ms},
                    {"kv_bytes", st.pages.bytes() + st.residual_bytes},
                    {"speedup_vs_fp16", fp16_ms / ms}});
  }
  return rows;
}

// ---- page pool ----

absl::StatusOr<nlohmann::json> Pool(int repeats) {
  std::fprintf(stderr, "\n== page pool (65536 pages): 1-page requests\n");
  std::fprintf(stderr, "%-28s %16s\n", "operation", "pages/s");
  SLUICE_ASSIGN_OR_RETURN(auto pool, kvstore::PagePool::Create(65536, 1024));
  nlohmann::json rows = nlohmann::json::array();
  for (int batch : {1, 64, 4096, 32768}) {
    std::vector<int32_t> counts(batch, 1);
    std::vector<int64_t> offsets;
    std::vector<kvstore::PageId> ids;
    const int rounds = std::max(1, 65536 / batch);
    SLUICE_ASSIGN_OR_RETURN(double t, Best(repeats, [&]() -> absl::Status {
                              for (int r = 0; r < rounds; ++r) {
                                SLUICE_RETURN_IF_ERROR(pool->Allocate(counts, &offsets, &ids));
                                SLUICE_RETURN_IF_ERROR(pool->Free(ids));
                              }
                              return absl::OkStatus();
                            }));
    const double rate = 2.0 * batch * rounds / t;  // allocations + frees
    const std::string label = "alloc+free, batch " + std::to_string(batch);
    std::fprintf(stderr, "%-28s %16.3g\n", label.c_str(), rate);
    rows.push_back({{"batch", batch}, {"ops_per_s", rate}});
  }
  return rows;
}

// ---- fragmentation under H2O eviction ----

// One kv-head generating `steps` tokens under an H2O budget: once more than `budget` tokens are
// live, the token with the lowest cumulative attention is evicted every step. Attention mass
// per step is simulated: recent tokens and a few heavy hitters get most of it.
absl::StatusOr<nlohmann::json> Eviction() {
  constexpr int kSlots = 64, kBudget = 512, kSteps = 4096, kPrompt = 1024;
  std::fprintf(stderr,
               "\n== fragmentation (1 - live/allocated slots) under per-step H2O eviction "
               "(budget %d, %d slots per page)\n",
               kBudget, kSlots);
  const std::vector<std::string> modes = {"no-op", "free-block", "sparse-copy", "slot-reuse"};
  std::fprintf(stderr, "%6s", "step");
  for (const std::string& m : modes) std::fprintf(stderr, " %12s", m.c_str());
  std::fprintf(stderr, "\n");
  struct Page {
    std::vector<uint64_t> bits = std::vector<uint64_t>(kvstore::SlotBitmapWords(kSlots), 0);
    std::vector<int64_t> token = std::vector<int64_t>(kSlots, -1);
    int32_t used = 0;
  };
  std::map<std::string, std::vector<double>> series;
  std::vector<int> sample_steps;
  int64_t copies = 0;
  for (const std::string& mode : modes) {
    std::mt19937_64 rng(11);
    std::vector<Page> pages;
    std::vector<double> score;               // per token id
    std::vector<std::pair<int, int>> where;  // token -> (page, slot)
    int64_t live = 0;
    auto place = [&](int64_t tok) {
      if (mode == "slot-reuse") {
        for (size_t p = 0; p < pages.size(); ++p) {
          const int64_t s = kvstore::FindFirstClear(pages[p].bits.data(), pages[p].used);
          if (s >= 0 && s < pages[p].used) {
            kvstore::SetSlot(pages[p].bits.data(), s);
            pages[p].token[s] = tok;
            where[tok] = {static_cast<int>(p), static_cast<int>(s)};
            return;
          }
        }
      }
      if (pages.empty() || pages.back().used == kSlots) pages.emplace_back();
      Page& pg = pages.back();
      kvstore::SetSlot(pg.bits.data(), pg.used);
      pg.token[pg.used] = tok;
      where[tok] = {static_cast<int>(pages.size() - 1), pg.used};
      ++pg.used;
    };
    auto add_token = [&]() {
      const int64_t tok = static_cast<int64_t>(score.size());
      score.push_back(0);
      where.emplace_back(-1, -1);
      place(tok);
      ++live;
    };
    auto step_attention = [&]() {
      // Recent window and heavy hitters (every 37th token) receive the mass.
      const int64_t n = static_cast<int64_t>(score.size());
      for (int64_t t = std::max<int64_t>(0, n - 64); t < n; ++t) score[t] += 1.0 / 64;
      for (int64_t t = 0; t < n; t += 37) score[t] += 0.01;
      std::uniform_int_distribution<int64_t> any(0, n - 1);
      for (int i = 0; i < 8; ++i) score[any(rng)] += 0.02;
    };
    for (int i = 0; i < kPrompt; ++i) add_token();
    std::vector<double>& s = series[mode];
    for (int step = 0; step <= kSteps; ++step) {
      step_attention();
      add_token();
      while (live > kBudget) {
        // Evict the live token with the lowest score (keep the newest 64).
        int64_t victim = -1;
        const int64_t n = static_cast<int64_t>(score.size());
        for (int64_t t = 0; t < n - 64; ++t) {
          if (where[t].first >= 0 && (victim < 0 || score[t] < score[victim])) victim = t;
        }
        auto [p, sl] = where[victim];
        kvstore::ClearSlot(pages[p].bits.data(), sl);
        where[victim] = {-1, -1};
        --live;
      }
      if (mode == "free-block" || mode == "sparse-copy") {
        std::vector<kvstore::SlotBitmapView> views;
        for (const Page& pg : pages) views.push_back({pg.bits.data(), pg.used});
        if (mode == "free-block") {
          const std::vector<int32_t> empty = kvstore::FindEmptyPages(views);
          for (auto it = empty.rbegin(); it != empty.rend(); ++it) pages.erase(pages.begin() + *it);
        } else {
          SLUICE_ASSIGN_OR_RETURN(kvstore::CompactionPlan plan,
                                  kvstore::PlanCompaction(views, kSlots));
          std::vector<uint64_t*> bitmaps;
          for (Page& pg : pages) bitmaps.push_back(pg.bits.data());
          SLUICE_RETURN_IF_ERROR(
              kvstore::ApplyCompaction(plan, bitmaps, [&](const kvstore::SlotMove& m) {
                for (int i = 0; i < m.slots; ++i) {
                  pages[m.dst_page].token[m.dst_slot + i] = pages[m.src_page].token[m.src_slot + i];
                }
                copies += m.slots;
              }));
          for (size_t i = 0; i < pages.size(); ++i) pages[i].used = plan.used_after[i];
          for (auto it = plan.freed.rbegin(); it != plan.freed.rend(); ++it) {
            pages.erase(pages.begin() + *it);
          }
        }
        // Rebuild the token -> slot map after pages moved.
        for (auto& w : where) w = {-1, -1};
        for (size_t p = 0; p < pages.size(); ++p) {
          for (int sl = 0; sl < pages[p].used; ++sl) {
            if (kvstore::TestSlot(pages[p].bits.data(), sl)) {
              where[pages[p].token[sl]] = {static_cast<int>(p), sl};
            }
          }
        }
      }
      if (step % 512 == 0) {
        const double allocated = static_cast<double>(pages.size()) * kSlots;
        s.push_back(allocated > 0 ? 1.0 - live / allocated : 0.0);
        if (mode == modes[0]) sample_steps.push_back(step);
      }
    }
  }
  for (size_t i = 0; i < sample_steps.size(); ++i) {
    std::fprintf(stderr, "%6d", sample_steps[i]);
    for (const std::string& m : modes) std::fprintf(stderr, " %12.3f", series[m][i]);
    std::fprintf(stderr, "\n");
  }
  std::fprintf(stderr, "sparse-copy moved %lld slots in %d steps\n", static_cast<long long>(copies),
               kSteps);
  nlohmann::json out = {{"budget", kBudget},
                        {"slots_per_page", kSlots},
                        {"prompt", kPrompt},
                        {"steps", sample_steps},
                        {"sparse_copy_slots_moved", copies}};
  for (const std::string& m : modes) out["fragmentation"][m] = series[m];
  return out;
}

// The CPU's model name from /proc/cpuinfo, for the results file.
std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

absl::Status Run() {
  SLUICE_ASSIGN_OR_RETURN(auto cpu,
                          kernels::CpuBackend::Create({.threads = absl::GetFlag(FLAGS_threads)}));
  SLUICE_ASSIGN_OR_RETURN(std::vector<int> contexts,
                          bench::ParseIntList(absl::GetFlag(FLAGS_contexts)));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  kPresets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  const std::vector<std::string> sections = absl::StrSplit(absl::GetFlag(FLAGS_sections), ',');
  auto want = [&](const char* s) {
    return std::find(sections.begin(), sections.end(), s) != sections.end();
  };
  nlohmann::json out = {{"system", "sluice"},
                        {"device", CpuModel()},
                        {"backend", cpu->name()},
                        {"threads", cpu->threads()},
                        {"repeats", repeats}};
  if (want("codecs")) {
    SLUICE_ASSIGN_OR_RETURN(out["codecs"], Codecs(*cpu, repeats));
  }
  if (want("bits")) {
    SLUICE_ASSIGN_OR_RETURN(out["huffman_bits"], Bits(*cpu));
  }
  if (want("attention")) {
    SLUICE_ASSIGN_OR_RETURN(out["decode_attention"], Attention(*cpu, contexts, repeats));
  }
  if (want("decode_step")) {
    SLUICE_ASSIGN_OR_RETURN(out["decode_step"],
                            DecodeStep(*cpu, absl::GetFlag(FLAGS_step_context), repeats));
  }
  if (want("pool")) {
    SLUICE_ASSIGN_OR_RETURN(out["page_pool"], Pool(repeats));
  }
  if (want("eviction")) {
    SLUICE_ASSIGN_OR_RETURN(out["eviction_fragmentation"], Eviction());
  }
  if (want("wire")) {
    SLUICE_ASSIGN_OR_RETURN(out["wire_codec"], Wire(*cpu, repeats));
  }
  std::cout << out.dump(1) << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "kvstore_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
