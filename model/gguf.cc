#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

// Reads little-endian fields with a bounds check each; errors name the offset and field.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t bytes, std::string_view field) const {
    if (bytes > remaining()) {
      return absl::DataLossError(
          absl::StrFormat("GGUF truncated at offset %d reading %s: need %d bytes, %d left", pos_,
                          field, bytes, remaining()));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view field) {
    SLUICE_RETURN_IF_ERROR(Need(sizeof(T), field));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(std::string_view field) {
    const uint64_t at = pos_;
    SLUICE_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(field));
    if (len > kMaxStringBytes || len > remaining()) {
      return absl::DataLossError(
          absl::StrFormat("GGUF %s at offset %d has length %d, but only %d bytes follow", field, at,
                          len, remaining()));
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status Skip(uint64_t bytes, std::string_view field) {
    SLUICE_RETURN_IF_ERROR(Need(bytes, field));
    pos_ += bytes;
    return absl::OkStatus();
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool IsIntType(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// Smallest encoded size of one value of `t`, used to bound array lengths before allocating.
uint64_t MinEncodedSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

absl::StatusOr<GgufType> ReadType(Cursor& c, std::string_view field) {
  const uint64_t at = c.pos();
  SLUICE_ASSIGN_OR_RETURN(uint32_t raw, c.Read<uint32_t>(field));
  if (raw > static_cast<uint32_t>(GgufType::kFloat64)) {
    return absl::DataLossError(
        absl::StrFormat("GGUF %s at offset %d is %d, not a GGUF value type", field, at, raw));
  }
  return static_cast<GgufType>(raw);
}

// Reads one scalar of type `t` into `out` (int, float, or string member).
absl::Status ReadScalar(Cursor& c, GgufType t, GgufValue& out, std::string_view field) {
  switch (t) {
    case GgufType::kUint8: {
      SLUICE_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kInt8: {
      SLUICE_ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kUint16: {
      SLUICE_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kInt16: {
      SLUICE_ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kUint32: {
      SLUICE_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kInt32: {
      SLUICE_ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kUint64: {
      SLUICE_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>(field));
      out.i = static_cast<int64_t>(v);
      break;
    }
    case GgufType::kInt64: {
      SLUICE_ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>(field));
      out.i = v;
      break;
    }
    case GgufType::kBool: {
      const uint64_t at = c.pos();
      SLUICE_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(field));
      if (v > 1) {
        return absl::DataLossError(
            absl::StrFormat("GGUF %s at offset %d is bool %d (not 0 or 1)", field, at, v));
      }
      out.i = v;
      break;
    }
    case GgufType::kFloat32: {
      SLUICE_ASSIGN_OR_RETURN(float v, c.Read<float>(field));
      out.f = v;
      break;
    }
    case GgufType::kFloat64: {
      SLUICE_ASSIGN_OR_RETURN(double v, c.Read<double>(field));
      out.f = v;
      break;
    }
    case GgufType::kString: {
      SLUICE_ASSIGN_OR_RETURN(out.s, c.ReadString(field));
      break;
    }
    case GgufType::kArray:
      return absl::InternalError("ReadScalar called on an array");
  }
  return absl::OkStatus();
}

// Skips a value of type `t` (used for arrays of arrays), recursing to a bounded depth.
absl::Status SkipValue(Cursor& c, GgufType t, std::string_view field, int depth) {
  if (t == GgufType::kString) return c.ReadString(field).status();
  if (t != GgufType::kArray) return c.Skip(MinEncodedSize(t), field);
  if (depth > 8) {
    return absl::DataLossError(
        absl::StrFormat("GGUF %s at offset %d nests arrays too deeply", field, c.pos()));
  }
  SLUICE_ASSIGN_OR_RETURN(GgufType et, ReadType(c, field));
  SLUICE_ASSIGN_OR_RETURN(uint64_t n, c.Read<uint64_t>(field));
  if (n > c.remaining() / MinEncodedSize(et)) {
    return absl::DataLossError(absl::StrFormat(
        "GGUF %s at offset %d claims %d elements, more than the file holds", field, c.pos(), n));
  }
  for (uint64_t k = 0; k < n; ++k) SLUICE_RETURN_IF_ERROR(SkipValue(c, et, field, depth + 1));
  return absl::OkStatus();
}

absl::StatusOr<GgufValue> ReadValue(Cursor& c, std::string_view key) {
  GgufValue v;
  const std::string field = absl::StrFormat("value of '%s'", key);
  SLUICE_ASSIGN_OR_RETURN(v.type, ReadType(c, "type of '" + std::string(key) + "'"));
  if (v.type != GgufType::kArray) {
    SLUICE_RETURN_IF_ERROR(ReadScalar(c, v.type, v, field));
    return v;
  }
  SLUICE_ASSIGN_OR_RETURN(v.array_type, ReadType(c, "array type of '" + std::string(key) + "'"));
  const uint64_t count_at = c.pos();
  SLUICE_ASSIGN_OR_RETURN(uint64_t n,
                          c.Read<uint64_t>("array length of '" + std::string(key) + "'"));
  if (n > c.remaining() / MinEncodedSize(v.array_type)) {
    return absl::DataLossError(absl::StrFormat(
        "GGUF array '%s' at offset %d claims %d elements of %s, more than the %d bytes left", key,
        count_at, n, GgufTypeName(v.array_type), c.remaining()));
  }
  GgufValue elem;
  if (v.array_type == GgufType::kArray) {
    for (uint64_t k = 0; k < n; ++k) {
      SLUICE_RETURN_IF_ERROR(SkipValue(c, GgufType::kArray, field, 1));
    }
  } else if (v.array_type == GgufType::kString) {
    v.strings.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      SLUICE_ASSIGN_OR_RETURN(std::string s, c.ReadString(field));
      v.strings.push_back(std::move(s));
    }
  } else if (IsFloatType(v.array_type)) {
    v.floats.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      SLUICE_RETURN_IF_ERROR(ReadScalar(c, v.array_type, elem, field));
      v.floats.push_back(elem.f);
    }
  } else {
    v.ints.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      SLUICE_RETURN_IF_ERROR(ReadScalar(c, v.array_type, elem, field));
      v.ints.push_back(elem.i);
    }
  }
  return v;
}

}  // namespace

std::string_view GgufTypeName(GgufType type) {
  static constexpr std::string_view kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                "int32",  "float32", "bool",   "string", "array",
                                                "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrFormat("cannot open GGUF file %s: %s", path, strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrFormat("cannot stat %s: %s", path, strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("%s is not a regular file", path));
  }
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->source_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrFormat("cannot mmap %s: %s", path, strerror(err)));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  absl::Status st_parse = file->Parse();
  if (!st_parse.ok()) {
    return absl::Status(st_parse.code(), absl::StrFormat("%s: %s", path, st_parse.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->source_ = "<memory>";
  file->owned_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  SLUICE_RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_);
  SLUICE_ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != kMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a GGUF file: magic at offset 0 is 0x%08x, want 0x%08x (\"GGUF\")", magic, kMagic));
  }
  SLUICE_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return absl::UnimplementedError(
        absl::StrFormat("GGUF version %d at offset 4 is not supported (2 and 3 are)", version_));
  }
  SLUICE_ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  SLUICE_ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // Each key-value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
  // least 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13 || n_tensors > c.remaining() / 32) {
    return absl::DataLossError(absl::StrFormat(
        "GGUF header at offset 8 claims %d tensors and %d metadata entries, more than a "
        "%d-byte file holds",
        n_tensors, n_kv, size_));
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    SLUICE_ASSIGN_OR_RETURN(std::string key, c.ReadString(absl::StrFormat("metadata key %d", k)));
    SLUICE_ASSIGN_OR_RETURN(GgufValue value, ReadValue(c, key));
    if (metadata_.contains(key)) {
      return absl::DataLossError(
          absl::StrFormat("GGUF metadata key '%s' at offset %d appears twice", key, at));
    }
    keys_.push_back(key);
    metadata_.emplace(std::move(key), std::move(value));
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (!IsIntType(a->type) || a->i <= 0 || (a->i & (a->i - 1)) != 0) {
      return absl::DataLossError("GGUF general.alignment must be a positive power of two");
    }
    alignment_ = static_cast<uint64_t>(a->i);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    const uint64_t at = c.pos();
    SLUICE_ASSIGN_OR_RETURN(t.name, c.ReadString(absl::StrFormat("name of tensor %d", k)));
    const std::string what = absl::StrFormat("tensor '%s' (info at offset %d)", t.name, at);
    SLUICE_ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>("dimension count of " + what));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::DataLossError(
          absl::StrFormat("%s has %d dimensions (1 to %d allowed)", what, n_dims, kMaxDims));
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      SLUICE_ASSIGN_OR_RETURN(uint64_t dim, c.Read<uint64_t>("dimensions of " + what));
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(elements) > (uint64_t{1} << 50) / dim) {
        return absl::DataLossError(
            absl::StrFormat("%s has an invalid dimension %d = %d", what, d, dim));
      }
      elements *= static_cast<int64_t>(dim);
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    SLUICE_ASSIGN_OR_RETURN(uint32_t type, c.Read<uint32_t>("type of " + what));
    const kernels::GgmlTypeTraits* traits = kernels::FindGgmlType(type);
    if (traits == nullptr) {
      return absl::UnimplementedError(
          absl::StrFormat("%s has element type %s, which sluice cannot convert", what,
                          kernels::GgmlTypeName(type)));
    }
    t.type = traits->type;
    if (t.dims[0] % traits->block_size != 0) {
      return absl::DataLossError(
          absl::StrFormat("%s: row length %d is not a multiple of the %s "
                          "block size %d",
                          what, t.dims[0], traits->name, traits->block_size));
    }
    t.bytes = static_cast<uint64_t>(elements / traits->block_size * traits->type_size);
    SLUICE_ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>("data offset of " + what));
    if (t.offset % alignment_ != 0) {
      return absl::DataLossError(
          absl::StrFormat("%s: data offset %d is not aligned to %d", what, t.offset, alignment_));
    }
    if (tensor_index_.contains(t.name)) {
      return absl::DataLossError(absl::StrFormat("%s appears twice", what));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensor& t : tensors_) {
    if (data_start > size_ || t.offset > size_ - data_start ||
        t.bytes > size_ - data_start - t.offset) {
      return absl::DataLossError(
          absl::StrFormat("tensor '%s' data [%d, %d) lies outside the %d-byte file", t.name,
                          data_start + t.offset, data_start + t.offset + t.bytes, size_));
    }
    t.offset += data_start;
    t.data = base_ + t.offset;
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(absl::string_view(key.data(), key.size()));
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

absl::Status TypeMismatch(std::string_view key, const GgufValue& v, std::string_view want) {
  std::string have(GgufTypeName(v.type));
  if (v.type == GgufType::kArray) have = absl::StrFormat("array of %s", GgufTypeName(v.array_type));
  return absl::InvalidArgumentError(
      absl::StrFormat("GGUF metadata '%s' is %s, expected %s", key, have, want));
}

absl::StatusOr<const GgufValue*> Lookup(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrFormat("GGUF metadata '%s' is missing", key));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kString) return TypeMismatch(key, *v, "string");
  return v->s;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!IsIntType(v->type) || v->type == GgufType::kBool) return TypeMismatch(key, *v, "integer");
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (IsFloatType(v->type)) return v->f;
  if (IsIntType(v->type) && v->type != GgufType::kBool) return static_cast<double>(v->i);
  return TypeMismatch(key, *v, "number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kBool) return TypeMismatch(key, *v, "bool");
  return v->i != 0;
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(
    std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kArray || v->array_type != GgufType::kString) {
    return TypeMismatch(key, *v, "array of string");
  }
  return &v->strings;
}

absl::StatusOr<const std::vector<int64_t>*> GgufFile::GetIntArray(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kArray || !IsIntType(v->array_type)) {
    return TypeMismatch(key, *v, "array of integers");
  }
  return &v->ints;
}

absl::StatusOr<const std::vector<double>*> GgufFile::GetFloatArray(std::string_view key) const {
  SLUICE_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kArray || !IsFloatType(v->array_type)) {
    return TypeMismatch(key, *v, "array of floats");
  }
  return &v->floats;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::vector<float>> GgufFile::ToFloat(const GgufTensor& tensor) const {
  std::vector<float> out(tensor.num_elements());
  const kernels::GgmlTypeTraits* traits = kernels::FindGgmlType(static_cast<uint32_t>(tensor.type));
  if (traits == nullptr) return absl::InternalError("tensor of unknown type");
  const int64_t row = tensor.row_length();
  const int64_t row_bytes = row / traits->block_size * traits->type_size;
  for (int64_t r = 0; r < tensor.num_rows(); ++r) {
    kernels::DequantizeRow(tensor.type, tensor.data + r * row_bytes, out.data() + r * row, row);
  }
  return out;
}

}  // namespace sluice::model
