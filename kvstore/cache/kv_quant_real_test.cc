// Every KV page codec on real SmolLM2 keys and values: the model reads 256 tokens of English
// text, every row it writes is recorded, and each (layer, kv-head) goes through the cpu
// quantizer and back. Each value must stay within its codec's bound, the cpu pages must equal
// ref's byte for byte, and the overall error must rank the codecs as their bit widths say.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kv_format.h"
#include "kernels/ref/kv_quant.h"
#include "kernels/test_util/kv_coded_pages.h"
#include "kernels/test_util/kv_round_trip.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/cache/recording_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"

namespace sluice::kvstore {
namespace {

using kernels::HostView;
using kernels::KvCodec;
using kernels::KvGrouping;
using kernels::KvQuantSpec;
using kernels::KvTierFormat;

KvQuantSpec Int(int bits, KvGrouping grouping, int group, int block_channels = 0) {
  return {.codec = KvCodec::kInt,
          .bits = bits,
          .grouping = grouping,
          .group = group,
          .block_channels = block_channels};
}

TEST(KvQuantRealKv, SmolLM2KeysAndValuesStayWithinBounds) {
  auto gguf = model::GgufFile::Open(model::DefaultModelPath());
  if (gguf.status().code() == absl::StatusCode::kNotFound) {
    GTEST_SKIP() << "model not fetched (./sluice fetch-model): " << gguf.status();
  }
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto vocab = model::VocabFromGguf(**gguf);
  ASSERT_TRUE(vocab.ok());
  auto tokenizer = model::Tokenizer::Create(std::move(*vocab));
  ASSERT_TRUE(tokenizer.ok());
  auto cpu = kernels::CpuBackend::Create({.threads = 1});
  ASSERT_TRUE(cpu.ok());
  auto llama = model::LlamaModel::Load(**gguf, **cpu);
  ASSERT_TRUE(llama.ok()) << llama.status();
  const model::LlamaConfig& c = (*llama)->config();

  std::ifstream in("/usr/share/common-licenses/GPL-3");  // Debian's base-files ships it
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  auto ids = (*tokenizer)->Encode(text.str(), false);
  ASSERT_TRUE(ids.ok());
  constexpr int64_t kTokens = 256;
  ASSERT_GE(static_cast<int64_t>(ids->size()), kTokens);
  ids->resize(kTokens);

  auto fp16 = FindKvPreset("fp16", static_cast<int32_t>(c.head_dim));
  ASSERT_TRUE(fp16.ok());
  fp16->residual = kTokens;  // the recording run keeps everything in fp32
  auto inner = PagedKvCache::Create({.layers = c.layers,
                                     .heads = c.heads,
                                     .kv_heads = c.kv_heads,
                                     .head_dim = c.head_dim,
                                     .preset = *fp16,
                                     .pages = 1},
                                    **cpu);
  ASSERT_TRUE(inner.ok());
  RecordingKvCache rec(std::move(*inner), c.layers, c.kv_heads * c.head_dim);
  ASSERT_TRUE(rec.AddSequence(0, kTokens).ok());
  std::vector<float> logits(c.vocab);
  ASSERT_TRUE((*llama)->Forward({{0, *ids}}, rec, logits.data()).ok());

  using G = KvGrouping;
  const int32_t d = static_cast<int32_t>(c.head_dim);
  struct Case {
    KvQuantSpec spec;
    double max_rel_rms;  // sqrt(mean err^2 / mean x^2) over all layers and heads
  };
  const Case cases[] = {
      {{}, 1e-3},  // fp16
      {{.codec = KvCodec::kFp8, .bits = 8, .grouping = G::kPerToken, .group = 32}, 0.05},
      {Int(8, G::kPerToken, 0), 0.02},
      {Int(4, G::kPerToken, 32), 0.2},
      {Int(4, G::kPerChannel, 32), 0.2},
      {Int(2, G::kPerChannel, 32), 0.6},
      {Int(2, G::kPerToken, 32), 0.8},
      {Int(4, G::kBlock, 64, 16), 0.3},
  };
  for (const Case& cs : cases) {
    // K and V both in this spec where it is valid for V (per-token); K only otherwise.
    const KvTierFormat f{.k = cs.spec,
                         .v = cs.spec.grouping == G::kPerToken ? cs.spec : KvQuantSpec{},
                         .head_dim = d};
    auto layout = kernels::ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    SCOPED_TRACE(kernels::KvTierFormatName(f));
    // Pages of whole token groups, as the cache fills them.
    const int64_t per_page = layout->tokens;
    double err2[2] = {0, 0}, x2[2] = {0, 0};
    for (int layer = 0; layer < c.layers; ++layer) {
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        for (int64_t t0 = 0; t0 + layout->token_group <= kTokens; t0 += per_page) {
          const int64_t n =
              std::min(per_page, (kTokens - t0) / layout->token_group * layout->token_group);
          const int64_t stride = c.kv_heads * d;
          const int64_t span = (n - 1) * stride + d;
          const kernels::BufferView<const float> k =
              HostView(rec.k(layer).data() + t0 * stride + h * d, span);
          const kernels::BufferView<const float> v =
              HostView(rec.v(layer).data() + t0 * stride + h * d, span);
          std::vector<uint8_t> page(f.page_bytes, 0), want(f.page_bytes, 0);
          kernels::KvQuantizeParams p{.k = k,
                                      .v = v,
                                      .stride = stride,
                                      .tokens = n,
                                      .format = f,
                                      .layout = *layout,
                                      .page = HostView(page)};
          ASSERT_TRUE((*cpu)->KvQuantize(p).ok());
          p.page = HostView(want);
          kernels::ref::KvQuantize(p);
          ASSERT_EQ(page, want) << "layer " << layer << " head " << h << " token " << t0;
          std::vector<float> rk(n * d), rv(n * d), xk(n * d), xv(n * d);
          ASSERT_TRUE((*cpu)
                          ->KvDequantize({.page = HostView(page),
                                          .format = f,
                                          .layout = *layout,
                                          .slot = 0,
                                          .tokens = n,
                                          .k = HostView(rk),
                                          .v = HostView(rv)})
                          .ok());
          for (int64_t t = 0; t < n; ++t) {
            for (int j = 0; j < d; ++j) {
              xk[t * d + j] = k.data[t * stride + j];
              xv[t * d + j] = v.data[t * stride + j];
            }
          }
          ASSERT_TRUE(kernels::testing::RoundTripWithinBound(f.k, d, xk.data(), rk.data(), n))
              << "k of layer " << layer << " head " << h;
          ASSERT_TRUE(kernels::testing::RoundTripWithinBound(f.v, d, xv.data(), rv.data(), n))
              << "v of layer " << layer << " head " << h;
          for (int64_t i = 0; i < n * d; ++i) {
            err2[0] += (rk[i] - xk[i]) * double(rk[i] - xk[i]);
            err2[1] += (rv[i] - xv[i]) * double(rv[i] - xv[i]);
            x2[0] += xk[i] * double(xk[i]);
            x2[1] += xv[i] * double(xv[i]);
          }
        }
      }
    }
    const double k_rel = std::sqrt(err2[0] / x2[0]), v_rel = std::sqrt(err2[1] / x2[1]);
    RecordProperty(kernels::KvTierFormatName(f) + " k_rel_rms", std::to_string(k_rel));
    EXPECT_LT(k_rel, cs.max_rel_rms) << "k";
    if (f.v == cs.spec) {
      EXPECT_LT(v_rel, cs.max_rel_rms) << "v";
    }
  }

