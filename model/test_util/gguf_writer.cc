#include "model/test_util/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "common/status_macros.h"

namespace sluice::model::testing {
namespace {

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::string& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out += s;
}

std::string Key(const std::string& key, GgufType type) {
  std::string out;
  PutString(out, key);
  Put<uint32_t>(out, static_cast<uint32_t>(type));
  return out;
}

}  // namespace

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  std::string kv = Key(key, GgufType::kString);
  PutString(kv, value);
  kvs_.push_back(kv);
}

void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  std::string kv = Key(key, GgufType::kUint32);
  Put(kv, value);
  kvs_.push_back(kv);
}

void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  std::string kv = Key(key, GgufType::kInt32);
  Put(kv, value);
  kvs_.push_back(kv);
}

void GgufWriter::AddUint64(const std::string& key, uint64_t value) {
  std::string kv = Key(key, GgufType::kUint64);
  Put(kv, value);
  kvs_.push_back(kv);
}

void GgufWriter::AddFloat32(const std::string& key, float value) {
  std::string kv = Key(key, GgufType::kFloat32);
  Put(kv, value);
  kvs_.push_back(kv);
}

void GgufWriter::AddBool(const std::string& key, bool value) {
  std::string kv = Key(key, GgufType::kBool);
  Put<uint8_t>(kv, value ? 1 : 0);
  kvs_.push_back(kv);
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  std::string kv = Key(key, GgufType::kArray);
  Put<uint32_t>(kv, static_cast<uint32_t>(GgufType::kString));
  Put<uint64_t>(kv, values.size());
  for (const std::string& s : values) PutString(kv, s);
  kvs_.push_back(kv);
}

void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  std::string kv = Key(key, GgufType::kArray);
  Put<uint32_t>(kv, static_cast<uint32_t>(GgufType::kInt32));
  Put<uint64_t>(kv, values.size());
  for (int32_t v : values) Put(kv, v);
  kvs_.push_back(kv);
}

void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& values) {
  std::string kv = Key(key, GgufType::kArray);
  Put<uint32_t>(kv, static_cast<uint32_t>(GgufType::kFloat32));
  Put<uint64_t>(kv, values.size());
  for (float v : values) Put(kv, v);
  kvs_.push_back(kv);
}

namespace {

// One element of `type`: integers from `i`, floats from `f`, strings from `str`.
absl::Status PutElement(std::string& out, GgufType type, int64_t i, double f,
                        const std::string& str) {
  switch (type) {
    case GgufType::kUint8:
      Put<uint8_t>(out, static_cast<uint8_t>(i));
      break;
    case GgufType::kInt8:
      Put<int8_t>(out, static_cast<int8_t>(i));
      break;
    case GgufType::kUint16:
      Put<uint16_t>(out, static_cast<uint16_t>(i));
      break;
    case GgufType::kInt16:
      Put<int16_t>(out, static_cast<int16_t>(i));
      break;
    case GgufType::kUint32:
      Put<uint32_t>(out, static_cast<uint32_t>(i));
      break;
    case GgufType::kInt32:
      Put<int32_t>(out, static_cast<int32_t>(i));
      break;
    case GgufType::kUint64:
      Put<uint64_t>(out, static_cast<uint64_t>(i));
      break;
    case GgufType::kInt64:
      Put<int64_t>(out, i);
      break;
    case GgufType::kBool:
      Put<uint8_t>(out, i != 0 ? 1 : 0);
      break;
    case GgufType::kFloat32:
      Put<float>(out, static_cast<float>(f));
      break;
    case GgufType::kFloat64:
      Put<double>(out, f);
      break;
    case GgufType::kString:
      PutString(out, str);
      break;
    case GgufType::kArray:
      return absl::InvalidArgumentError("arrays of arrays are not copied");
  }
  return absl::OkStatus();
}

bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

}  // namespace

absl::Status GgufWriter::AddValue(const std::string& key, const GgufValue& value) {
  std::string payload;
  if (value.type != GgufType::kArray) {
    if (absl::Status st = PutElement(payload, value.type, value.i, value.f, value.s); !st.ok()) {
      return absl::Status(st.code(), key + ": " + std::string(st.message()));
    }
    AddRaw(key, value.type, payload);
    return absl::OkStatus();
  }
  const GgufType t = value.array_type;
  if (t == GgufType::kArray) {
    return absl::InvalidArgumentError(key + ": arrays of arrays are not copied");
  }
  const size_t n = t == GgufType::kString ? value.strings.size()
                   : IsFloat(t)           ? value.floats.size()
                                          : value.ints.size();
  Put<uint32_t>(payload, static_cast<uint32_t>(t));
  Put<uint64_t>(payload, n);
  static const std::string kEmpty;
  for (size_t e = 0; e < n; ++e) {
    const int64_t i = t == GgufType::kString || IsFloat(t) ? 0 : value.ints[e];
    const double f = IsFloat(t) ? value.floats[e] : 0;
    SLUICE_RETURN_IF_ERROR(
        PutElement(payload, t, i, f, t == GgufType::kString ? value.strings[e] : kEmpty));
  }
  AddRaw(key, GgufType::kArray, payload);
  return absl::OkStatus();
}

