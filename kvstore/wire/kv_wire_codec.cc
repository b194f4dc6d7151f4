#include "kvstore/wire/kv_wire_codec.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/ggml_quant.h"
#include "kvstore/wire/byte_io.h"
#include "kvstore/wire/kv_transform_calibration.h"

namespace sluice::kvstore {
namespace {

constexpr uint32_t kStreamMagic = 0x31574B53;  // "SKW1"
constexpr size_t kStreamHeaderBytes = 32;

// The chunk's rows [0, n) at positions start.. that the codec codes: [lo, hi); the rest cross
// exact.
std::pair<int64_t, int64_t> CodedRows(const KvWireShape& s, int64_t start, int64_t n) {
  const int64_t lo = std::clamp<int64_t>(s.sinks - start, 0, n);
  const int64_t hi = std::clamp<int64_t>(s.tokens - s.tail - start, lo, n);
  return {lo, hi};
}

absl::Status CheckCalibration(const KvTransformCalibration* c, const model::LlamaConfig& m,
                              std::string_view what) {
  const int64_t dim = m.kv_heads * m.head_dim;
  if (c == nullptr || static_cast<int64_t>(c->k.size()) != m.layers ||
      static_cast<int64_t>(c->v.size()) != m.layers || c->k[0].dim != dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the calibration has %d layers of dim %d; the model %d of %d", what,
                        c == nullptr ? 0 : c->k.size(),
                        c == nullptr || c->k.empty() ? 0 : c->k[0].dim, m.layers, dim));
  }
  return absl::OkStatus();
}

const std::vector<float>* Predictor(const KvTransformCalibration& c, int layer, bool keys) {
  if (layer == 0 || !HasKvPredictors(c)) return nullptr;
  return &(keys ? c.k_predict : c.v_predict)[layer];
}

}  // namespace

absl::StatusOr<KvWireBits> ParseKvWireBits(std::string_view spec) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(spec.data(), spec.size()), '/');
  KvWireBits b;
  if (parts.size() > 2 || !absl::SimpleAtod(parts[0], &b.key) ||
      !absl::SimpleAtod(parts.back(), &b.value)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "wire bits \"%s\" are neither BITS nor KEY_BITS/VALUE_BITS", std::string(spec)));
  }
  for (double x : {b.key, b.value}) {
    if (!(x > 0 && x <= kMaxKvTransformBits)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("wire bits \"%s\": %g bits per value outside (0, %d]", std::string(spec),
                          x, kMaxKvTransformBits));
    }
  }
  return b;
}

KvWireEncoder::KvWireEncoder(const Options& o) : o_(o), dim_(o.model.kv_heads * o.model.head_dim) {
  out_.resize(kStreamHeaderBytes);
}

absl::StatusOr<KvWireEncoder> KvWireEncoder::Create(const Options& o) {
  SLUICE_RETURN_IF_ERROR(CheckCalibration(o.calibration, o.model, "KV wire encoder"));
  for (double b : {o.key_bits, o.value_bits}) {
    if (!(b > 0 && b <= kMaxKvTransformBits)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV wire encoder: %g bits per value outside (0, %d]", b, kMaxKvTransformBits));
    }
  }
  const KvWireShape& s = o.shape;
  if (s.tokens < 1 || s.tokens > UINT32_MAX || s.sinks < 0 || s.tail < 0 || s.sinks > UINT32_MAX ||
      s.tail > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV wire encoder: tokens=%d sinks=%d tail=%d", s.tokens, s.sinks, s.tail));
  }
  return KvWireEncoder(o);
}

