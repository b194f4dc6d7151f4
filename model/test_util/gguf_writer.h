// Builds GGUF files in memory for tests: metadata of every type, tensors in any supported
// element type, and hooks to write deliberately malformed files.
#ifndef SLUICE_MODEL_TEST_UTIL_GGUF_WRITER_H_
#define SLUICE_MODEL_TEST_UTIL_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ggml_quant.h"
#include "model/gguf.h"

namespace sluice::model::testing {

class GgufWriter {
 public:
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddUint64(const std::string& key, uint64_t value);
  void AddFloat32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);
  void AddFloat32Array(const std::string& key, const std::vector<float>& values);
  // A value as GgufFile reads it, in its own type (copying one file's metadata to another).
  // InvalidArgument for an array of arrays, which the reader keeps empty.
  absl::Status AddValue(const std::string& key, const GgufValue& value);
  // A key whose value is given as raw encoded bytes after the type tag.
  void AddRaw(const std::string& key, GgufType type, const std::string& payload);

  // `data` must hold the tensor in `type`'s storage layout.
  void AddTensor(const std::string& name, const std::vector<int64_t>& dims, kernels::GgmlType type,
                 const std::string& data);
  // fp32 values converted to `type` (f32, f16, bf16 by rounding; q8_0, q4_0, q4_1 by GGML's
  // reference quantization).
  void AddTensorFromFloats(const std::string& name, const std::vector<int64_t>& dims,
                           kernels::GgmlType type, const std::vector<float>& values);

  std::string Build(uint32_t version = 3, uint32_t alignment = 32) const;
  absl::Status WriteFile(const std::string& path, uint32_t version = 3,
                         uint32_t alignment = 32) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    std::string data;
  };
  std::vector<std::string> kvs_;  // encoded key + type + value
  std::vector<Tensor> tensors_;
};

// Quantizes fp32 values into `type`'s storage layout (n a multiple of the block size).
std::string QuantizeForTest(kernels::GgmlType type, const std::vector<float>& values);

}  // namespace sluice::model::testing

#endif  // SLUICE_MODEL_TEST_UTIL_GGUF_WRITER_H_