void GgufWriter::AddRaw(const std::string& key, GgufType type, const std::string& payload) {
  kvs_.push_back(Key(key, type) + payload);
}

void GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& dims,
                           kernels::GgmlType type, const std::string& data) {
  tensors_.push_back({name, dims, static_cast<uint32_t>(type), data});
}

void GgufWriter::AddTensorFromFloats(const std::string& name, const std::vector<int64_t>& dims,
                                     kernels::GgmlType type, const std::vector<float>& values) {
  AddTensor(name, dims, type, QuantizeForTest(type, values));
}

std::string GgufWriter::Build(uint32_t version, uint32_t alignment) const {
  std::string out;
  Put<uint32_t>(out, 0x46554747);
  Put<uint32_t>(out, version);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, kvs_.size());
  for (const std::string& kv : kvs_) out += kv;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, t.dims.size());
    for (int64_t d : t.dims) Put<uint64_t>(out, d);
    Put<uint32_t>(out, t.type);
    Put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    out += tensors_[i].data;
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path, uint32_t version,
                                   uint32_t alignment) const {
  std::ofstream f(path, std::ios::binary);
  const std::string bytes = Build(version, alignment);
  f.write(bytes.data(), bytes.size());
  if (!f) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

std::string QuantizeForTest(kernels::GgmlType type, const std::vector<float>& values) {
  using kernels::FloatToFp16;
  std::string out;
  const size_t n = values.size();
  switch (type) {
    case kernels::GgmlType::kF32:
      out.assign(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
      break;
    case kernels::GgmlType::kF16:
      for (float v : values) Put<uint16_t>(out, FloatToFp16(v));
      break;
    case kernels::GgmlType::kBF16:
      for (float v : values) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        Put<uint16_t>(out, static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16));
      }
      break;
    case kernels::GgmlType::kQ8_0:
      for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(values[b * 32 + j]));
        const float d = amax / 127.f;
        kernels::BlockQ8_0 blk;
        blk.d = FloatToFp16(d);
        for (int j = 0; j < 32; ++j) {
          blk.qs[j] = static_cast<int8_t>(d == 0 ? 0 : std::lround(values[b * 32 + j] / d));
        }
        out.append(reinterpret_cast<const char*>(&blk), sizeof(blk));
      }
      break;
    case kernels::GgmlType::kQ4_0:
      for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
          const float v = values[b * 32 + j];
          if (std::fabs(v) > amax) amax = std::fabs(v), max = v;
        }
        const float d = max / -8.f;
        const float id = d == 0 ? 0 : 1.f / d;
        kernels::BlockQ4_0 blk;
        blk.d = FloatToFp16(d);
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, static_cast<int>(values[b * 32 + j] * id + 8.5f));
          const int hi = std::min(15, static_cast<int>(values[b * 32 + j + 16] * id + 8.5f));
          blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
        out.append(reinterpret_cast<const char*>(&blk), sizeof(blk));
      }
      break;
    case kernels::GgmlType::kQ4_1:
      for (size_t b = 0; b < n / 32; ++b) {
        float lo = values[b * 32], hi = values[b * 32];
        for (int j = 0; j < 32; ++j) {
          lo = std::min(lo, values[b * 32 + j]);
          hi = std::max(hi, values[b * 32 + j]);
        }
        const float d = (hi - lo) / 15.f;
        const float id = d == 0 ? 0 : 1.f / d;
        kernels::BlockQ4_1 blk;
        blk.d = FloatToFp16(d);
        blk.m = FloatToFp16(lo);
        for (int j = 0; j < 16; ++j) {
          const int a = std::min(15, static_cast<int>((values[b * 32 + j] - lo) * id + 0.5f));
          const int c = std::min(15, static_cast<int>((values[b * 32 + j + 16] - lo) * id + 0.5f));
          blk.qs[j] = static_cast<uint8_t>(a | (c << 4));
        }
        out.append(reinterpret_cast<const char*>(&blk), sizeof(blk));
      }
      break;
  }
  return out;
}

}  // namespace sluice::model::testing
