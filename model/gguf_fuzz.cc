// libFuzzer target for the GGUF parser (tools/fuzz.sh builds it with ASan and UBSan): a model
// file is input from outside. Property: parsing never crashes, and a file it accepts can be
// read whole (every key through every typed getter, every tensor to fp32) without crashing;
// each read returns a value or an error.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::model::GgufFile;
  auto file = GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  for (const std::string& key : f.keys()) {
    if (f.Find(key) == nullptr) std::abort();  // a listed key is found
    (void)f.GetString(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetStringArray(key);
    (void)f.GetIntArray(key);
    (void)f.GetFloatArray(key);
  }
  for (const auto& tensor : f.tensors()) {
    // An accepted tensor lies inside the input.
    if (tensor.offset > size || tensor.bytes > size - tensor.offset) std::abort();
    if (tensor.num_elements() <= (int64_t{1} << 20)) (void)f.ToFloat(tensor);
  }
  return 0;
}
