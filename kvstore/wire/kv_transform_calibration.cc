#include "kvstore/wire/kv_transform_calibration.h"

#include <cblas.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/ref/rope.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/cache/recording_kv_cache.h"
#include "kvstore/kv_preset.h"

extern "C" {
// LAPACK (OpenBLAS): solves A X = B for symmetric positive definite A (Cholesky).
void dposv_(const char* uplo, const int* n, const int* nrhs, double* a, const int* lda, double* b,
            const int* ldb, int* info);
}

namespace sluice::kvstore {
namespace {

// W and bias minimising sum |y - bias - W x|^2 over the rows (ridge 1e-3 of the mean variance).
absl::StatusOr<std::vector<float>> FitPredictor(const float* x, const float* y, int64_t n,
                                                int64_t dim) {
  std::vector<double> mx(dim, 0.0), my(dim, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < dim; ++j) {
      mx[j] += x[t * dim + j];
      my[j] += y[t * dim + j];
    }
  }
  for (int64_t j = 0; j < dim; ++j) {
    mx[j] /= static_cast<double>(n);
    my[j] /= static_cast<double>(n);
  }
  // a = Cxx; b's column j = Cxy[:, j] (column-major): the solution's column j is W's row j.
  // With X and Y the centred rows [n, dim] (row-major): a = X^T X, and b, read column-major,
  // = X^T Y, i.e. row-major b = Y^T X (OpenBLAS, in double).
  std::vector<double> xc(static_cast<size_t>(n) * dim), yc(static_cast<size_t>(n) * dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < dim; ++j) {
      xc[t * dim + j] = x[t * dim + j] - mx[j];
      yc[t * dim + j] = y[t * dim + j] - my[j];
    }
  }
  std::vector<double> a(dim * dim, 0.0), b(dim * dim, 0.0);
  const int rows_n = static_cast<int>(n), d = static_cast<int>(dim);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, rows_n, 1.0, xc.data(), d, xc.data(),
              d, 0.0, a.data(), d);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, rows_n, 1.0, yc.data(), d, xc.data(),
              d, 0.0, b.data(), d);
  double trace = 0;
  for (int64_t i = 0; i < dim; ++i) trace += a[i * dim + i];
  for (int64_t i = 0; i < dim; ++i) a[i * dim + i] += 1e-3 * trace / dim + 1e-12;
  int info = 0, nd = static_cast<int>(dim);
  dposv_("U", &nd, &nd, a.data(), &nd, b.data(), &nd, &info);
  if (info != 0) return absl::InternalError(absl::StrFormat("dposv: info %d", info));
  std::vector<float> out(dim * dim + dim);
  for (int64_t j = 0; j < dim; ++j) {
    double bias = my[j];
    for (int64_t i = 0; i < dim; ++i) {
      const double w = b[j * dim + i];
      out[j * dim + i] = static_cast<float>(w);
      bias -= w * mx[i];
    }
    out[dim * dim + j] = static_cast<float>(bias);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<double>> KvValueMetric(const model::GgufFile& gguf,
                                                  const model::LlamaConfig& c, int layer) {
  const std::string name = absl::StrFormat("blk.%d.attn_output.weight", layer);
  const model::GgufTensor* t = gguf.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("the model has no ", name));
  SLUICE_ASSIGN_OR_RETURN(const std::vector<float> w, gguf.ToFloat(*t));
  const int64_t q_dim = c.heads * c.head_dim, dim = c.kv_heads * c.head_dim;
  if (static_cast<int64_t>(w.size()) != q_dim * c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has %d values, not %d x %d", name, w.size(), c.hidden, q_dim));
  }
  const int64_t group = c.heads / c.kv_heads, d = c.head_dim;
  std::vector<double> m(dim * dim, 0.0);
  for (int64_t r = 0; r < c.hidden; ++r) {
    const float* row = w.data() + r * q_dim;
    for (int64_t g = 0; g < c.heads; ++g) {
      const int64_t h = g / group;
      const float* x = row + g * d;
      for (int64_t a = 0; a < d; ++a) {
        double* out = m.data() + (h * d + a) * dim + h * d;
        for (int64_t b = 0; b < d; ++b) out[b] += static_cast<double>(x[a]) * x[b];
      }
    }
  }
  return m;
}