absl::Status KvWireEncoder::CodeSide(int layer, bool keys, int64_t start, int64_t n,
                                     const float* rows, float* decoded, std::string& out) {
  const auto [lo, hi] = CodedRows(o_.shape, start, n);
  // Exact rows, fp16 with RoPE.
  for (int64_t t = 0; t < n; ++t) {
    if (t >= lo && t < hi) continue;
    for (int64_t j = 0; j < dim_; ++j) {
      const uint16_t h = kernels::FloatToFp16(rows[t * dim_ + j]);
      out.append(reinterpret_cast<const char*>(&h), 2);
      if (decoded != nullptr) decoded[t * dim_ + j] = kernels::Fp16ToFloat(h);
    }
  }
  if (hi == lo) {
    PutU32(out, 0);
    return absl::OkStatus();
  }
  // Coded rows: RoPE off, the prediction from the previous layer as decoded taken away.
  const int64_t m = hi - lo;
  Side& side = keys ? k_ : v_;
  side.cur.resize(n * dim_);
  float* coded = side.cur.data() + lo * dim_;
  std::copy(rows + lo * dim_, rows + hi * dim_, coded);
  if (keys) RotateKeyRows(o_.model, coded, m, start + lo, /*inverse=*/true);
  const std::vector<float>* predict = Predictor(*o_.calibration, layer, keys);
  if (predict) {
    side.predicted.resize(m * dim_);
    PredictKvRows(*predict, side.prev.data() + lo * dim_, m, dim_, side.predicted.data());
    for (int64_t i = 0; i < m * dim_; ++i) coded[i] -= side.predicted[i];
  }
  const KvTransformBasis& basis = (keys ? o_.calibration->k : o_.calibration->v)[layer];
  // `coded` becomes what the decoder will hold: the next layer predicts from it.
  SLUICE_ASSIGN_OR_RETURN(
      const std::string block,
      EncodeKvTransformBlock(basis, coded, m, keys ? o_.key_bits : o_.value_bits, coded));
  PutU32(out, static_cast<uint32_t>(block.size()));
  out += block;
  if (predict) {
    for (int64_t i = 0; i < m * dim_; ++i) coded[i] += side.predicted[i];
  }
  if (decoded != nullptr) {
    float* dst = decoded + lo * dim_;
    std::copy(coded, coded + m * dim_, dst);
    if (keys) RotateKeyRows(o_.model, dst, m, start + lo, /*inverse=*/false);
  }
  return absl::OkStatus();
}

absl::Status KvWireEncoder::Add(int layer, int64_t start, int64_t n, const float* k, const float* v,
                                float* decoded_k, float* decoded_v) {
  if (next_layer_ == 0) {
    if (start != next_ || n < 1 || start + n > o_.shape.tokens || layer != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV wire encoder: layer %d of positions [%d, %d); expected layer 0 of a chunk from "
          "position %d within the %d tokens",
          layer, start, start + n, next_, o_.shape.tokens));
    }
    chunk_n_ = n;
    ++chunks_;
    PutU32(out_, static_cast<uint32_t>(start));
    PutU32(out_, static_cast<uint32_t>(n));
  } else if (layer != next_layer_ || start != next_ || n != chunk_n_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV wire encoder: layer %d of positions [%d, %d); expected layer %d of [%d, %d)", layer,
        start, start + n, next_layer_, next_, next_ + chunk_n_));
  }
  // Keys and values are coded apart (each predicted from its own side of the layer before), the
  // values on a thread of their own.
  std::string values;
  absl::Status values_st;
  std::thread value_thread(
      [&] { values_st = CodeSide(layer, false, start, n, v, decoded_v, values); });
  const absl::Status keys_st = CodeSide(layer, true, start, n, k, decoded_k, out_);
  value_thread.join();
  SLUICE_RETURN_IF_ERROR(keys_st);
  SLUICE_RETURN_IF_ERROR(values_st);
  out_ += values;
  fp16_bytes_ += 2 * n * dim_ * 2;
  k_.prev.swap(k_.cur);
  v_.prev.swap(v_.cur);
  if (++next_layer_ == o_.model.layers) {
    next_layer_ = 0;
    next_ += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvWireEncoder::Finish() {
  if (next_ != o_.shape.tokens || next_layer_ != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "KV wire encoder: %d of %d positions added (layer %d of the open chunk next)", next_,
        o_.shape.tokens, next_layer_));
  }
  std::string header;
  PutU32(header, kStreamMagic);
  PutU8(header, kKvWireCodecTransform);
  for (int i = 0; i < 3; ++i) PutU8(header, 0);
  PutU32(header, o_.calibration_checksum);
  PutU16(header, static_cast<uint16_t>(o_.model.layers));
  PutU16(header, static_cast<uint16_t>(dim_));
  PutU32(header, static_cast<uint32_t>(o_.shape.tokens));
  PutU32(header, static_cast<uint32_t>(o_.shape.sinks));
  PutU32(header, static_cast<uint32_t>(o_.shape.tail));
  PutU32(header, static_cast<uint32_t>(chunks_));
  std::memcpy(out_.data(), header.data(), kStreamHeaderBytes);
  return std::move(out_);
}

