// GGUF (v2/v3) model files: a memory-mapped reader with bounds checks on every length and
// offset. Malformed input yields an error naming the byte offset and the field being read;
// it never crashes or allocates more than the file could describe.
//
//   SLUICE_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
//   SLUICE_ASSIGN_OR_RETURN(int64_t layers, gguf->GetInt("llama.block_count"));
//   const GgufTensor* t = gguf->FindTensor("token_embd.weight");
#ifndef SLUICE_MODEL_GGUF_H_
#define SLUICE_MODEL_GGUF_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/ggml_quant.h"

namespace sluice::model {

// GGUF metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view GgufTypeName(GgufType type);

// One metadata value. Integers of every width widen to `i`, floats to `f`, bools to `i`
// (0/1). Arrays keep their element type; arrays of arrays are skipped over and kept empty.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType array_type = GgufType::kUint8;  // element type when type == kArray
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGML order: dims[0] is the contiguous (row) dimension
  kernels::GgmlType type;
  uint64_t offset = 0;  // from the start of the file
  uint64_t bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives

  int64_t num_elements() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t num_rows() const { return row_length() == 0 ? 0 : num_elements() / row_length(); }
};

class GgufFile {
 public:
  // Maps `path` read-only.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes held in memory (tests, fuzzing); the GgufFile keeps its own copy.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& source() const { return source_; }

  // ---- metadata ----
  const GgufValue* Find(std::string_view key) const;
  const std::vector<std::string>& keys() const { return keys_; }
  // Typed access: NotFound when absent, InvalidArgument (naming the key and both types) when
  // the stored type does not convert.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // also accepts integers
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(std::string_view key) const;
  absl::StatusOr<const std::vector<int64_t>*> GetIntArray(std::string_view key) const;
  absl::StatusOr<const std::vector<double>*> GetFloatArray(std::string_view key) const;

  // ---- tensors ----
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;
  // The whole tensor as fp32 [num_elements].
  absl::StatusOr<std::vector<float>> ToFloat(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string source_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // munmap on destruction when set
  std::string owned_;        // backing store for FromBytes

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_GGUF_H_
