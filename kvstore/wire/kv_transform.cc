#include "kvstore/wire/kv_transform.h"

#include <cblas.h>
#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/ggml_quant.h"
#include "kvstore/wire/byte_io.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/rans.h"

extern "C" {
// LAPACK (OpenBLAS): eigenvalues and eigenvectors of a symmetric matrix, divide and conquer.
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info);
}

namespace sluice::kvstore {
namespace {

constexpr uint32_t kBlockMagic = 0x32544B53;        // "SKT2"
constexpr uint32_t kCalibrationMagic = 0x43544B53;  // "SKTC"
constexpr size_t kBlockHeaderBytes = 20;
// Rows of a block: OpenBLAS takes int dimensions.
constexpr int64_t kMaxBlockRows = (int64_t{1} << 31) - 1;

// The optimal uniform quantizer of a unit Gaussian with 2^b levels (Max, 1960): its step and
// its mean squared error; b = 0 sends the mean (error 1).
constexpr std::array<double, kMaxKvTransformBits + 1> kGaussianStep = {
    0, 1.596, 0.9957, 0.5860, 0.3352, 0.1881, 0.1041, 0.0569, 0.0308};
constexpr std::array<double, kMaxKvTransformBits + 1> kGaussianError = {
    1.0, 0.3634, 0.1188, 0.03744, 0.01154, 0.003490, 0.001035, 0.0003021, 0.00008719};

// InvalidArgument naming the first non-finite value of rows [n, dim].
absl::Status CheckFinite(const float* rows, int64_t n, int32_t dim, const char* what) {
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < dim; ++j) {
      if (!std::isfinite(rows[t * dim + j])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s %d holds a non-finite value at %d", what, t, j));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool HasKvPredictors(const KvTransformCalibration& c) {
  if (c.k.size() < 2 || c.k_predict.size() != c.k.size() || c.v_predict.size() != c.k.size()) {
    return false;
  }
  const size_t want = static_cast<size_t>(c.k[0].dim) * c.k[0].dim + c.k[0].dim;
  for (size_t l = 1; l < c.k.size(); ++l) {
    if (c.k_predict[l].size() != want || c.v_predict[l].size() != want) return false;
  }
  return true;
}

uint32_t KvTransformCalibrationChecksum(const KvTransformCalibration& c) {
  uint32_t crc = 0;
  for (size_t l = 0; l < c.k.size(); ++l) {
    for (const KvTransformBasis* b : {&c.k[l], l < c.v.size() ? &c.v[l] : nullptr}) {
      if (b != nullptr) crc = Crc32c(&b->checksum, sizeof(b->checksum), crc);
    }
  }
  for (const auto* side : {&c.k_predict, &c.v_predict}) {
    for (const std::vector<float>& p : *side) crc = Crc32c(p.data(), p.size() * sizeof(float), crc);
  }
  return crc;
}

namespace {

uint32_t BasisChecksum(const KvTransformBasis& b) {
  uint32_t crc = Crc32c(&b.dim, sizeof(b.dim));
  for (const std::vector<float>* part : {&b.mean, &b.encode, &b.decode, &b.variance}) {
    crc = Crc32c(part->data(), part->size() * sizeof(float), crc);
  }
  return crc;
}

// Eigen-decomposition of the symmetric a [dim, dim] (row-major, overwritten by the eigenvectors:
// eigenvector k in a[k * dim ...]) with eigenvalues w ascending.
absl::Status SymmetricEigen(std::vector<double>& a, std::vector<double>& w, int dim) {
  w.resize(dim);
  int info = 0, lwork = -1, liwork = -1, nd = dim;
  double work_size = 0;
  int iwork_size = 0;
  dsyevd_("V", "U", &nd, a.data(), &nd, w.data(), &work_size, &lwork, &iwork_size, &liwork, &info);
  if (info != 0) return absl::InternalError(absl::StrFormat("dsyevd (size query): info %d", info));
  lwork = static_cast<int>(work_size);
  liwork = iwork_size;
  std::vector<double> work(lwork);
  std::vector<int> iwork(liwork);
  dsyevd_("V", "U", &nd, a.data(), &nd, w.data(), work.data(), &lwork, iwork.data(), &liwork,
          &info);
  if (info != 0) return absl::InternalError(absl::StrFormat("dsyevd: info %d", info));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvTransformBasis> FitKvTransformBasis(const float* rows, int64_t n, int32_t dim,
                                                     absl::Span<const double> metric) {
  if (n < 2 || dim < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a basis needs at least 2 rows of at least 1 value (got %d of %d)", n, dim));
  }
  const size_t dd = static_cast<size_t>(dim) * dim;
  if (!metric.empty() && metric.size() != dd) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a metric for dim %d has %d values, not %d", dim, metric.size(), dd));
  }
  // S = M^1/2 and its inverse (identity without a metric).
  std::vector<double> s(dd, 0.0), s_inv(dd, 0.0);
  if (metric.empty()) {
    for (int32_t i = 0; i < dim; ++i) s[i * dim + i] = s_inv[i * dim + i] = 1.0;
  } else {
    std::vector<double> m(metric.begin(), metric.end()), w;
    for (double x : m) {
      if (!std::isfinite(x))
        return absl::InvalidArgumentError("the metric holds a non-finite value");
    }
    if (absl::Status st = SymmetricEigen(m, w, dim); !st.ok()) return st;
    const double floor = std::max(1e-30, 1e-6 * w[dim - 1]);
    for (int32_t k = 0; k < dim; ++k) {
      const double r = std::sqrt(std::max(w[k], floor));
      const double* e = m.data() + static_cast<size_t>(k) * dim;
      for (int32_t i = 0; i < dim; ++i) {
        for (int32_t j = 0; j < dim; ++j) {
          s[i * dim + j] += r * e[i] * e[j];
          s_inv[i * dim + j] += e[i] * e[j] / r;
        }
      }
    }
  }
  if (absl::Status st = CheckFinite(rows, n, dim, "calibration row"); !st.ok()) return st;
  std::vector<double> mean(dim, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < dim; ++j) {
      const float x = rows[t * dim + j];
      mean[j] += x;
    }
  }
  for (double& m : mean) m /= static_cast<double>(n);
  // Covariance of y = S (x - mean): Y = C S^T, then Y^T Y / (n - 1) (OpenBLAS, in double).
  std::vector<double> centred(static_cast<size_t>(n) * dim), y(static_cast<size_t>(n) * dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < dim; ++j) centred[t * dim + j] = rows[t * dim + j] - mean[j];
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), dim, dim, 1.0,
              centred.data(), dim, s.data(), dim, 0.0, y.data(), dim);
  std::vector<double> cov(dd, 0.0);
  cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, dim, static_cast<int>(n),
              1.0 / static_cast<double>(n - 1), y.data(), dim, 0.0, cov.data(), dim);
  for (int32_t i = 0; i < dim; ++i) {
    for (int32_t j = 0; j < i; ++j) {
      cov[static_cast<size_t>(j) * dim + i] = cov[static_cast<size_t>(i) * dim + j];
    }
  }
  std::vector<double> eig;
  if (absl::Status st = SymmetricEigen(cov, eig, dim); !st.ok()) return st;
  // Ascending eigenvalues: component i is eigenvector dim - 1 - i. encode_i = S u, decode_i =
  // S^-1 u (S symmetric).
  KvTransformBasis b;
  b.dim = dim;
  b.mean.assign(mean.begin(), mean.end());
  b.encode.resize(dd);
  b.decode.resize(dd);
  b.variance.resize(dim);
  for (int32_t i = 0; i < dim; ++i) {
    const double* u = cov.data() + static_cast<size_t>(dim - 1 - i) * dim;
    b.variance[i] = static_cast<float>(std::max(0.0, eig[dim - 1 - i]));
    for (int32_t j = 0; j < dim; ++j) {
      double e = 0, d = 0;
      for (int32_t k = 0; k < dim; ++k) {
        e += s[j * dim + k] * u[k];
        d += s_inv[j * dim + k] * u[k];
      }
      b.encode[static_cast<size_t>(i) * dim + j] = static_cast<float>(e);
      b.decode[static_cast<size_t>(i) * dim + j] = static_cast<float>(d);
    }
  }
  b.checksum = BasisChecksum(b);
  return b;
}

