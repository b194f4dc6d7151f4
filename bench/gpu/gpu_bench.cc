// The GPU benchmark (run on the lent GPU machine by bench/gpu/accept.sh): in one run,
//  - the HBM roofline: a large device-to-device copy, bytes read + written over time;
//  - decode attention over compressed pages for every preset at batch x context x shape, next to
//    PyTorch's scaled_dot_product_attention in fp16 on contiguous KV of the same shapes (timed by
//    bench/gpu/sdpa_peer.py in the same run; --sdpa_json);
//  - Huffman encode and decode GB/s over a pool of kvcomp pages;
//  - page allocation and compaction per decode step against the sequential CPU implementation.
// Writes <out_dir>/gpu-attention.json and <out_dir>/gpu-codec-memory.json and prints tables.
//
// Synthetic KV: a pool of distinct pages per tier, quantized on the GPU from random rows; page
// tables walk the pool in a scattered order, so a large batch reads pages many times but never
// from L2 (the pool is several times larger than L2).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/gpu/memory_bench.h"
#include "bench/int_list.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/cuda/kv_huffman_ops.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/huffman.h"
#include "kernels/kv_huffman.h"
#include "kernels/ref/ref_backend.h"
#include "kvstore/cache/kv_codebooks.h"
#include "kvstore/kv_preset.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, out_dir, "bench/results", "where the JSON results go");
ABSL_FLAG(std::string, sdpa_json, "", "PyTorch SDPA timings from bench/gpu/sdpa_peer.py");
ABSL_FLAG(std::string, presets, "", "comma-separated presets; empty: all");
ABSL_FLAG(std::string, batches, "1,8,32,128", "batch sizes");
ABSL_FLAG(std::string, contexts, "1024,4096,8192,16384,32768", "context lengths");
ABSL_FLAG(std::string, shapes, "llama3-8b,smollm2", "attention shapes");
ABSL_FLAG(int, pages_per_chunk, 0, "pages per split-K chunk; 0: the plan's choice");
ABSL_FLAG(int, reps, 20, "timed repetitions per configuration (median reported)");
ABSL_FLAG(int, pool_pages, 16384, "distinct pages per tier");
ABSL_FLAG(bool, memory, true, "run the allocation and compaction benchmark");
ABSL_FLAG(int, roofline_mib, 2048, "MiB of the device-to-device copy that measures HBM bandwidth");
ABSL_FLAG(std::string, memory_batches, "8,16,32,64,128,256",
          "sequences per decode step in the memory benchmark");
ABSL_FLAG(int, memory_layers, 32, "layers per sequence in the memory benchmark");

namespace sluice::bench {
namespace {

using kernels::KvPageLayout;
using kernels::KvPageRef;
using kernels::KvTierFormat;
namespace kc = kernels::cuda;

struct Shape {
  std::string name;
  int heads, kv_heads, head_dim;
};

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {{"llama3-8b", 32, 8, 128}, {"smollm2", 9, 3, 64}};
  return shapes;
}

// Device bytes, freed at scope exit, and a typed view of them.
using DeviceMemory = kc::DeviceArray<uint8_t>;
template <typename T>
T* As(const DeviceMemory& m) {
  return reinterpret_cast<T*>(m.data());
}

// Median time in microseconds of `reps` runs of `fn` (after two warm-up runs), by CUDA events.
// `size` elements of device memory at `data`, as the KV launchers take them.
template <typename T>
kernels::BufferView<T> DeviceView(T* data, int64_t size) {
  return {.data = data, .size = size, .space = kernels::MemorySpace::kDevice};
}

template <typename Fn>
absl::StatusOr<double> TimeMedianUs(cudaStream_t stream, int reps, Fn fn) {
  for (int i = 0; i < 2; ++i) SLUICE_RETURN_IF_ERROR(fn());
  SLUICE_ASSIGN_OR_RETURN(const kc::CudaEvent a, kc::CudaEvent::Create(/*timing=*/true));
  SLUICE_ASSIGN_OR_RETURN(const kc::CudaEvent b, kc::CudaEvent::Create(/*timing=*/true));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(a.get(), stream));
    SLUICE_RETURN_IF_ERROR(fn());
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(b.get(), stream));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b.get()));
    float ms = 0;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a.get(), b.get()));
    times.push_back(ms * 1e3);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