std::vector<double> KvKeyMetric(const model::LlamaConfig& c, absl::Span<const float> queries,
                                int64_t n) {
  constexpr int64_t kQueries = 512, kKeys = 8;
  const int64_t d = c.head_dim, group = c.heads / c.kv_heads, dim = c.kv_heads * d;
  const int64_t row = c.heads * d;
  // The query positions m and key positions p sampled: u = R(-p) q_m for every query head.
  const int64_t picks = std::min(n, kQueries);
  std::vector<float> u(static_cast<size_t>(picks * kKeys) * row);
  std::vector<int32_t> positions(picks * kKeys);
  for (int64_t j = 0; j < picks; ++j) {
    const int64_t m = j * n / picks;
    for (int64_t k = 0; k < kKeys; ++k) {
      const int64_t s = j * kKeys + k;
      positions[s] = -static_cast<int32_t>((m * (2 * k + 1)) / (2 * kKeys));
      std::copy_n(queries.data() + m * row, row, u.data() + s * row);
    }
  }
  kernels::ref::Rope({.x = u.data(),
                      .positions = positions.data(),
                      .tokens = picks * kKeys,
                      .heads = c.heads,
                      .head_dim = d,
                      .rope_dim = c.rope_dim,
                      .theta_base = c.rope_theta,
                      .neox = false});
  // Per kv-head: the mean outer product of its query heads' rows (OpenBLAS, in double).
  std::vector<double> metric(static_cast<size_t>(dim) * dim, 0.0);
  const int64_t rows = picks * kKeys * group;
  std::vector<double> a(static_cast<size_t>(rows) * d), block(static_cast<size_t>(d) * d);
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    for (int64_t s = 0; s < picks * kKeys; ++s) {
      for (int64_t g = 0; g < group; ++g) {
        const float* x = u.data() + s * row + (h * group + g) * d;
        std::copy_n(x, d, a.data() + (s * group + g) * d);
      }
    }
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, static_cast<int>(d), static_cast<int>(rows),
                1.0 / static_cast<double>(picks * kKeys), a.data(), static_cast<int>(d), 0.0,
                block.data(), static_cast<int>(d));
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        metric[(h * d + i) * dim + h * d + j] = i >= j ? block[i * d + j] : block[j * d + i];
      }
    }
  }
  return metric;
}

absl::StatusOr<std::unique_ptr<RecordingKvCache>> RecordFullPrecisionKv(
    model::LlamaModel& llama, kernels::Backend& backend, absl::Span<const int32_t> tokens,
    bool queries) {
  const model::LlamaConfig& c = llama.config();
  if (backend.memory_space() != kernels::MemorySpace::kHost) {
    return absl::UnimplementedError(
        "recording KV reads it on the host: use a host-memory backend (cpu)");
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n > c.context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a recorded pass takes 1 to %d tokens (the model's context), not %d", c.context_length, n));
  }
  SLUICE_ASSIGN_OR_RETURN(KvPreset fp16, FindKvPreset("fp16", static_cast<int32_t>(c.head_dim)));
  fp16.residual = static_cast<int32_t>(n);  // every token stays in fp32
  SLUICE_ASSIGN_OR_RETURN(auto inner, PagedKvCache::Create({.layers = c.layers,
                                                            .heads = c.heads,
                                                            .kv_heads = c.kv_heads,
                                                            .head_dim = c.head_dim,
                                                            .preset = fp16,
                                                            .pages = 1},
                                                           backend));
  auto rec = std::make_unique<RecordingKvCache>(std::move(inner), c.layers, c.kv_heads * c.head_dim,
                                                queries ? c.heads * c.head_dim : 0);
  SLUICE_RETURN_IF_ERROR(rec->AddSequence(0, n));
  std::vector<float> logits(c.vocab);
  SLUICE_RETURN_IF_ERROR(llama.Forward({{0, tokens}}, *rec, logits.data()));
  return rec;
}

void RotateKeyRows(const model::LlamaConfig& c, float* rows, int64_t tokens, int64_t first,
                   bool inverse) {
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    positions[t] = static_cast<int32_t>(inverse ? -(first + t) : first + t);
  }
  // The model's RoPE (model/llama.cc): interleaved pairs; a negated position turns back.
  kernels::ref::Rope({.x = rows,
                      .positions = positions.data(),
                      .tokens = tokens,
                      .heads = c.kv_heads,
                      .head_dim = c.head_dim,
                      .rope_dim = c.rope_dim,
                      .theta_base = c.rope_theta,
                      .neox = false});
}