double KvTransformGaussianStep(int bits) {
  return bits >= 1 && bits <= kMaxKvTransformBits ? kGaussianStep[bits] : 0.0;
}

std::vector<uint8_t> AllocateKvTransformBits(absl::Span<const double> variance,
                                             double bits_per_value) {
  const size_t dim = variance.size();
  std::vector<uint8_t> bits(dim, 0);
  int64_t budget = std::llround(bits_per_value * static_cast<double>(dim));
  // Greedy on the error each next bit removes (convex in the bit count, so greedy is optimal).
  using Gain = std::pair<double, size_t>;
  std::priority_queue<Gain> gains;
  const auto gain = [&](size_t i) {
    return variance[i] * (kGaussianError[bits[i]] - kGaussianError[bits[i] + 1]);
  };
  for (size_t i = 0; i < dim; ++i) {
    if (variance[i] > 0) gains.push({gain(i), i});
  }
  while (budget > 0 && !gains.empty()) {
    const size_t i = gains.top().second;
    gains.pop();
    ++bits[i];
    --budget;
    if (bits[i] < kMaxKvTransformBits) gains.push({gain(i), i});
  }
  return bits;
}

namespace {

// Codes are whole steps from the component's block mean: one step for every component of a
// block (entropy-coded uniform quantisation wants equal error everywhere: a component gets as
// many bits as its spread over the step calls for, a fraction of one where it is narrow).
// Codes further than this from the mean are clipped (only a value some million steps out).
constexpr int64_t kMaxCode = int64_t{1} << 20;
// Components are grouped into classes by their spread over the step, half an octave each; a class
// shares a rANS table. Class c holds ratios in [2^((c - kClassOffset) / 2), ...).
constexpr int kClassOffset = 24;
constexpr int kClassCount = 64;
constexpr uint8_t kNotCoded = 0xff;  // a component whose codes are all 0: sent as its mean
constexpr int kMaxShift = kRansScaleBits;
// Tokens the step search codes trial-wise (evenly spaced); the block is coded once at the end.
constexpr int64_t kSearchTokens = 256;

int ClassOf(double spread_over_step) {
  if (!(spread_over_step > 0)) return 0;
  const int c = static_cast<int>(std::floor(2.0 * std::log2(spread_over_step))) + kClassOffset;
  return std::clamp(c, 0, kClassCount - 1);
}

// Low bits of a code sent raw, so that a wide class's table spans about +-6 x 16 symbols:
// where the spread is many steps, its low bits are close to uniform anyway.
int ShiftOf(int cls) {
  const int top_log2 = (cls - kClassOffset + 2) / 2;  // ceil(log2) of the class's largest ratio
  return std::clamp(top_log2 - 4, 0, kMaxShift);
}

// The code of x: (x - mean) / step (as a product with 1 / step) rounded to nearest, clipped.
int32_t CodeOf(float x, float mean, float inv_step) {
  const float r = std::clamp((x - mean) * inv_step, -static_cast<float>(kMaxCode),
                             static_cast<float>(kMaxCode));
  return _mm_cvtss_si32(_mm_set_ss(r));  // the SSE conversion: rounds to nearest, inline
}

// A component's value for code q: its mean plus q steps (the decoder's arithmetic, exactly).
// Codes are rounded to nearest and rebuilt at the middle of their step: a dead zone and
// reconstruction toward the mean (the squared-error optimum for peaked coefficients) were
// measured to cost the attention more than they save (README, The transform-coded wire).
float CodeValue(float mean, float step, int64_t q) { return mean + static_cast<float>(q) * step; }

// rows [n, dim] = mean + coef^T decode, coef component-major [dim, n] (OpenBLAS).
void Reconstruct(const KvTransformBasis& basis, const std::vector<float>& coef, int64_t n,
                 float* rows) {
  const int32_t dim = basis.dim;
  for (int64_t t = 0; t < n; ++t) std::copy(basis.mean.begin(), basis.mean.end(), rows + t * dim);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(n), dim, dim, 1.f,
              coef.data(), static_cast<int>(n), basis.decode.data(), dim, 1.f, rows, dim);
}