absl::StatusOr<double> MeasureHbmGbps(cudaStream_t stream, size_t bytes) {
  DeviceMemory src, dst;
  SLUICE_RETURN_IF_ERROR(src.Reserve(bytes));
  SLUICE_RETURN_IF_ERROR(dst.Reserve(bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(As<void>(src), 0x5a, bytes, stream));
  SLUICE_ASSIGN_OR_RETURN(
      const double us, TimeMedianUs(stream, 10, [&]() -> absl::Status {
        SLUICE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(As<void>(dst), As<void>(src), bytes, cudaMemcpyDeviceToDevice, stream));
        return absl::OkStatus();
      }));
  return 2.0 * bytes / (us * 1e-6) / 1e9;
}

// Random rows like real keys (a few outlier channels) and values, on the device.
struct Rows {
  DeviceMemory k, v;
  std::vector<float> host_k, host_v;
  int64_t tokens = 0;
};

absl::StatusOr<Rows> MakeRows(int64_t tokens, int d, cudaStream_t stream) {
  Rows r;
  r.tokens = tokens;
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.f, 1.f);
  r.host_k.resize(tokens * d);
  r.host_v.resize(tokens * d);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int c = 0; c < d; ++c) {
      r.host_k[t * d + c] = normal(rng) * (c % 17 == 3 ? 8.f : 1.f);
      r.host_v[t * d + c] = normal(rng);
    }
  }
  SLUICE_RETURN_IF_ERROR(r.k.Reserve(r.host_k.size() * 4));
  SLUICE_RETURN_IF_ERROR(r.v.Reserve(r.host_v.size() * 4));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(As<void>(r.k), r.host_k.data(), r.host_k.size() * 4,
                                              cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(As<void>(r.v), r.host_v.data(), r.host_v.size() * 4,
                                              cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return r;
}

// A pool of distinct pages of one tier, and how many slots each holds.
struct PagePool {
  KvTierFormat format;
  KvPageLayout layout;
  DeviceMemory arena;
  int64_t pages = 0;
  std::vector<int32_t> slots;
  // Huffman-coded tiers: codebooks, and the codec timings taken while filling the pool.
  std::unique_ptr<kernels::HuffmanCodebook> k_book, v_book;
  kernels::KvCodebooks books;
  nlohmann::json codec;

  const uint8_t* page(int64_t i) const { return As<uint8_t>(arena) + i * format.page_bytes; }
};

// Codebooks from the host quantization of the first rows, as a prefill would build them.
absl::Status BuildCodebooks(PagePool& pool, const Rows& rows) {
  kernels::RefBackend ref;
  const int64_t d = pool.format.head_dim;
  SLUICE_ASSIGN_OR_RETURN(
      kvstore::KvCodebookPair books,
      kvstore::BuildKvCodebooks(ref, pool.format, rows.host_k.data(), rows.host_v.data(), d,
                                std::min<int64_t>(rows.tokens, 2048), 1));
  pool.k_book = std::make_unique<kernels::HuffmanCodebook>(std::move(books.k));
  pool.v_book = std::make_unique<kernels::HuffmanCodebook>(std::move(books.v));
  pool.books = {.k = pool.k_book.get(), .v = pool.v_book.get()};
  return absl::OkStatus();
}

// Fills a Huffman-coded pool: units quantized by the fixed-width kernel, then every page coded
// in one launch (timed: encode GB/s), then every unit decoded in one launch (decode GB/s).
absl::Status FillCodedPool(PagePool& pool, const Rows& rows, cudaStream_t stream, int reps) {
  SLUICE_RETURN_IF_ERROR(BuildCodebooks(pool, rows));
  SLUICE_ASSIGN_OR_RETURN(const kernels::KvHuffmanTier tier,
                          kernels::MakeKvHuffmanTier(pool.format));
  const int64_t u = tier.layout.unit_tokens, d = pool.format.head_dim;
  const int64_t units_per_page = tier.layout.tokens / u;
  const int64_t unit_bytes = tier.unit_layout.bytes_used;
  const int64_t units = pool.pages * units_per_page;
  DeviceMemory unit_pages, jobs_memory, written, decoded, decode_jobs_memory;
  SLUICE_RETURN_IF_ERROR(unit_pages.Reserve(units * unit_bytes));
  SLUICE_RETURN_IF_ERROR(written.Reserve(pool.pages * sizeof(int64_t)));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(As<void>(unit_pages), 0, units * unit_bytes, stream));
  for (int64_t i = 0; i < units; ++i) {
    const int64_t t0 = (i * 7 * u) % (rows.tokens - u);
    SLUICE_CUDA_RETURN_IF_ERROR(kc::LaunchKvQuantize(
        {.k = DeviceView(As<float>(rows.k) + t0 * d, (rows.tokens - t0) * d),
         .v = DeviceView(As<float>(rows.v) + t0 * d, (rows.tokens - t0) * d),
         .stride = d,
         .tokens = u,
         .format = tier.unit_format,
         .layout = tier.unit_layout,
         .page = DeviceView(As<uint8_t>(unit_pages) + i * unit_bytes, unit_bytes),
         .slot = 0},
        stream));
  }
  std::vector<kc::HuffmanEncodeJob> jobs(pool.pages);
  for (int64_t p = 0; p < pool.pages; ++p) {
    jobs[p] = {.page = As<uint8_t>(pool.arena) + p * pool.format.page_bytes,
               .units = As<uint8_t>(unit_pages) + p * units_per_page * unit_bytes,
               .first_unit = 0,
               .units_count = static_cast<int32_t>(units_per_page),
               .tokens_written = As<int64_t>(written) + p};
  }
  SLUICE_RETURN_IF_ERROR(jobs_memory.Reserve(jobs.size() * sizeof(jobs[0])));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(As<void>(jobs_memory), jobs.data(),
                                              jobs.size() * sizeof(jobs[0]), cudaMemcpyHostToDevice,
                                              stream));
  SLUICE_ASSIGN_OR_RETURN(kc::DeviceCodebook k, kc::DeviceCodebook::Upload(*pool.k_book, stream));
  SLUICE_ASSIGN_OR_RETURN(kc::DeviceCodebook v, kc::DeviceCodebook::Upload(*pool.v_book, stream));
  const kc::HuffmanTierDesc desc{.format = tier.format,
                                 .layout = tier.layout,
                                 .unit_format = tier.unit_format,
                                 .unit_layout = tier.unit_layout};
  // Encoding appends to the pages: clear them before each run so every run codes the same.
  const size_t arena_bytes = pool.pages * pool.format.page_bytes;
  auto encode = [&]() -> absl::Status {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(As<void>(pool.arena), 0, arena_bytes, stream));
    SLUICE_CUDA_RETURN_IF_ERROR(kc::LaunchHuffmanEncode(desc, k.encoder(), v.encoder(),
                                                        As<const kc::HuffmanEncodeJob>(jobs_memory),
                                                        static_cast<int32_t>(pool.pages), stream));
    return absl::OkStatus();
  };
  SLUICE_ASSIGN_OR_RETURN(
      const double memset_us, TimeMedianUs(stream, reps, [&]() -> absl::Status {
        SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(As<void>(pool.arena), 0, arena_bytes, stream));
        return absl::OkStatus();
      }));
  SLUICE_ASSIGN_OR_RETURN(const double encode_us, TimeMedianUs(stream, reps, encode));
  std::vector<int64_t> host_written(pool.pages);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_written.data(), As<void>(written),
                                              pool.pages * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                              stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  pool.slots.assign(host_written.begin(), host_written.end());
  int64_t coded_units = 0;
  for (int64_t w : host_written) coded_units += w / u;
  // Decode every coded unit.
  std::vector<kc::HuffmanDecodeJob> djobs;
  SLUICE_RETURN_IF_ERROR(decoded.Reserve(coded_units * unit_bytes));
  for (int64_t p = 0; p < pool.pages; ++p) {
    for (int64_t j = 0; j < host_written[p] / u; ++j) {
      djobs.push_back({.page = pool.page(p),
                       .unit = static_cast<int32_t>(j),
                       .out = As<uint8_t>(decoded) + djobs.size() * unit_bytes});
    }
  }
  SLUICE_RETURN_IF_ERROR(decode_jobs_memory.Reserve(djobs.size() * sizeof(djobs[0])));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(As<void>(decode_jobs_memory), djobs.data(),
                                              djobs.size() * sizeof(djobs[0]),
                                              cudaMemcpyHostToDevice, stream));
  SLUICE_ASSIGN_OR_RETURN(const double decode_us, TimeMedianUs(stream, reps, [&]() -> absl::Status {
                            SLUICE_CUDA_RETURN_IF_ERROR(kc::LaunchHuffmanDecode(
                                desc, k.table(), k.bits(), v.table(), v.bits(),
                                As<const kc::HuffmanDecodeJob>(decode_jobs_memory),
                                static_cast<int32_t>(djobs.size()), stream));
                            return absl::OkStatus();
                          }));
  // Symbols are bytes of 8-bit codes: 2 * d * u per unit, in and out.
  const double symbol_bytes = 2.0 * d * u;
  const double encode_net_us = std::max(1.0, encode_us - memset_us);
  pool.codec = {{"format", kernels::KvTierFormatName(pool.format)},
                {"pages", pool.pages},
                {"units_coded", coded_units},
                {"symbol_bytes", coded_units * symbol_bytes},
                {"page_bytes", arena_bytes},
                {"encode_us", encode_net_us},
                {"encode_gbps", coded_units * symbol_bytes / (encode_net_us * 1e-6) / 1e9},
                {"decode_us", decode_us},
                {"decode_gbps", coded_units * symbol_bytes / (decode_us * 1e-6) / 1e9}};
  return absl::OkStatus();
}