  // The Huffman-coded presets: per (layer, kv-head), codebooks from the first half of the tokens
  // (the "prefill"), then every token into Huffman-coded pages by the cpu backend. The
  // table-driven decoder must give what the bit-at-a-time reference gives, every value must stay
  // within half a step, and the codes must take fewer bits than the fixed width their levels
  // need. `same_as`: a fixed-width preset the values must equal exactly (the same grid).
  auto coded = [&](const std::string& name, const KvTierFormat& f, double max_k_bits,
                   double max_v_bits, const char* same_as) {
    SCOPED_TRACE(name);
    auto layout = kernels::ComputePageLayout(f);
    ASSERT_TRUE(layout.ok());
    uint64_t k_bits = 0, v_bits = 0, values = 0;
    for (int layer = 0; layer < c.layers; ++layer) {
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        const int64_t stride = c.kv_heads * d;
        std::vector<float> xk(kTokens * d), xv(kTokens * d);
        for (int64_t t = 0; t < kTokens; ++t) {
          for (int j = 0; j < d; ++j) {
            xk[t * d + j] = rec.k(layer)[t * stride + h * d + j];
            xv[t * d + j] = rec.v(layer)[t * stride + h * d + j];
          }
        }
        auto books = kernels::testing::CodebooksFromRows(f, xk.data(), xv.data(), kTokens / 2);
        ASSERT_TRUE(books.ok()) << books.status();
        const kernels::KvCodebooks view = (*books)->view();
        for (int64_t t0 = 0; t0 < kTokens;) {
          std::vector<uint8_t> page(f.page_bytes, 0);
          int64_t n = 0;
          ASSERT_TRUE((*cpu)
                          ->KvQuantize({.k = HostView(xk).subview(t0 * d),
                                        .v = HostView(xv).subview(t0 * d),
                                        .stride = d,
                                        .tokens = std::min<int64_t>(layout->tokens, kTokens - t0),
                                        .format = f,
                                        .layout = *layout,
                                        .page = HostView(page),
                                        .codebooks = view,
                                        .tokens_written = &n})
                          .ok());
          ASSERT_GT(n, 0);
          std::vector<float> rk(n * d), rv(n * d), wk(n * d), wv(n * d);
          kernels::KvDequantizeParams dq{.page = HostView(page),
                                         .format = f,
                                         .layout = *layout,
                                         .tokens = n,
                                         .k = HostView(rk),
                                         .v = HostView(rv),
                                         .codebooks = view};
          ASSERT_TRUE((*cpu)->KvDequantize(dq).ok());
          dq.k = HostView(wk);
          dq.v = HostView(wv);
          ASSERT_TRUE(kernels::ref::KvDequantizeAny(dq).ok());
          ASSERT_EQ(rk, wk) << "layer " << layer << " head " << h;
          ASSERT_EQ(rv, wv) << "layer " << layer << " head " << h;
          if (same_as != nullptr) {
            // The fixed-width preset's page of the same rows (n is a multiple of its groups).
            auto fixed = FindKvPreset(same_as, d);
            ASSERT_TRUE(fixed.ok());
            auto fl = kernels::ComputePageLayout(fixed->high);
            ASSERT_TRUE(fl.ok());
            std::vector<uint8_t> fp(fixed->high.page_bytes, 0);
            std::vector<float> fk(n * d), fv(n * d);
            for (int64_t done = 0; done < n; done += fl->tokens) {
              const int64_t m = std::min<int64_t>(fl->tokens, n - done);
              ASSERT_TRUE((*cpu)
                              ->KvQuantize({.k = HostView(xk).subview((t0 + done) * d),
                                            .v = HostView(xv).subview((t0 + done) * d),
                                            .stride = d,
                                            .tokens = m,
                                            .format = fixed->high,
                                            .layout = *fl,
                                            .page = HostView(fp)})
                              .ok());
              ASSERT_TRUE((*cpu)
                              ->KvDequantize({.page = HostView(fp),
                                              .format = fixed->high,
                                              .layout = *fl,
                                              .tokens = m,
                                              .k = HostView(fk).subview(done * d),
                                              .v = HostView(fv).subview(done * d)})
                              .ok());
            }
            ASSERT_EQ(rk, fk) << same_as << " keys, layer " << layer << " head " << h;
            ASSERT_EQ(rv, fv) << same_as << " values, layer " << layer << " head " << h;
          }
          ASSERT_TRUE(
              kernels::testing::RoundTripWithinBound(f.k, d, xk.data() + t0 * d, rk.data(), n))
              << "k of layer " << layer << " head " << h;
          ASSERT_TRUE(
              kernels::testing::RoundTripWithinBound(f.v, d, xv.data() + t0 * d, rv.data(), n))
              << "v of layer " << layer << " head " << h;
          // Bits of each unit's K streams (0..3) and V streams (4..7), from the stream offsets.
          const uint32_t* streams =
              reinterpret_cast<const uint32_t*>(page.data() + layout->streams);
          for (int64_t u = 0; u < n / layout->unit_tokens; ++u) {
            k_bits += streams[u * 8 + 4] - streams[u * 8];
            v_bits += streams[u * 8 + 8] - streams[u * 8 + 4];
          }
          values += n * d;
          t0 += n;
        }
      }
    }
    const double kb = static_cast<double>(k_bits) / values,
                 vb = static_cast<double>(v_bits) / values;
    RecordProperty(std::string(name) + " k_bits_per_value", std::to_string(kb));
    RecordProperty(std::string(name) + " v_bits_per_value", std::to_string(vb));
    EXPECT_LT(kb, max_k_bits);
    EXPECT_LT(vb, max_v_bits);
  };
  // kvcomp: log2(5) = 2.32 and log2(7) = 2.81 are the entropies of uniform codes; 3 bits the
  // fixed width. KIVI-4's grid Huffman-coded: 4 bits fixed width.
  auto kvcomp = FindKvPreset("kvcomp", d);
  auto kivi4 = FindKvPreset("kivi4", d);
  ASSERT_TRUE(kvcomp.ok() && kivi4.ok());
  coded("kvcomp", kvcomp->high, 2.6, 2.9, nullptr);
  KvTierFormat kivi4_coded = kivi4->high;  // 8-bit codes with 16 levels, Huffman-coded
  kivi4_coded.k.bits = kivi4_coded.v.bits = 8;
  kivi4_coded.k.levels = kivi4_coded.v.levels = 16;
  kivi4_coded.huffman_bits = 3.8f;
  coded("kivi4_huffman", kivi4_coded, 4.0, 4.0, "kivi4");
}

}  // namespace
}  // namespace sluice::kvstore