// Bits the entropy coder would spend on the tokens [0, n) by `stride` of components
// coef [dim, n] with these means and spreads, at `step`: every class's codes under their own
// counts (the table's cost left out), plus the raw low bits.
double CodedBits(const std::vector<float>& coef, int64_t n, int64_t stride,
                 const std::vector<float>& mean, const std::vector<double>& spread, float step) {
  // Symbols further out than this are rare enough to count at its edge.
  constexpr int kSpan = 512;
  const float inv = 1.f / step;
  std::vector<std::vector<uint32_t>> hist(kClassCount);
  double raw = 0;
  for (size_t i = 0; i < mean.size(); ++i) {
    if (!(spread[i] > 0)) continue;
    const int cls = ClassOf(spread[i] / step), shift = ShiftOf(cls);
    std::vector<uint32_t>& h = hist[cls];
    if (h.empty()) h.assign(kSpan, 0);
    const float* x = coef.data() + i * n;
    for (int64_t t = 0; t < n; t += stride) {
      const int32_t sym = CodeOf(x[t], mean[i], inv) >> shift;
      ++h[std::clamp<int32_t>(sym + kSpan / 2, 0, kSpan - 1)];
      raw += shift;
    }
  }
  double bits = raw;
  for (const std::vector<uint32_t>& h : hist) {
    uint64_t total = 0;
    for (uint32_t c : h) total += c;
    for (uint32_t c : h) {
      if (c > 0) bits -= c * std::log2(static_cast<double>(c) / static_cast<double>(total));
    }
  }
  return bits;
}

