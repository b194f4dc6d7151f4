// Transform coding of a block of KV rows for the prefill-to-decode wire.
//
// A row is one token's values of one layer's keys (before RoPE) or values across all kv-heads:
// kv_heads * head_dim floats. Rows are centred and rotated into a principal-component basis
// fitted on a calibration text (FitKvTransformBasis), so that most of their variance sits in
// few components. A block's coefficients are quantised with one uniform step for every
// component (entropy-coded uniform quantisation: equal error everywhere is what minimises it
// for a given number of bits, and a narrow component then costs a fraction of a bit, not a
// whole one), the step chosen so that the codes cost about a bits-per-value budget. A code is
// the coefficient's nearest whole number of steps from its component's block mean; a value is
// rebuilt as mean + code * step; a component whose codes are all 0 is sent as its mean.
// Components are grouped by their spread over the step into classes of half an octave, each
// with a rANS table built for the block and sent in it (rans.h); in wide classes the low bits
// of a code ride raw. The block carries no checksum of its own: between workers it travels as
// pages do, under the transport's CRC32C; its rANS stream must end where it began.
//
// Block wire form, little-endian (DecodeKvTransformBlock checks every field):
//   offset  field            type   meaning
//        0  magic            u32    "SKT2"
//        4  basis_checksum   u32    KvTransformBasis::checksum of the basis it was coded in
//        8  tokens           u32    rows in the block, 1 to 2^31-1
//       12  dim              u16    values per row (the basis's dim)
//       14  classes          u8     rANS tables that follow the components
//       15  reserved         u8     0
//       16  step             f32    > 0, finite
//       20  per component i (dim entries, by descending calibrated variance):
//             class u8 (index of its table; 0xff: not coded, every code 0), mean f16
//        .  per class: raw low bits u8 (0..12), its table (rans.h: AppendRansTable)
//        .  stream bytes u32, the rANS stream: component after component (not coded ones
//             skipped), token after token, the code's high part (code >> raw bits, floor) under
//             the class's table, then its raw low bits
#ifndef SLUICE_KVSTORE_WIRE_KV_TRANSFORM_H_
#define SLUICE_KVSTORE_WIRE_KV_TRANSFORM_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::kvstore {

inline constexpr int kMaxKvTransformBits = 8;

// A principal-component basis of `dim`-value rows, under a metric: coefficient i of a row x is
// encode_i . (x - mean), and x = mean + sum_i c_i decode_i. Without a metric, encode_i = decode_i,
// the covariance's eigenvectors; with a metric M (the squared error that matters is
// (x - y)^T M (x - y)), they are the eigenvectors of the covariance of M^1/2 x, taken through
// M^1/2 and M^-1/2, so that equal errors in the coefficients are equal errors under M.
struct KvTransformBasis {
  int32_t dim = 0;
  std::vector<float> mean;      // [dim]
  std::vector<float> encode;    // [dim, dim]: row i is component i's encoding vector
  std::vector<float> decode;    // [dim, dim]: row i is component i's direction
  std::vector<float> variance;  // [dim], descending: the calibration coefficients' variance
  uint32_t checksum = 0;        // CRC32C of dim, mean, encode, decode and variance
};

// The basis of n rows [n, dim] (n >= 2): their mean and the eigenvectors of their covariance (in
// the metric's coordinates when `metric` [dim, dim], symmetric positive semi-definite, is given),
// by descending eigenvalue (LAPACK's dsyevd through OpenBLAS). Directions the metric gives no
// weight keep a tiny one (1e-6 of its largest). InvalidArgument for n < 2, dim < 1, a metric of
// the wrong size or a non-finite value.
absl::StatusOr<KvTransformBasis> FitKvTransformBasis(const float* rows, int64_t n, int32_t dim,
                                                     absl::Span<const double> metric = {});