absl::StatusOr<KvWireDecoder> KvWireDecoder::Open(const KvTransformCalibration* calibration,
                                                  uint32_t calibration_checksum,
                                                  std::string_view calibration_name,
                                                  const model::LlamaConfig& model,
                                                  std::string_view stream) {
  SLUICE_RETURN_IF_ERROR(CheckCalibration(calibration, model, calibration_name));
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("KV wire stream: " + what);
  };
  ByteReader r(stream);
  uint32_t magic = 0, checksum = 0, tokens = 0, sinks = 0, tail = 0, chunks = 0;
  uint8_t codec = 0, reserved[3] = {};
  uint16_t layers = 0, dim = 0;
  if (!r.Take(&magic, 4) || !r.Take(&codec, 1) || !r.Take(reserved, 3) || !r.Take(&checksum, 4) ||
      !r.Take(&layers, 2) || !r.Take(&dim, 2) || !r.Take(&tokens, 4) || !r.Take(&sinks, 4) ||
      !r.Take(&tail, 4) || !r.Take(&chunks, 4)) {
    return absl::DataLossError(
        absl::StrFormat("KV wire stream: %d bytes, shorter than its header", stream.size()));
  }
  if (magic != kStreamMagic) return bad("magic is not SKW1");
  if (codec != kKvWireCodecTransform) {
    return bad(absl::StrFormat("codec %d is not this worker's (%d)", codec, kKvWireCodecTransform));
  }
  if (reserved[0] != 0 || reserved[1] != 0 || reserved[2] != 0) return bad("reserved bytes set");
  if (checksum != calibration_checksum) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "KV wire stream: coded with calibration %08x, %s is calibration %08x (the prefill and "
        "decode workers must load the same file)",
        checksum, calibration_name, calibration_checksum));
  }
  KvWireDecoder d;
  d.calibration_ = calibration;
  d.model_ = model;
  d.dim_ = model.kv_heads * model.head_dim;
  if (layers != model.layers || dim != d.dim_) {
    return bad(absl::StrFormat("%d layers of dim %d; the model has %d of %d", layers, dim,
                               model.layers, d.dim_));
  }
  if (tokens < 1 || chunks < 1 || chunks > tokens) {
    return bad(absl::StrFormat("tokens=%d chunks=%d", tokens, chunks));
  }
  d.shape_ = {.tokens = tokens, .sinks = sinks, .tail = tail};
  const size_t row_bytes = static_cast<size_t>(d.dim_) * 2;
  int64_t next = 0;
  for (uint32_t i = 0; i < chunks; ++i) {
    Chunk c;
    uint32_t start = 0, n = 0;
    if (!r.Take(&start, 4) || !r.Take(&n, 4)) {
      return absl::DataLossError(absl::StrFormat("KV wire stream: truncated at chunk %d", i));
    }
    if (start != next || n < 1 || int64_t{start} + n > tokens) {
      return bad(absl::StrFormat("chunk %d covers [%d, %d), expected one from %d within %d", i,
                                 start, int64_t{start} + n, next, tokens));
    }
    c.start = start;
    c.n = n;
    next += n;
    const auto [lo, hi] = CodedRows(d.shape_, start, n);
    const size_t exact = static_cast<size_t>(n - (hi - lo)) * row_bytes;
    for (int p = 0; p < 2 * layers; ++p) {
      Part part;
      uint32_t block = 0;
      if (!r.Skip(exact, &part.exact) || !r.Take(&block, 4) || !r.Skip(block, &part.block)) {
        return absl::DataLossError(
            absl::StrFormat("KV wire stream: truncated in chunk %d, layer %d's %s", i, p / 2,
                            p % 2 ? "values" : "keys"));
      }
      if ((block == 0) != (hi == lo)) {
        return bad(absl::StrFormat("chunk %d, layer %d's %s: a %d-byte block for %d coded rows", i,
                                   p / 2, p % 2 ? "values" : "keys", block, hi - lo));
      }
      c.parts.push_back(part);
    }
    d.chunks_.push_back(std::move(c));
  }
  if (next != tokens) {
    return bad(absl::StrFormat("the chunks cover %d of %d tokens", next, tokens));
  }
  if (r.left() != 0) return bad(absl::StrFormat("%d bytes after the last chunk", r.left()));
  return d;
}