// Bits per value a Gaussian model gives components of these spreads at a step of 2^log2_step:
// each its differential entropy over the step, log2(spread / step) + 2.05, or nothing.
double GaussianBits(absl::Span<const double> spread, double log2_step) {
  double bits = 0;
  for (double s : spread) {
    if (s > 0) bits += std::max(0.0, std::log2(s) - log2_step + 2.05);
  }
  return bits / static_cast<double>(spread.size());
}

// The step that spends about `bits_per_value` on the block: a Gaussian model's guess, then
// secant steps on the coded bits of up to kSearchTokens tokens (they fall by about a bit per
// value for each doubling of the step where every component is coded, less at low rates),
// until within half a percent; the closest tried.
float ChooseStep(const std::vector<float>& coef, int64_t n, const std::vector<float>& mean,
                 const std::vector<double>& spread, double bits_per_value) {
  const double dim = static_cast<double>(mean.size());
  double lo = -60, hi = 60;  // log2 of the step: the model's bits fall as it grows
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    (GaussianBits(spread, mid) > bits_per_value ? lo : hi) = mid;
  }
  const double guess = 0.5 * (lo + hi);
  const int64_t stride = std::max<int64_t>(1, n / kSearchTokens);
  const double sampled = dim * static_cast<double>((n + stride - 1) / stride);
  const auto off = [&](double log2_step) {
    return CodedBits(coef, n, stride, mean, spread, static_cast<float>(std::exp2(log2_step))) /
               sampled -
           bits_per_value;
  };
  double x0 = guess, f0 = off(x0), best = x0, best_f = f0;
  double x1 = x0 + std::clamp(f0, -4.0, 4.0);
  for (int it = 0; it < 8 && std::fabs(best_f) > 0.005 * bits_per_value; ++it) {
    const double f1 = off(x1);
    if (std::fabs(f1) < std::fabs(best_f)) {
      best = x1;
      best_f = f1;
    }
    double slope = x1 != x0 ? (f1 - f0) / (x1 - x0) : -1.0;
    if (!(slope < -0.01)) slope = -0.01;  // the bits fall with the step; a flat stretch moves far
    x0 = x1;
    f0 = f1;
    x1 = x0 - std::clamp(f0 / slope, -4.0, 4.0);
  }
  return std::max(static_cast<float>(std::exp2(best)), 1e-30f);
}

}  // namespace