absl::StatusOr<PagePool> MakePool(const KvTierFormat& format, int64_t pages, const Rows& rows,
                                  cudaStream_t stream, int reps) {
  PagePool pool;
  pool.format = format;
  SLUICE_ASSIGN_OR_RETURN(pool.layout, kernels::ComputePageLayout(format));
  pool.pages = pages;
  SLUICE_RETURN_IF_ERROR(pool.arena.Reserve(pages * format.page_bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(As<void>(pool.arena), 0, pages * format.page_bytes, stream));
  if (format.huffman_bits > 0) {
    SLUICE_RETURN_IF_ERROR(FillCodedPool(pool, rows, stream, reps));
    return pool;
  }
  const int64_t n = pool.layout.tokens, d = format.head_dim;
  for (int64_t p = 0; p < pages; ++p) {
    const int64_t t0 = (p * 13) % (rows.tokens - n);
    SLUICE_CUDA_RETURN_IF_ERROR(kc::LaunchKvQuantize(
        {.k = DeviceView(As<float>(rows.k) + t0 * d, (rows.tokens - t0) * d),
         .v = DeviceView(As<float>(rows.v) + t0 * d, (rows.tokens - t0) * d),
         .stride = d,
         .tokens = n,
         .format = format,
         .layout = pool.layout,
         .page = DeviceView(As<uint8_t>(pool.arena) + p * format.page_bytes, format.page_bytes),
         .slot = 0},
        stream));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  pool.slots.assign(pages, static_cast<int32_t>(n));
  return pool;
}

// SDPA fp16 timings keyed by "shape/batch/context".
absl::StatusOr<std::map<std::string, double>> ReadSdpa(const std::string& path) {
  std::map<std::string, double> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --sdpa_json ", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("rows")) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not SDPA results JSON"));
  }
  for (const auto& r : j["rows"]) {
    out[absl::StrFormat("%s/%d/%d", r["shape"].get<std::string>(), r["batch"].get<int>(),
                        r["context"].get<int>())] = r["time_us"].get<double>();
  }
  return out;
}

