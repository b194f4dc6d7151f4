#include "kernels/registry.h"

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

TEST(Registry, HostBackendsAlwaysExist) {
  for (BackendKind kind : {BackendKind::kRef, BackendKind::kCpu}) {
    auto backend = CreateBackend(kind);
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->kind(), kind);
    EXPECT_TRUE((*backend)->Supports(Op::kRmsNorm));
  }
}

TEST(Registry, CudaIsCreatedOrSaysWhyNot) {
  auto cuda = CreateBackend(BackendKind::kCuda);
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->kind(), BackendKind::kCuda);
    EXPECT_NE((*cuda)->name().find("cuda"), std::string::npos);
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable) << cuda.status();
    EXPECT_FALSE(cuda.status().message().empty());
  }
  auto def = CreateDefaultBackend();
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ((*def)->kind(), cuda.ok() ? BackendKind::kCuda : BackendKind::kCpu);
}

}  // namespace
}  // namespace sluice::kernels