absl::StatusOr<std::string> EncodeKvTransformBlock(const KvTransformBasis& basis, const float* rows,
                                                   int64_t n, double bits_per_value,
                                                   float* reconstructed) {
  const int32_t dim = basis.dim;
  if (n < 1 || n > kMaxBlockRows) {
    return absl::InvalidArgumentError(absl::StrFormat("a block holds 1 to 2^31-1 rows, not %d", n));
  }
  if (dim < 1 || dim > 65535 || basis.mean.size() != static_cast<size_t>(dim) ||
      basis.encode.size() != static_cast<size_t>(dim) * dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a basis of dim %d (1 to 65535) with %d means and %d encoding values", dim,
                        basis.mean.size(), basis.encode.size()));
  }
  if (!(bits_per_value > 0 && bits_per_value <= kMaxKvTransformBits)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bits per value %g outside (0, %d]", bits_per_value, kMaxKvTransformBits));
  }
  // Coefficients, component-major: coef = encode (rows - mean)^T, [dim, n] (OpenBLAS).
  if (absl::Status st = CheckFinite(rows, n, dim, "row"); !st.ok()) return st;
  std::vector<float> centred(static_cast<size_t>(n) * dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < dim; ++j) {
      centred[t * dim + j] = rows[t * dim + j] - basis.mean[j];
    }
  }
  std::vector<float> coef(static_cast<size_t>(dim) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, dim, static_cast<int>(n), dim, 1.f,
              basis.encode.data(), dim, centred.data(), dim, 0.f, coef.data(), static_cast<int>(n));
  // The block's own means (as the header carries them) and spreads decide the step.
  std::vector<float> mean(dim);
  std::vector<double> spread(dim);
  for (int32_t i = 0; i < dim; ++i) {
    const float* c = coef.data() + static_cast<size_t>(i) * n;
    double m = 0, v = 0;
    for (int64_t t = 0; t < n; ++t) m += c[t];
    m /= static_cast<double>(n);
    for (int64_t t = 0; t < n; ++t) v += (c[t] - m) * (c[t] - m);
    spread[i] = std::sqrt(v / static_cast<double>(n));
    mean[i] = kernels::Fp16ToFloat(kernels::FloatToFp16(static_cast<float>(m)));
  }
  const float step = ChooseStep(coef, n, mean, spread, bits_per_value);
  // Every code; a component whose codes are all 0 is sent as its mean.
  std::vector<int32_t> codes(static_cast<size_t>(dim) * n);
  const float inv_step = 1.f / step;
  std::vector<int> cls(dim, -1);
  std::vector<int32_t> lowest(dim, 0), highest(dim, 0);  // each component's code range
  for (int32_t i = 0; i < dim; ++i) {
    const float* x = coef.data() + static_cast<size_t>(i) * n;
    int32_t* q = codes.data() + static_cast<size_t>(i) * n;
    for (int64_t t = 0; t < n; ++t) {
      q[t] = CodeOf(x[t], mean[i], inv_step);
      lowest[i] = std::min(lowest[i], q[t]);
      highest[i] = std::max(highest[i], q[t]);
    }
    if (lowest[i] != 0 || highest[i] != 0) cls[i] = ClassOf(spread[i] / step);
  }
  // Per class: its shift (more where a stray code would stretch the table past its symbols) and
  // its table.
  struct Class {
    int shift = 0;
    int64_t lo = 0, hi = 0;
    RansTable table;
    uint8_t index = 0;
  };
  std::map<int, Class> classes;
  for (int32_t i = 0; i < dim; ++i) {
    if (cls[i] >= 0) classes[cls[i]].shift = ShiftOf(cls[i]);
  }
  for (auto& [id, c] : classes) {
    // The shift is monotone, so the class's symbols span its members' shifted code ranges.
    for (;; ++c.shift) {
      c.lo = INT64_MAX;
      c.hi = INT64_MIN;
      for (int32_t i = 0; i < dim; ++i) {
        if (cls[i] != id) continue;
        c.lo = std::min<int64_t>(c.lo, lowest[i] >> c.shift);
        c.hi = std::max<int64_t>(c.hi, highest[i] >> c.shift);
      }
      if (c.hi - c.lo < kRansMaxSymbols) break;
    }
    std::vector<uint64_t> counts(c.hi - c.lo + 1, 0);
    for (int32_t i = 0; i < dim; ++i) {
      if (cls[i] != id) continue;
      for (int64_t t = 0; t < n; ++t)
        ++counts[(codes[static_cast<size_t>(i) * n + t] >> c.shift) - c.lo];
    }
    SLUICE_ASSIGN_OR_RETURN(c.table, RansTableFromCounts(static_cast<int32_t>(c.lo), counts));
  }
  std::string out;
  PutU32(out, kBlockMagic);
  PutU32(out, basis.checksum);
  PutU32(out, static_cast<uint32_t>(n));
  PutU16(out, static_cast<uint16_t>(dim));
  PutU8(out, static_cast<uint8_t>(classes.size()));
  PutU8(out, 0);
  out.append(reinterpret_cast<const char*>(&step), 4);
  uint8_t next = 0;
  for (auto& [id, c] : classes) c.index = next++;
  for (int32_t i = 0; i < dim; ++i) {
    PutU8(out, cls[i] < 0 ? kNotCoded : classes[cls[i]].index);
    PutU16(out, kernels::FloatToFp16(mean[i]));
  }
  for (const auto& [id, c] : classes) {
    PutU8(out, static_cast<uint8_t>(c.shift));
    AppendRansTable(c.table, out);
  }
  // The codes, component after component, each token's high part then its raw low bits; the
  // encoder takes them in reverse.
  RansEncoder enc;
  for (int32_t i = dim - 1; i >= 0; --i) {
    if (cls[i] < 0) continue;
    const Class& c = classes[cls[i]];
    const int32_t* q = codes.data() + static_cast<size_t>(i) * n;
    for (int64_t t = n - 1; t >= 0; --t) {
      const int32_t sym = q[t] >> c.shift;
      if (c.shift > 0) enc.PutBits(static_cast<uint32_t>(q[t] - (sym << c.shift)), c.shift);
      enc.Put(c.table, static_cast<int32_t>(sym));
    }
  }
  const std::string stream = enc.Finish();
  PutU32(out, static_cast<uint32_t>(stream.size()));
  out += stream;
  if (reconstructed != nullptr) {
    for (int32_t i = 0; i < dim; ++i) {
      float* x = coef.data() + static_cast<size_t>(i) * n;
      const int32_t* q = codes.data() + static_cast<size_t>(i) * n;
      if (cls[i] < 0) {
        std::fill_n(x, n, mean[i]);
        continue;
      }
      for (int64_t t = 0; t < n; ++t) x[t] = CodeValue(mean[i], step, q[t]);
    }
    Reconstruct(basis, coef, n, reconstructed);
  }
  return out;
}