absl::Status KvWireDecoder::DecodeSide(int layer, bool keys, const Chunk& c, const Part& part,
                                       float* rows) {
  const auto [lo, hi] = CodedRows(shape_, c.start, c.n);
  const auto* exact = reinterpret_cast<const uint8_t*>(part.exact.data());
  for (int64_t t = 0, e = 0; t < c.n; ++t) {
    if (t >= lo && t < hi) continue;
    for (int64_t j = 0; j < dim_; ++j, ++e) {
      uint16_t h = 0;
      std::memcpy(&h, exact + 2 * e, 2);
      rows[(c.start + t) * dim_ + j] = kernels::Fp16ToFloat(h);
    }
  }
  if (hi == lo) return absl::OkStatus();
  const int64_t m = hi - lo, first = c.start + lo;
  std::vector<float>& cur = keys ? cur_k_ : cur_v_;
  const std::vector<float>& prev = keys ? prev_k_ : prev_v_;
  float* coded = cur.data() + first * dim_;
  const KvTransformBasis& basis = (keys ? calibration_->k : calibration_->v)[layer];
  if (absl::Status st = DecodeKvTransformBlock(basis, part.block, coded, m); !st.ok()) {
    return absl::Status(
        st.code(), absl::StrFormat("KV wire stream: chunk at %d, layer %d's %s: %s", c.start, layer,
                                   keys ? "keys" : "values", st.message()));
  }
  const std::vector<float>* predict = Predictor(*calibration_, layer, keys);
  if (predict) {
    // As the encoder added it back: the prediction apart, then added.
    predicted_.resize(m * dim_);
    PredictKvRows(*predict, prev.data() + first * dim_, m, dim_, predicted_.data());
    for (int64_t i = 0; i < m * dim_; ++i) coded[i] += predicted_[i];
  }
  float* out = rows + first * dim_;
  std::copy(coded, coded + m * dim_, out);
  if (keys) RotateKeyRows(model_, out, m, first, /*inverse=*/false);
  return absl::OkStatus();
}

absl::Status KvWireDecoder::DecodeLayer(int layer, float* k, float* v) {
  if (layer != next_layer_ || layer >= model_.layers) {
    return absl::FailedPreconditionError(
        absl::StrFormat("KV wire decoder: layer %d asked, layer %d is next", layer, next_layer_));
  }
  const size_t size = static_cast<size_t>(shape_.tokens * dim_);
  cur_k_.resize(size);
  cur_v_.resize(size);
  for (const Chunk& c : chunks_) {
    SLUICE_RETURN_IF_ERROR(DecodeSide(layer, true, c, c.parts[2 * layer], k));
    SLUICE_RETURN_IF_ERROR(DecodeSide(layer, false, c, c.parts[2 * layer + 1], v));
  }
  prev_k_.swap(cur_k_);
  prev_v_.swap(cur_v_);
  ++next_layer_;
  return absl::OkStatus();
}

}  // namespace sluice::kvstore
