#include "model/model_path.h"

#include <cstdlib>
#include <string>

namespace sluice::model {

std::string DefaultModelPath() {
  if (const char* p = std::getenv("SLUICE_MODEL"); p != nullptr && *p != '\0') return p;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = x;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home == nullptr ? "" : home) + "/.cache";
  }
  return cache + "/sluice/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string KvCalibrationPath(const std::string& model_path) {
  const std::string ext = ".gguf";
  std::string base = model_path;
  if (base.size() >= ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0) {
    base.resize(base.size() - ext.size());
  }
  return base + ".kvtc";
}

}  // namespace sluice::model
