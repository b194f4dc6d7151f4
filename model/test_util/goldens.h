// Paths of the HF transformers goldens (tests/reference/goldens) from inside a test:
// $SLUICE_GOLDENS_DIR if set, else the test's runfiles (data dep //tests/reference:goldens).
#ifndef SLUICE_MODEL_TEST_UTIL_GOLDENS_H_
#define SLUICE_MODEL_TEST_UTIL_GOLDENS_H_

#include <string>

namespace sluice::model::testing {

std::string GoldenPath(const std::string& name);

}  // namespace sluice::model::testing

#endif  // SLUICE_MODEL_TEST_UTIL_GOLDENS_H_
