// A prompt's keys and values as the prefill worker sends them with the transform codec
// (kv_transform.h): one stream per sequence, coded as the prefill computes the prompt, chunk by
// chunk and layer by layer, and decoded by the decode worker layer by layer into rows it
// commits into its own cache's format.
//
// Per layer and chunk, the rows the codec codes are the prompt's positions in [sinks,
// tokens - tail); the first `sinks` and the last `tail` positions (the attention sinks and what
// the decode side's cache keeps in its full-precision window) cross exact, as fp16 with RoPE.
// Keys are coded without RoPE, values under the calibration's metric; with the calibration's
// cross-layer predictors, each layer's coded rows are predicted from the previous layer's as
// decoded and the codec codes what the prediction misses. The encoder decodes what it codes, so
// what it reports as decoded is what the decoder will produce, bit for bit.
//
// Stream form, little-endian (KvWireDecoder::Open checks every field and length):
//   offset  field        type  meaning
//        0  magic        u32   "SKW1"
//        4  codec        u8    2: the transform codec (kKvWireCodecTransform)
//        5  reserved     u8x3  0
//        8  calibration  u32   KvTransformCalibrationChecksum of the calibration it was coded in
//       12  layers       u16
//       14  dim          u16   values per row (kv_heads * head_dim)
//       16  tokens       u32   prompt tokens, >= 1
//       20  sinks        u32
//       24  tail         u32
//       28  chunks       u32   >= 1; the chunks cover [0, tokens) in order
//       32  per chunk: start u32, n u32 (>= 1), then per layer 0..layers-1, keys then values:
//             the chunk's exact rows, fp16 [e, dim]; then u32 block bytes and the block
//             (kv_transform.h's form; 0 bytes when the chunk has no coded row)
// The stream has no checksum of its own: it travels under the transport's CRC32C, as pages do.
#ifndef SLUICE_KVSTORE_WIRE_KV_WIRE_CODEC_H_
#define SLUICE_KVSTORE_WIRE_KV_WIRE_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvstore/wire/kv_transform.h"
#include "model/llama.h"

namespace sluice::kvstore {

// 2: the transform codec with rANS-coded blocks ("SKT2"). 1 was its Huffman-coded form, no longer
// decoded: a worker of that version and one of this disagree by name, not by garbage.
inline constexpr uint8_t kKvWireCodecTransform = 2;
// The attention sinks a prompt's stream keeps exact (KVTC's 4).
inline constexpr int64_t kKvWireSinks = 4;

// Code bits per key value and per value value, each in (0, 8].
struct KvWireBits {
  double key = 0, value = 0;
};
// "B" (keys and values alike) or "K/V". InvalidArgument naming the spec.
absl::StatusOr<KvWireBits> ParseKvWireBits(std::string_view spec);

// What both ends of one sequence's stream agree on besides the calibration.
struct KvWireShape {
  int64_t tokens = 0;            // the prompt
  int64_t sinks = kKvWireSinks;  // first positions sent exact
  int64_t tail = 0;              // last positions sent exact
};

class KvWireEncoder {
 public:
  struct Options {
    const KvTransformCalibration* calibration = nullptr;  // outlives the encoder
    uint32_t calibration_checksum = 0;  // KvTransformCalibrationChecksum(*calibration)
    model::LlamaConfig model;           // shapes and RoPE
    // Entropy-coded bits per value of the codes, (0, 8], in every layer alike (one step across
    // the layers, by the calibration's variances, was measured to cost more than it saves:
    // README, The transform-coded wire).
    double key_bits = 2, value_bits = 4;
    KvWireShape shape;
  };
  // InvalidArgument for a calibration of another shape than the model's, bits out of range, or a
  // shape with tokens < 1, sinks or tail < 0.
  static absl::StatusOr<KvWireEncoder> Create(const Options& options);

  // Rows of `layer` for the prompt's positions [start, start + n): keys with RoPE and values,
  // [n, dim] each. Chunks come in order from position 0, each with every layer in order.
  // decoded_k/decoded_v, when given ([n, dim]), get what the decoder will produce of them.
  absl::Status Add(int layer, int64_t start, int64_t n, const float* k, const float* v,
                   float* decoded_k = nullptr, float* decoded_v = nullptr);
  // The stream, once every position and layer has been added; FailedPrecondition before.
  absl::StatusOr<std::string> Finish();

  // Floats of one row: kv_heads * head_dim.
  int64_t row_floats() const { return dim_; }
  // Bytes coded so far, and the same rows as fp16.
  int64_t bytes() const { return static_cast<int64_t>(out_.size()); }
  int64_t fp16_bytes() const { return fp16_bytes_; }

 private:
  explicit KvWireEncoder(const Options& o);
  // Codes one side (keys or values) of a layer's chunk onto `out`.
  absl::Status CodeSide(int layer, bool keys, int64_t start, int64_t n, const float* rows,
                        float* decoded, std::string& out);

  Options o_;
  int64_t dim_ = 0;
  std::string out_;
  int64_t next_ = 0;     // the next chunk's first position
  int64_t chunk_n_ = 0;  // the open chunk's rows
  int next_layer_ = 0;   // the open chunk's next layer
  int64_t chunks_ = 0;
  int64_t fp16_bytes_ = 0;
  // Per side: the chunk's coded rows as decoded, without RoPE, for this layer and the one
  // before; the prediction of this layer's.
  struct Side {
    std::vector<float> prev, cur, predicted;
  };
  Side k_, v_;
};

class KvWireDecoder {
 public:
  // Checks the stream's header and every record's length. FailedPrecondition naming
  // `calibration_name` when the stream was coded with another calibration; DataLoss for a
  // truncated stream; InvalidArgument for a field out of range or a shape other than the
  // model's; each names the field.
  static absl::StatusOr<KvWireDecoder> Open(const KvTransformCalibration* calibration,
                                            uint32_t calibration_checksum,
                                            std::string_view calibration_name,
                                            const model::LlamaConfig& model,
                                            std::string_view stream);

  const KvWireShape& shape() const { return shape_; }
  // Rows [tokens, dim] of the next layer (layers in order from 0): keys with RoPE, values.
  // DataLoss/InvalidArgument from a block that does not decode, naming chunk and layer.
  absl::Status DecodeLayer(int layer, float* k, float* v);

 private:
  struct Part {
    std::string_view exact, block;
  };
  struct Chunk {
    int64_t start = 0, n = 0;
    std::vector<Part> parts;  // [layers * 2]: layer-major, keys then values
  };
  KvWireDecoder() = default;
  absl::Status DecodeSide(int layer, bool keys, const Chunk& c, const Part& part, float* rows);

  const KvTransformCalibration* calibration_ = nullptr;
  model::LlamaConfig model_;
  KvWireShape shape_;
  int64_t dim_ = 0;
  std::vector<Chunk> chunks_;
  int next_layer_ = 0;
  std::vector<float> prev_k_, prev_v_, cur_k_, cur_v_;  // [tokens, dim], coded rows only
  std::vector<float> predicted_;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_KV_WIRE_CODEC_H_