namespace {

struct BlockHeader {
  uint32_t checksum = 0, tokens = 0;
  uint16_t dim = 0;
  uint8_t classes = 0;
  float step = 0;
};

absl::StatusOr<BlockHeader> ReadHeader(ByteReader& r) {
  uint32_t magic = 0;
  BlockHeader h;
  uint8_t reserved = 0;
  if (!r.Take(&magic, 4) || !r.Take(&h.checksum, 4) || !r.Take(&h.tokens, 4) ||
      !r.Take(&h.dim, 2) || !r.Take(&h.classes, 1) || !r.Take(&reserved, 1) ||
      !r.Take(&h.step, 4)) {
    return absl::DataLossError(absl::StrFormat(
        "transform block: %d bytes, shorter than its %d-byte header", r.left(), kBlockHeaderBytes));
  }
  if (magic != kBlockMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: magic 0x%08x is not \"SKT2\"", magic));
  }
  if (h.tokens == 0 || h.tokens > kMaxBlockRows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: tokens %d outside 1 to 2^31-1", h.tokens));
  }
  if (h.dim == 0) return absl::InvalidArgumentError("transform block: dim is 0");
  if (reserved != 0) return absl::InvalidArgumentError("transform block: reserved byte not 0");
  if (!(h.step > 0 && std::isfinite(h.step))) {
    return absl::InvalidArgumentError(absl::StrFormat("transform block: step %g", h.step));
  }
  return h;
}

}  // namespace

