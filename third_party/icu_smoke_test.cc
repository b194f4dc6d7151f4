// ICU links and runs: general categories of code points from several scripts.
#include <unicode/uchar.h>

#include "gtest/gtest.h"

namespace {

TEST(IcuSmoke, GeneralCategories) {
  EXPECT_TRUE(U_GET_GC_MASK(U'é') & U_GC_L_MASK);
  EXPECT_TRUE(U_GET_GC_MASK(U'日') & U_GC_L_MASK);
  EXPECT_TRUE(U_GET_GC_MASK(U'٣') & U_GC_N_MASK);  // Arabic-Indic digit three
  EXPECT_TRUE(U_GET_GC_MASK(U'Ⅻ') & U_GC_N_MASK);  // Roman numeral twelve (Nl)
  EXPECT_FALSE(U_GET_GC_MASK(U'!') & (U_GC_L_MASK | U_GC_N_MASK));
  EXPECT_TRUE(u_isUWhiteSpace(U'\u3000'));
}

}  // namespace
