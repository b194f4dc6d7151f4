#include "kvstore/wire/kv_transform.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/ggml_quant.h"
#include "kernels/huffman.h"
#include "kvstore/wire/byte_io.h"
#include "kvstore/wire/crc32c.h"

extern "C" {
// LAPACK (OpenBLAS): eigenvalues and eigenvectors of a symmetric matrix, divide and conquer.
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info);
}

namespace sluice::kvstore {
namespace {

constexpr uint32_t kBlockMagic = 0x31544B53;        // "SKT1"
constexpr uint32_t kCalibrationMagic = 0x43544B53;  // "SKTC"
constexpr size_t kBlockHeaderBytes = 16;
// Codes are steps from the mean, -128..127 (stored +128): the width sets the step; codes beyond
// the Gaussian's 2^width levels are rare and the Huffman code makes them long, not clipped.
constexpr int kCodeLevels = 256;
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

struct Component {
  uint8_t bits = 0;
  float step = 0, mean = 0;
};

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

// A component's value for code q (stored + 128): the middle of its step.
float CodeValue(float mean, float step, int q) {
  return mean + (static_cast<float>(q - kCodeLevels / 2) + 0.5f) * step;
}

// rows [n, dim] = mean + coef^T decode, coef component-major [dim, n] (OpenBLAS).
void Reconstruct(const KvTransformBasis& basis, const std::vector<float>& coef, int64_t n,
                 float* rows) {
  const int32_t dim = basis.dim;
  for (int64_t t = 0; t < n; ++t) std::copy(basis.mean.begin(), basis.mean.end(), rows + t * dim);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(n), dim, dim, 1.f,
              coef.data(), static_cast<int>(n), basis.decode.data(), dim, 1.f, rows, dim);
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
  // The block's own means and variances decide the widths and steps.
  std::vector<Component> comp(dim);
  std::vector<double> variance(dim);
  for (int32_t i = 0; i < dim; ++i) {
    const float* c = coef.data() + static_cast<size_t>(i) * n;
    double m = 0, v = 0;
    for (int64_t t = 0; t < n; ++t) m += c[t];
    m /= static_cast<double>(n);
    for (int64_t t = 0; t < n; ++t) v += (c[t] - m) * (c[t] - m);
    variance[i] = v / static_cast<double>(n);
    comp[i].mean = kernels::Fp16ToFloat(kernels::FloatToFp16(static_cast<float>(m)));
  }
  const std::vector<uint8_t> widths = AllocateKvTransformBits(variance, bits_per_value);
  std::array<std::vector<int32_t>, kMaxKvTransformBits + 1> by_width;
  for (int32_t i = 0; i < dim; ++i) {
    comp[i].bits = widths[i];
    if (widths[i] == 0) continue;
    const float step =
        static_cast<float>(kGaussianStep[widths[i]] * std::sqrt(std::max(variance[i], 1e-30)));
    comp[i].step = kernels::Fp16ToFloat(kernels::FloatToFp16(std::max(step, 6.2e-5f)));
    by_width[widths[i]].push_back(i);
  }
  std::string out;
  PutU32(out, kBlockMagic);
  PutU32(out, basis.checksum);
  PutU32(out, static_cast<uint32_t>(n));
  PutU16(out, static_cast<uint16_t>(dim));
  int present = 0;
  for (int w = 1; w <= kMaxKvTransformBits; ++w) present += !by_width[w].empty();
  PutU8(out, static_cast<uint8_t>(present));
  PutU8(out, 0);
  for (const Component& c : comp) {
    PutU8(out, c.bits);
    PutU16(out, kernels::FloatToFp16(c.step));
    PutU16(out, kernels::FloatToFp16(c.mean));
  }
  // What the decoder will make of the codes, when asked: every component from its mean, coded
  // ones from their codes below.
  std::vector<float> decoded;
  if (reconstructed != nullptr) {
    decoded.resize(static_cast<size_t>(dim) * n);
    for (int32_t i = 0; i < dim; ++i) {
      std::fill_n(decoded.begin() + static_cast<size_t>(i) * n, n, comp[i].mean);
    }
  }
  std::vector<uint8_t> symbols;
  for (int w = 1; w <= kMaxKvTransformBits; ++w) {
    const std::vector<int32_t>& members = by_width[w];
    if (members.empty()) continue;
    const int levels = kCodeLevels, half = levels / 2;
    symbols.resize(members.size() * n);
    std::vector<uint64_t> histogram(levels, 0);
    for (size_t r = 0; r < members.size(); ++r) {
      const Component& c = comp[members[r]];
      const float* x = coef.data() + static_cast<size_t>(members[r]) * n;
      for (int64_t t = 0; t < n; ++t) {
        const int q = std::clamp(static_cast<int>(std::floor((x[t] - c.mean) / c.step)) + half, 0,
                                 levels - 1);
        symbols[r * n + t] = static_cast<uint8_t>(q);
        ++histogram[q];
        if (reconstructed != nullptr) {
          decoded[static_cast<size_t>(members[r]) * n + t] = CodeValue(c.mean, c.step, q);
        }
      }
    }
    auto book = kernels::BuildHuffmanCodebook(static_cast<uint32_t>(w), histogram);
    if (!book.ok()) return book.status();
    const std::string serialized = kernels::SerializeCodebook(*book);
    PutU8(out, static_cast<uint8_t>(w));
    PutU16(out, static_cast<uint16_t>(serialized.size()));
    out += serialized;
    const uint64_t bits = kernels::EncodedBits(*book, symbols.data(), symbols.size());
    if (bits >= (uint64_t{1} << 32)) {
      return absl::InvalidArgumentError("a block's codes of one width exceed 2^32 bits");
    }
    std::vector<uint8_t> payload((bits + 7) / 8 + kernels::HuffmanPaddingBytes());
    std::vector<uint32_t> offsets(members.size() + 1);
    auto written = kernels::EncodeRows(*book, symbols.data(), static_cast<int64_t>(members.size()),
                                       n, payload.data(), payload.size(), offsets.data());
    if (!written.ok()) return written.status();
    PutU32(out, static_cast<uint32_t>(bits));
    out.append(reinterpret_cast<const char*>(payload.data()), (bits + 7) / 8);
  }
  if (reconstructed != nullptr) Reconstruct(basis, decoded, n, reconstructed);
  return out;
}

namespace {

struct BlockHeader {
  uint32_t checksum = 0, tokens = 0;
  uint16_t dim = 0;
  uint8_t widths = 0;
};

absl::StatusOr<BlockHeader> ReadHeader(ByteReader& r) {
  uint32_t magic = 0;
  BlockHeader h;
  uint8_t reserved = 0;
  if (!r.Take(&magic, 4) || !r.Take(&h.checksum, 4) || !r.Take(&h.tokens, 4) ||
      !r.Take(&h.dim, 2) || !r.Take(&h.widths, 1) || !r.Take(&reserved, 1)) {
    return absl::DataLossError(absl::StrFormat(
        "transform block: %d bytes, shorter than its %d-byte header", r.left(), kBlockHeaderBytes));
  }
  if (magic != kBlockMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: magic 0x%08x is not \"SKT1\"", magic));
  }
  if (h.tokens == 0 || h.tokens > kMaxBlockRows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: tokens %d outside 1 to 2^31-1", h.tokens));
  }
  if (h.dim == 0) return absl::InvalidArgumentError("transform block: dim is 0");
  if (h.widths > kMaxKvTransformBits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: widths %d above %d", h.widths, kMaxKvTransformBits));
  }
  if (reserved != 0) return absl::InvalidArgumentError("transform block: reserved byte not 0");
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
        "transform block: the basis's mean or decode matrix is "
        "not of its dim");
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
  std::vector<Component> comp(dim);
  std::array<std::vector<int32_t>, kMaxKvTransformBits + 1> by_width;
  for (int32_t i = 0; i < dim; ++i) {
    uint16_t step = 0, mean = 0;
    if (!r.Take(&comp[i].bits, 1) || !r.Take(&step, 2) || !r.Take(&mean, 2)) {
      return absl::DataLossError(
          absl::StrFormat("transform block: truncated in component %d's header", i));
    }
    comp[i].step = kernels::Fp16ToFloat(step);
    comp[i].mean = kernels::Fp16ToFloat(mean);
    if (comp[i].bits > kMaxKvTransformBits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("transform block: component %d has %d bits", i, comp[i].bits));
    }
    if (!std::isfinite(comp[i].mean) ||
        (comp[i].bits > 0 && !(comp[i].step > 0 && std::isfinite(comp[i].step)))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("transform block: component %d's step or mean is invalid", i));
    }
    if (comp[i].bits > 0) by_width[comp[i].bits].push_back(i);
  }
  int present = 0;
  for (int w = 1; w <= kMaxKvTransformBits; ++w) present += !by_width[w].empty();
  if (present != h.widths) {
    return absl::InvalidArgumentError(
        absl::StrFormat("transform block: widths %d, its components use %d", h.widths, present));
  }
  // Coefficients, component-major, every component starting at its mean.
  std::vector<float> coef(static_cast<size_t>(dim) * n);
  for (int32_t i = 0; i < dim; ++i) {
    std::fill_n(coef.begin() + static_cast<size_t>(i) * n, n, comp[i].mean);
  }
  std::vector<uint8_t> symbols(n);
  for (int k = 0; k < present; ++k) {
    uint8_t w = 0;
    uint16_t book_bytes = 0;
    std::string_view book_view, payload;
    uint32_t bits = 0;
    if (!r.Take(&w, 1) || !r.Take(&book_bytes, 2) || !r.Skip(book_bytes, &book_view)) {
      return absl::DataLossError(absl::StrFormat("transform block: truncated in codebook %d", k));
    }
    if (w < 1 || w > kMaxKvTransformBits || by_width[w].empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transform block: codebook %d is for width %d, which no component has", k, w));
    }
    auto book = kernels::ParseCodebook(book_view);
    if (!book.ok()) {
      return absl::Status(book.status().code(),
                          absl::StrFormat("transform block: codebook of width %d: %s", w,
                                          std::string(book.status().message())));
    }
    if (book->alphabet_size != kCodeLevels) {
      return absl::InvalidArgumentError(
          absl::StrFormat("transform block: codebook of width %d has %d symbols, not %d", w,
                          book->alphabet_size, kCodeLevels));
    }
    if (!r.Take(&bits, 4) || !r.Skip((static_cast<size_t>(bits) + 7) / 8, &payload)) {
      return absl::DataLossError(
          absl::StrFormat("transform block: truncated in the codes of width %d", w));
    }
    uint64_t pos = 0;
    for (const int32_t i : by_width[w]) {
      auto next = kernels::DecodeRowWithin(*book, payload, pos, bits, n, symbols.data());
      if (!next.ok()) {
        return absl::DataLossError(
            absl::StrFormat("transform block: the codes of component %d do not decode: %s", i,
                            std::string(next.status().message())));
      }
      pos = *next;
      float* c = coef.data() + static_cast<size_t>(i) * n;
      for (int64_t t = 0; t < n; ++t) c[t] = CodeValue(comp[i].mean, comp[i].step, symbols[t]);
    }
    if (pos != bits) {
      return absl::DataLossError(absl::StrFormat(
          "transform block: the codes of width %d end at bit %d, not %d", w, pos, bits));
    }
  }
  if (r.left() != 0) {
    return absl::DataLossError(
        absl::StrFormat("transform block: %d bytes after its last code", r.left()));
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
  PutU32(out, predict ? 1 : 0);
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
  if (flags > 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: flags %d (only bit 0 is defined)", what, flags));
  }
  if (layers < 1 || layers > 1024 || dim < 1 || dim > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d layers of dim %d are out of range", what, layers, dim));
  }
  const size_t per_basis = (2 * static_cast<size_t>(dim) + 2 * static_cast<size_t>(dim) * dim) * 4;
  const size_t per_predictor = (static_cast<size_t>(dim) * dim + dim) * 4;
  const size_t want =
      20 + 2 * layers * per_basis + (flags ? 2 * (layers - 1) * per_predictor : 0) + 4;
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
    if (flags && l > 0) {
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
