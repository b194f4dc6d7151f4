// The block-parallel unit decoder (huffman_unit.cuh, through LaunchHuffmanDecode) against the
// bit-at-a-time reference decoder (KvDecodeUnitReference) on pages the host coder fills with
// fresh random codes: codebooks from short to the 12-bit limit, codes drawn from the codebook's
// histogram or against it (long codes, slow resynchronisation of the lanes), one-bit codes, and
// units of 16, 32 and 64 tokens. Under the emulation in CI, on the GPU where one is.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/device_testing.h"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/huffman.h"
#include "kernels/kv_huffman.h"
#include "kernels/test_util/backend_cases.h"

namespace sluice::kernels::cuda {
namespace {

using testing::OnGpu;

// How the codes of a case are drawn.
enum class Draw {
  kFromHistogram,  // as the codebook expects: about its entropy per code
  kUniform,        // every symbol alike: many long codes under a skewed codebook
};

struct Case {
  std::string name;
  int head_dim;
  int unit;  // K group along tokens = the unit
  std::vector<uint64_t> histogram;
  Draw draw;
};

std::vector<uint64_t> Geometric(int symbols, double ratio) {
  std::vector<uint64_t> h(symbols);
  double x = 1e9;
  for (uint64_t& c : h) {
    c = static_cast<uint64_t>(x) + 1;
    x *= ratio;
  }
  return h;
}

std::vector<uint64_t> RandomHistogram(std::mt19937_64& rng, int symbols) {
  std::vector<uint64_t> h(symbols);
  for (uint64_t& c : h) c = rng() % 1000 + 1;
  return h;
}

std::vector<Case> Cases(std::mt19937_64& rng) {
  return {
      {"laplace-like 15 levels", 128, 32, Geometric(15, 0.55), Draw::kFromHistogram},
      {"256 levels, 12-bit codes", 128, 32, Geometric(256, 0.7), Draw::kFromHistogram},
      {"256 levels against a skewed codebook", 64, 64, Geometric(256, 0.8), Draw::kUniform},
      {"random 200-symbol histogram", 64, 16, RandomHistogram(rng, 200), Draw::kFromHistogram},
      {"two symbols, one-bit codes", 128, 32, {1000, 1}, Draw::kFromHistogram},
      {"7 levels, uniform", 96, 32, std::vector<uint64_t>(7, 1), Draw::kUniform},
  };
}

TEST(HuffmanUnit, BlockDecodeMatchesTheReferenceDecoder) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  for (const Case& c : Cases(rng)) {
    SCOPED_TRACE(c.name);
    const KvTierFormat format{
        .k = {.codec = KvCodec::kInt,
              .bits = 8,
              .grouping = KvGrouping::kPerChannel,
              .group = c.unit},
        .v = {.codec = KvCodec::kInt, .bits = 8, .grouping = KvGrouping::kPerToken},
        .head_dim = c.head_dim,
        .page_bytes = 16384,
        .huffman_bits = 2.4f};
    absl::StatusOr<KvHuffmanTier> tier = MakeKvHuffmanTier(format);
    ASSERT_TRUE(tier.ok()) << tier.status();
    ASSERT_EQ(tier->layout.unit_tokens, c.unit);
    absl::StatusOr<HuffmanCodebook> kb = BuildHuffmanCodebook(1, c.histogram);
    absl::StatusOr<HuffmanCodebook> vb = BuildHuffmanCodebook(2, c.histogram);
    ASSERT_TRUE(kb.ok() && vb.ok()) << kb.status() << vb.status();
    const KvCodebooks books{.k = &*kb, .v = &*vb};

    // Units of random codes and meta, appended while they fit (at least one).
    const KvPageLayout& ul = tier->unit_layout;
    const int64_t n = int64_t{c.head_dim} * c.unit;  // codes of K, and of V, in a unit
    std::discrete_distribution<int> from_histogram(c.histogram.begin(), c.histogram.end());
    std::uniform_int_distribution<int> uniform(0, static_cast<int>(c.histogram.size()) - 1);
    std::vector<uint8_t> page(format.page_bytes, 0);
    int units = 0;
    for (;; ++units) {
      std::vector<uint8_t> unit(ul.bytes_used);
      for (uint8_t& b : unit) b = static_cast<uint8_t>(rng());
      for (int64_t i = 0; i < n; ++i) {
        for (int32_t at : {ul.k_codes, ul.v_codes}) {
          unit[at + i] =
              static_cast<uint8_t>(c.draw == Draw::kUniform ? uniform(rng) : from_histogram(rng));
        }
      }
      absl::StatusOr<bool> fit = KvAppendUnit(*tier, books, unit.data(), units, page.data());
      ASSERT_TRUE(fit.ok()) << fit.status();
      if (!*fit) break;
    }
    ASSERT_GT(units, 0);

    HuffmanTierDesc desc{.format = tier->format,
                         .layout = tier->layout,
                         .unit_format = tier->unit_format,
                         .unit_layout = ul};
    const DeviceArray<uint8_t> dpage = OnGpu(page);
    const DeviceArray<uint16_t> ktable = OnGpu(kb->decode_table);
    const DeviceArray<uint16_t> vtable = OnGpu(vb->decode_table);
    const DeviceArray<uint8_t> dout =
        OnGpu(std::vector<uint8_t>(static_cast<size_t>(units) * ul.bytes_used, 0));
    std::vector<HuffmanDecodeJob> jobs(units);
    for (int u = 0; u < units; ++u) {
      jobs[u] = {.page = dpage.data(), .unit = u, .out = dout.data() + u * ul.bytes_used};
    }
    const DeviceArray<HuffmanDecodeJob> djobs = OnGpu(jobs);
    ASSERT_EQ(LaunchHuffmanDecode(desc, ktable.data(), kb->max_length, vtable.data(),
                                  vb->max_length, djobs.data(), units, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got(static_cast<size_t>(units) * ul.bytes_used);
    ASSERT_EQ(cudaMemcpy(got.data(), dout.data(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);

    for (int u = 0; u < units; ++u) {
      std::vector<uint8_t> want(ul.bytes_used, 0);
      KvDecodeUnitReference(*tier, books, page.data(), u, want.data());
      const std::vector<uint8_t> unit_got(got.begin() + u * ul.bytes_used,
                                          got.begin() + (u + 1) * ul.bytes_used);
      int first_bad = -1;
      for (int i = 0; i < ul.bytes_used && first_bad < 0; ++i) {
        if (unit_got[i] != want[i]) first_bad = i;
      }
      EXPECT_EQ(first_bad, -1) << "unit " << u << " of " << units << ": byte " << first_bad
                               << " is " << int{unit_got[first_bad]} << ", want "
                               << int{want[first_bad]};
    }
  }
}

}  // namespace
}  // namespace sluice::kernels::cuda
