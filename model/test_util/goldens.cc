#include "model/test_util/goldens.h"

#include <cstdlib>

namespace sluice::model::testing {

std::string GoldenPath(const std::string& name) {
  if (const char* dir = std::getenv("SLUICE_GOLDENS_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" + name;
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir == nullptr ? "." : srcdir) + "/sluice/tests/reference/goldens/" + name;
}

}  // namespace sluice::model::testing