// Bit widths (0..8) of components with these variances for an average of `bits_per_value` code
// bits per value at fixed width (the resident formats `sluice eval --trial` emulates; the wire
// is entropy-coded and needs none): each bit goes, one at a time, where it removes the most
// squared error of a Gaussian component under its optimal uniform quantizer.
std::vector<uint8_t> AllocateKvTransformBits(absl::Span<const double> variance,
                                             double bits_per_value);

// The step of the optimal uniform quantizer of a unit Gaussian with 2^bits levels (Max, 1960),
// bits 1..8; 0 for 0 bits (the component is its mean).
double KvTransformGaussianStep(int bits);

// Codes rows [n, basis.dim] into a block whose codes cost about `bits_per_value` bits a value
// (0 < bits <= 8; the step is searched on up to 256 of the rows, so a block lands within a few
// percent; headers and tables come on top). `reconstructed`
// [n, dim], when given (it may be `rows`), gets what DecodeKvTransformBlock will make of the
// block, bit for bit, without decoding it. InvalidArgument for n outside 1 to 2^31-1, a bad budget
// or a non-finite value.
absl::StatusOr<std::string> EncodeKvTransformBlock(const KvTransformBasis& basis, const float* rows,
                                                   int64_t n, double bits_per_value,
                                                   float* reconstructed = nullptr);

// Rows of a block, for callers that size buffers before decoding. DataLoss/InvalidArgument as
// DecodeKvTransformBlock for a header that does not parse.
absl::StatusOr<int64_t> KvTransformBlockTokens(std::string_view block);

// Decodes a block into rows [tokens, basis.dim]. FailedPrecondition if it was coded in another
// basis (the checksums differ); DataLoss for a truncated block or a code stream that does not
// decode; InvalidArgument for a field out of range; each names the field.
absl::Status DecodeKvTransformBlock(const KvTransformBasis& basis, std::string_view block,
                                    float* rows, int64_t capacity_rows);

// Every layer's key and value bases of a model, fitted on one calibration text.
struct KvTransformCalibration {
  std::vector<KvTransformBasis> k, v;  // [layers]; keys before RoPE
  // Cross-layer prediction, when fitted: per layer, empty (layer 0) or W [dim, dim] row-major
  // then bias [dim]: a row of layer l is predicted as bias + W x from the same token's row x of
  // layer l - 1 (as decoded), and the basis codes what the prediction misses.
  std::vector<std::vector<float>> k_predict, v_predict;
  // Whether the key bases were fitted under the queries' metric (kv_transform_calibration.h's
  // KvKeyMetric); bases fitted without it still code and decode, with more logit error per bit.
  bool key_metric = false;
};

// Whether every layer after the first has a key and a value predictor of the bases' dim.
bool HasKvPredictors(const KvTransformCalibration& calibration);

// A calibration's identity on the wire: CRC32C over every basis's checksum and every predictor.
// Two ends code and decode with the same calibration exactly when these agree.
uint32_t KvTransformCalibrationChecksum(const KvTransformCalibration& calibration);

// File form: "SKTC" u32 version 1, layers u32, dim u32, flags u32 (bit 0: predictors; bit 1: keys
// fitted under the queries' metric), then per
// layer the key basis and the value basis (mean, encode, decode, variance as f32) and, with
// predictors, for layers after the first the key and the value predictor (W then bias, f32),
// then the CRC32C of everything before it. Predictors are written only when every layer after
// the first has both.
std::string SerializeKvTransformCalibration(const KvTransformCalibration& calibration);
// DataLoss for a truncated file or a checksum that does not match; InvalidArgument for fields
// out of range. `what` (the file's path) starts every message.
absl::StatusOr<KvTransformCalibration> ParseKvTransformCalibration(std::string_view bytes,
                                                                   std::string_view what);
// The calibration file at `path` (`./sluice calibrate` writes it beside the model): NotFound or
// the parse's errors, each naming the path.
absl::StatusOr<KvTransformCalibration> ReadKvTransformCalibration(const std::string& path);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_KV_TRANSFORM_H_