// Tokens kept per (sequence, kv-head) in each tier for `context` tokens under a preset. Evicting
// presets keep budget x context; leankv presets are measured with half their tokens in each
// tier and none evicted (their split depends on the text; this is an assumption, not a reading).
std::vector<int64_t> KeptTokens(const kvstore::KvPreset& preset, int64_t context) {
  const int64_t paged = std::max<int64_t>(0, context - preset.residual);
  if (preset.low.has_value()) return {paged / 2, paged - paged / 2};
  float keep = 1.f;
  if (preset.policy.kind != kvstore::KvPolicyKind::kNone &&
      preset.policy.kind != kvstore::KvPolicyKind::kLeanKv) {
    keep = preset.policy.budget;
  }
  return {static_cast<int64_t>(std::llround(paged * keep))};
}

absl::Status Run() {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  const std::string device = prop.name;
  cudaStream_t stream;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int reps = absl::GetFlag(FLAGS_reps);
  const int roofline_mib = absl::GetFlag(FLAGS_roofline_mib);
  SLUICE_ASSIGN_OR_RETURN(
      const double hbm, MeasureHbmGbps(stream, size_t{static_cast<unsigned>(roofline_mib)} << 20));
  std::printf("device: %s, %d SMs, L2 %d MiB; HBM roofline (%d MiB copy): %.0f GB/s\n",
              device.c_str(), prop.multiProcessorCount, prop.l2CacheSize >> 20, roofline_mib, hbm);
  SLUICE_ASSIGN_OR_RETURN(const auto sdpa, ReadSdpa(absl::GetFlag(FLAGS_sdpa_json)));
  SLUICE_ASSIGN_OR_RETURN(const std::vector<int> batches,
                          ParseIntList(absl::GetFlag(FLAGS_batches)));
  SLUICE_ASSIGN_OR_RETURN(const std::vector<int> contexts,
                          ParseIntList(absl::GetFlag(FLAGS_contexts)));
  std::vector<std::string> presets = kvstore::KvPresetNames();
  if (!absl::GetFlag(FLAGS_presets).empty()) {
    presets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  }
  const std::vector<std::string> shape_names = absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',');

  nlohmann::json rows = nlohmann::json::array(), codec = nlohmann::json::array();
  std::printf("\n%-10s %-12s %5s %6s %10s %12s %8s %6s %10s %7s %7s\n", "shape", "preset", "batch",
              "ctx", "time_us", "bytes", "GB/s", "%hbm", "sdpa_us", "ratio", "speedup");
  for (const Shape& shape : Shapes()) {
    if (std::find(shape_names.begin(), shape_names.end(), shape.name) == shape_names.end()) {
      continue;
    }
    const int d = shape.head_dim;
    SLUICE_ASSIGN_OR_RETURN(const Rows source, MakeRows(8192, d, stream));
    // Recent (full-precision) rows and queries for the largest batch.
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    DeviceMemory q, out, recent_k, recent_v;
    const int64_t max_recent = 128;
    std::vector<float> host(std::max<int64_t>(max_batch * shape.heads * d,
                                              max_batch * max_recent * shape.kv_heads * d));
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& x : host) x = normal(rng);
    SLUICE_RETURN_IF_ERROR(q.Reserve(max_batch * shape.heads * d * 4));
    SLUICE_RETURN_IF_ERROR(out.Reserve(max_batch * shape.heads * d * 4));
    SLUICE_RETURN_IF_ERROR(recent_k.Reserve(max_batch * max_recent * shape.kv_heads * d * 4));
    SLUICE_RETURN_IF_ERROR(recent_v.Reserve(max_batch * max_recent * shape.kv_heads * d * 4));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        As<void>(q), host.data(), max_batch * shape.heads * d * 4, cudaMemcpyHostToDevice));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(As<void>(recent_k), host.data(),
                                           max_batch * max_recent * shape.kv_heads * d * 4,
                                           cudaMemcpyHostToDevice));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(As<void>(recent_v), host.data(),
                                           max_batch * max_recent * shape.kv_heads * d * 4,
                                           cudaMemcpyHostToDevice));
    // Pools by tier format name, shared by presets with the same format.
    std::map<std::string, PagePool> pools;
    for (const std::string& name : presets) {
      SLUICE_ASSIGN_OR_RETURN(const kvstore::KvPreset preset, kvstore::FindKvPreset(name, d));
      std::vector<KvTierFormat> formats = {preset.high};
      if (preset.low.has_value()) formats.push_back(*preset.low);
      std::vector<KvPageLayout> layouts;
      std::vector<kernels::KvCodebooks> books;
      std::vector<const PagePool*> tier_pools;
      for (const KvTierFormat& f : formats) {
        const std::string key = kernels::KvTierFormatName(f) + absl::StrFormat("/%d", f.page_bytes);
        if (!pools.contains(key)) {
          const int64_t n = f.huffman_bits > 0 ? absl::GetFlag(FLAGS_pool_pages) / 4
                                               : absl::GetFlag(FLAGS_pool_pages);
          SLUICE_ASSIGN_OR_RETURN(PagePool pool, MakePool(f, n, source, stream, reps));
          if (!pool.codec.is_null()) {
            pool.codec["shape"] = shape.name;
            codec.push_back(pool.codec);
            std::printf("huffman %s %s: encode %.1f GB/s, decode %.1f GB/s of 8-bit codes\n",
                        shape.name.c_str(), pool.codec["format"].get<std::string>().c_str(),
                        pool.codec["encode_gbps"].get<double>(),
                        pool.codec["decode_gbps"].get<double>());
          }
          pools.emplace(key, std::move(pool));
        }
        const PagePool& pool = pools.at(key);
        tier_pools.push_back(&pool);
        layouts.push_back(pool.layout);
        books.push_back(pool.books);
      }
      const int64_t recent = std::clamp<int64_t>(preset.residual, 1, max_recent);
      for (const int64_t context : contexts) {
        const std::vector<int64_t> kept = KeptTokens(preset, context);
        for (const int64_t batch : batches) {
          // Page tables: each (sequence, kv-head) walks its tiers' pools in a scattered order.
          std::vector<KvPageRef> pages;
          std::vector<int32_t> offsets = {0};
          int64_t cursor = 0;
          for (int64_t bh = 0; bh < batch * shape.kv_heads; ++bh) {
            for (size_t t = 0; t < formats.size(); ++t) {
              const PagePool& pool = *tier_pools[t];
              for (int64_t left = kept[t]; left > 0;) {
                const int64_t i = (cursor++ * 7919) % pool.pages;
                const int32_t slots = static_cast<int32_t>(std::min<int64_t>(left, pool.slots[i]));
                if (slots <= 0) continue;
                pages.push_back(
                    {.data = pool.page(i), .slots = slots, .tier = static_cast<int32_t>(t)});
                left -= slots;
              }
            }
            offsets.push_back(static_cast<int32_t>(pages.size()));
          }
          std::vector<int64_t> recent_offsets(batch + 1);
          for (int64_t b = 0; b <= batch; ++b) recent_offsets[b] = b * recent;
          std::vector<const float*> recent_k_rows, recent_v_rows;  // each sequence's window
          for (int64_t b = 0; b < batch; ++b) {
            recent_k_rows.push_back(As<float>(recent_k) + b * recent * shape.kv_heads * d);
            recent_v_rows.push_back(As<float>(recent_v) + b * recent * shape.kv_heads * d);
          }
          const kc::DecodeBatch desc{.batch = batch,
                                     .q_tokens = 1,
                                     .heads = shape.heads,
                                     .kv_heads = shape.kv_heads,
                                     .head_dim = d,
                                     .scale = 1.f / std::sqrt(static_cast<float>(d)),
                                     .formats = formats.data(),
                                     .layouts = layouts.data(),
                                     .codebooks = books.data(),
                                     .tier_count = static_cast<int32_t>(formats.size()),
                                     .pages = pages.data(),
                                     .page_offsets = offsets.data(),
                                     .recent_offsets = recent_offsets.data(),
                                     .recent_k = recent_k_rows.data(),
                                     .recent_v = recent_v_rows.data(),
                                     .pages_per_chunk = absl::GetFlag(FLAGS_pages_per_chunk)};
          nlohmann::json row = {{"preset", name},
                                {"batch", batch},
                                {"context", context},
                                {"shape", shape.name},
                                {"hbm_gbps", hbm}};
          auto plan = kc::DecodeAttentionPlan::Create(desc, stream);
          // (A StatusOr made from an OK status aborts: time only a plan that was built.)
          const absl::StatusOr<double> us =
              plan.ok()
                  ? TimeMedianUs(stream, reps,
                                 [&]() { return plan->Run(As<float>(q), As<float>(out), stream); })
                  : absl::StatusOr<double>(plan.status());
          const std::string key = absl::StrFormat("%s/%d/%d", shape.name, batch, context);
          const double sdpa_us = sdpa.contains(key) ? sdpa.at(key) : NAN;
          if (!us.ok()) {
            row["error"] = us.status().ToString();
            std::printf("%-10s %-12s %5d %6d  error: %s\n", shape.name.c_str(), name.c_str(),
                        static_cast<int>(batch), static_cast<int>(context),
                        us.status().ToString().c_str());
            rows.push_back(row);
            continue;
          }
          const double bytes = static_cast<double>(plan->page_bytes_read());
          const double fp16_bytes = 4.0 * batch * shape.kv_heads * context * d;
          const double gbps = bytes / (*us * 1e-6) / 1e9;
          row["time_us"] = *us;
          row["compressed_bytes"] = bytes;
          row["achieved_gbps"] = gbps;
          row["sdpa_fp16_time_us"] =
              std::isnan(sdpa_us) ? nlohmann::json() : nlohmann::json(sdpa_us);
          row["compression_ratio"] = fp16_bytes / std::max(1.0, bytes);
          row["speedup_vs_sdpa"] =
              std::isnan(sdpa_us) ? nlohmann::json() : nlohmann::json(sdpa_us / *us);
          row["chunks"] = plan->chunks();
          row["kernel"] = plan->kernel();
          rows.push_back(row);
          std::printf("%-10s %-12s %5d %6d %10.1f %12.0f %8.0f %5.0f%% %10.1f %7.2f %7.2f\n",
                      shape.name.c_str(), name.c_str(), static_cast<int>(batch),
                      static_cast<int>(context), *us, bytes, gbps, 100 * gbps / hbm, sdpa_us,
                      fp16_bytes / std::max(1.0, bytes), sdpa_us / *us);
        }
      }
    }
  }
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  nlohmann::json attention = {{"device", device},
                              {"hbm_gbps", hbm},
                              {"rows", rows},
                              {"notes",
                               "leankv presets: half the kept tokens in each tier, none "
                               "evicted (assumed split); evicting presets keep budget x "
                               "context; time_us: median of CUDA-event timings"}};
  std::ofstream(dir + "/gpu-attention.json") << attention.dump(1) << "\n";

  nlohmann::json memory = nlohmann::json::array();
  if (absl::GetFlag(FLAGS_memory)) {
    // The sequential CPU side takes seconds per step at large batches: few repeats.
    MemoryBenchOptions options;
    options.warmup = 1;
    options.repeats = 5;
    SLUICE_ASSIGN_OR_RETURN(options.batches, ParseIntList(absl::GetFlag(FLAGS_memory_batches)));
    options.layers = absl::GetFlag(FLAGS_memory_layers);
    SLUICE_ASSIGN_OR_RETURN(memory, RunMemoryBench(options));
    // Memory management against a decode step of Llama-3-8B at the memory bench's context:
    // 32 layers of sluice attention (measured above, where that batch was) plus one read of the
    // 16.06e9 bytes of bf16 weights at the measured HBM bandwidth; a lower bound of a real step,
    // so the share is an upper bound.
    for (auto& r : memory) {
      for (const auto& a : rows) {
        if (a.value("preset", "") == "sluice" && a.value("shape", "") == "llama3-8b" &&
            a.value("context", 0) == options.context && a.value("batch", 0) == r["batch"] &&
            a.contains("time_us") && !r["gpu_alloc_us"].is_null()) {
          const double step_us = 32 * a["time_us"].get<double>() + 16.06e9 / (hbm * 1e9) * 1e6;
          r["step_lower_bound_us"] = step_us;
          r["gpu_share_of_step"] =
              (r["gpu_alloc_us"].get<double>() + r["gpu_compact_us"].get<double>()) / step_us;
        }
      }
    }
    std::printf("\n%6s %14s %16s %14s %16s\n", "batch", "gpu_alloc_us", "gpu_compact_us",
                "cpu_alloc_us", "cpu_compact_us");
    for (const auto& r : memory) {
      std::printf("%6d %14.1f %16.1f %14.1f %16.1f\n", r["batch"].get<int>(),
                  r["gpu_alloc_us"].get<double>(), r["gpu_compact_us"].get<double>(),
                  r["cpu_alloc_us"].get<double>(), r["cpu_compact_us"].get<double>());
    }
  }
  nlohmann::json codec_memory = {{"device", device}, {"huffman", codec}, {"memory", memory}};
  std::ofstream(dir + "/gpu-codec-memory.json") << codec_memory.dump(1) << "\n";
  std::printf("\nwrote %s/gpu-attention.json and %s/gpu-codec-memory.json\n", dir.c_str(),
              dir.c_str());
  cudaStreamDestroy(stream);
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = sluice::bench::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