void PredictKvRows(absl::Span<const float> predict, const float* prev, int64_t n, int64_t dim,
                   float* out) {
  const float* w = predict.data();
  const float* bias = w + dim * dim;
  for (int64_t t = 0; t < n; ++t) std::copy(bias, bias + dim, out + t * dim);
  // out += prev W^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(dim),
              static_cast<int>(dim), 1.f, prev, static_cast<int>(dim), w, static_cast<int>(dim),
              1.f, out, static_cast<int>(dim));
}

absl::StatusOr<KvTransformCalibration> CalibrateKvTransform(model::LlamaModel& llama,
                                                            kernels::Backend& backend,
                                                            const model::GgufFile& gguf,
                                                            const std::vector<int32_t>& tokens,
                                                            bool cross_layer) {
  const model::LlamaConfig& c = llama.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration takes at least 2 tokens, not %d", n));
  }
  SLUICE_ASSIGN_OR_RETURN(const std::unique_ptr<RecordingKvCache> rec,
                          RecordFullPrecisionKv(llama, backend, tokens, /*queries=*/true));
  const int64_t dim = c.kv_heads * c.head_dim;
  KvTransformCalibration out;
  out.key_metric = true;
  std::vector<float> prev_k;
  for (int layer = 0; layer < c.layers; ++layer) {
    std::vector<float> k = rec->k(layer);
    RotateKeyRows(c, k.data(), n, 0, /*inverse=*/true);
    std::vector<float> v = rec->v(layer);
    std::vector<float> kp, vp;
    if (cross_layer && layer > 0) {
      SLUICE_ASSIGN_OR_RETURN(kp, FitPredictor(prev_k.data(), k.data(), n, dim));
      SLUICE_ASSIGN_OR_RETURN(vp, FitPredictor(rec->v(layer - 1).data(), v.data(), n, dim));
    }
    std::vector<float> this_k = k;
    if (!kp.empty()) {
      std::vector<float> pred(n * dim);
      PredictKvRows(kp, prev_k.data(), n, dim, pred.data());
      for (int64_t i = 0; i < n * dim; ++i) k[i] -= pred[i];
      PredictKvRows(vp, rec->v(layer - 1).data(), n, dim, pred.data());
      for (int64_t i = 0; i < n * dim; ++i) v[i] -= pred[i];
    }
    prev_k = std::move(this_k);
    const std::vector<double> key_metric = KvKeyMetric(c, rec->q(layer), n);
    SLUICE_ASSIGN_OR_RETURN(
        KvTransformBasis kb,
        FitKvTransformBasis(k.data(), n, static_cast<int32_t>(dim), key_metric));
    SLUICE_ASSIGN_OR_RETURN(const std::vector<double> metric, KvValueMetric(gguf, c, layer));
    SLUICE_ASSIGN_OR_RETURN(KvTransformBasis vb,
                            FitKvTransformBasis(v.data(), n, static_cast<int32_t>(dim), metric));
    out.k.push_back(std::move(kb));
    out.v.push_back(std::move(vb));
    out.k_predict.push_back(std::move(kp));
    out.v_predict.push_back(std::move(vp));
  }
  return out;
}

}  // namespace sluice::kvstore