absl::StatusOr<int64_t> KvTransformBlockTokens(std::string_view block) {
  ByteReader r(block);
  auto h = ReadHeader(r);
  if (!h.ok()) return h.status();
  return h->tokens;
}

absl::Status DecodeKvTransformBlock(const KvTransformBasis& basis, std::string_view block,
                                    float* rows, int64_t capacity_rows) {
  ByteReader r(block);
  auto header = ReadHeader(r);
  if (!header.ok()) return header.status();
  const BlockHeader& h = *header;
  if (h.checksum != basis.checksum) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "transform block: coded in basis 0x%08x, decoding with 0x%08x (another calibration)",
        h.checksum, basis.checksum));
  }
  if (basis.mean.size() != static_cast<size_t>(basis.dim) ||
      basis.decode.size() != static_cast<size_t>(basis.dim) * basis.dim) {
    return absl::InvalidArgumentError(
        "transform block: the basis's mean or decode matrix is not of its dim");
  }
  if (h.dim != basis.dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: dim %d, the basis has %d", h.dim, basis.dim));
  }
  if (h.tokens > capacity_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: %d rows, room for %d", h.tokens, capacity_rows));
  }
  const int64_t n = h.tokens;
  const int32_t dim = h.dim;
  std::vector<uint8_t> cls(dim);
  std::vector<float> mean(dim);
  for (int32_t i = 0; i < dim; ++i) {
    uint16_t mean16 = 0;
    if (!r.Take(&cls[i], 1) || !r.Take(&mean16, 2)) {
      return absl::DataLossError(
          absl::StrFormat("transform block: truncated in component %d's header", i));
    }
    mean[i] = kernels::Fp16ToFloat(mean16);
    if (cls[i] != kNotCoded && cls[i] >= h.classes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transform block: component %d is in class %d of %d", i, cls[i], h.classes));
    }
    if (!std::isfinite(mean[i])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("transform block: component %d's mean is not finite", i));
    }
  }
  std::vector<int> shift(h.classes);
  std::vector<RansTable> tables(h.classes);
  for (int k = 0; k < h.classes; ++k) {
    uint8_t s = 0;
    if (!r.Take(&s, 1)) {
      return absl::DataLossError(absl::StrFormat("transform block: truncated in class %d", k));
    }
    if (s > kMaxShift) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transform block: class %d sends %d raw bits, above %d", k, s, kMaxShift));
    }
    shift[k] = s;
    SLUICE_ASSIGN_OR_RETURN(
        tables[k], ReadRansTable(r, absl::StrFormat("transform block: class %d's table", k)));
  }
  uint32_t stream_bytes = 0;
  std::string_view stream;
  if (!r.Take(&stream_bytes, 4) || !r.Skip(stream_bytes, &stream)) {
    return absl::DataLossError("transform block: truncated in its codes");
  }
  if (r.left() != 0) {
    return absl::DataLossError(
        absl::StrFormat("transform block: %d bytes after its codes", r.left()));
  }
  SLUICE_ASSIGN_OR_RETURN(RansDecoder dec, RansDecoder::Open(stream));
  std::vector<float> coef(static_cast<size_t>(dim) * n);
  for (int32_t i = 0; i < dim; ++i) {
    float* c = coef.data() + static_cast<size_t>(i) * n;
    if (cls[i] == kNotCoded) {
      std::fill_n(c, n, mean[i]);
      continue;
    }
    const RansTable& table = tables[cls[i]];
    const int s = shift[cls[i]];
    for (int64_t t = 0; t < n; ++t) {
      int64_t q = static_cast<int64_t>(dec.Get(table)) * (int64_t{1} << s);
      if (s > 0) q += dec.GetBits(s);
      c[t] = CodeValue(mean[i], h.step, q);
    }
  }
  if (absl::Status st = dec.Finish(); !st.ok()) {
    return absl::DataLossError(
        absl::StrCat("transform block: the codes do not decode: ", st.message()));
  }
  Reconstruct(basis, coef, n, rows);
  return absl::OkStatus();
}

std::string SerializeKvTransformCalibration(const KvTransformCalibration& c) {
  std::string out;
  PutU32(out, kCalibrationMagic);
  PutU32(out, 1);
  PutU32(out, static_cast<uint32_t>(c.k.size()));
  PutU32(out, static_cast<uint32_t>(c.k.empty() ? 0 : c.k[0].dim));
  const bool predict = HasKvPredictors(c);
  PutU32(out, (predict ? 1 : 0) | (c.key_metric ? 2 : 0));
  for (size_t l = 0; l < c.k.size(); ++l) {
    for (const KvTransformBasis* b : {&c.k[l], &c.v[l]}) {
      PutF32s(out, b->mean);
      PutF32s(out, b->encode);
      PutF32s(out, b->decode);
      PutF32s(out, b->variance);
    }
    if (predict && l > 0) {
      PutF32s(out, c.k_predict[l]);
      PutF32s(out, c.v_predict[l]);
    }
  }
  PutU32(out, Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<KvTransformCalibration> ParseKvTransformCalibration(std::string_view bytes,
                                                                   std::string_view what_view) {
  const std::string what(what_view);
  ByteReader r(bytes);
  uint32_t magic = 0, version = 0, layers = 0, dim = 0, flags = 0;
  if (!r.Take(&magic, 4) || !r.Take(&version, 4) || !r.Take(&layers, 4) || !r.Take(&dim, 4) ||
      !r.Take(&flags, 4)) {
    return absl::DataLossError(absl::StrCat(what, ": shorter than a calibration's header"));
  }
  if (magic != kCalibrationMagic) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a KV transform calibration"));
  }
  if (version != 1) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: version %d, expected 1", what, version));
  }
  if (flags > 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: flags %d (only bits 0 and 1 are defined)", what, flags));
  }
  if (layers < 1 || layers > 1024 || dim < 1 || dim > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d layers of dim %d are out of range", what, layers, dim));
  }
  const size_t per_basis = (2 * static_cast<size_t>(dim) + 2 * static_cast<size_t>(dim) * dim) * 4;
  const size_t per_predictor = (static_cast<size_t>(dim) * dim + dim) * 4;
  const size_t want =
      20 + 2 * layers * per_basis + ((flags & 1) ? 2 * (layers - 1) * per_predictor : 0) + 4;
  if (bytes.size() != want) {
    return absl::DataLossError(absl::StrFormat("%s: %d bytes, %d layers of dim %d need %d", what,
                                               bytes.size(), layers, dim, want));
  }
  uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (Crc32c(bytes.data(), bytes.size() - 4) != stored) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch (corrupt file)"));
  }
  KvTransformCalibration c;
  c.key_metric = (flags & 2) != 0;
  for (uint32_t l = 0; l < layers; ++l) {
    for (std::vector<KvTransformBasis>* side : {&c.k, &c.v}) {
      KvTransformBasis b;
      b.dim = static_cast<int32_t>(dim);
      b.mean.resize(dim);
      b.encode.resize(static_cast<size_t>(dim) * dim);
      b.decode.resize(static_cast<size_t>(dim) * dim);
      b.variance.resize(dim);
      for (std::vector<float>* part : {&b.mean, &b.encode, &b.decode, &b.variance}) {
        r.Take(part->data(), part->size() * 4);
        for (float x : *part) {
          if (!std::isfinite(x)) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s: layer %d holds a non-finite value", what, l));
          }
        }
      }
      b.checksum = BasisChecksum(b);
      side->push_back(std::move(b));
    }
    c.k_predict.emplace_back();
    c.v_predict.emplace_back();
    if ((flags & 1) && l > 0) {
      for (std::vector<float>* p : {&c.k_predict.back(), &c.v_predict.back()}) {
        p->resize(static_cast<size_t>(dim) * dim + dim);
        r.Take(p->data(), p->size() * 4);
        for (float x : *p) {
          if (!std::isfinite(x)) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s: layer %d's predictor holds a non-finite value", what, l));
          }
        }
      }
    }
  }
  return c;
}

absl::StatusOr<KvTransformCalibration> ReadKvTransformCalibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no KV transform calibration there (./sluice calibrate writes one)"));
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ParseKvTransformCalibration(bytes, path);
}

}  // namespace sluice::kvstore
