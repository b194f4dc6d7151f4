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

TEST(Registry, NamedBackends) {
  auto cpu = CreateNamedBackend("cpu", 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->kind(), BackendKind::kCpu);
  EXPECT_NE((*cpu)->name().find("1 thread"), std::string::npos) << (*cpu)->name();
  auto ref = CreateNamedBackend("ref");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ((*ref)->kind(), BackendKind::kRef);
  const bool gpu = CreateBackend(BackendKind::kCuda).ok();
  auto automatic = CreateNamedBackend("auto", 1);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->kind(), gpu ? BackendKind::kCuda : BackendKind::kCpu);
  auto cuda = CreateNamedBackend("cuda");
  EXPECT_EQ(cuda.ok(), gpu) << cuda.status();
  if (!gpu) EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  // A GPU index past the machine's: refused by name where there are GPUs, by "auto" too.
  for (const char* name : {"cuda", "auto"}) {
    auto far = CreateNamedBackend(name, 1, /*device=*/99);
    if (gpu) {
      EXPECT_EQ(far.status().code(), absl::StatusCode::kInvalidArgument) << far.status();
      EXPECT_NE(far.status().message().find("CUDA device 99"), std::string::npos);
    } else {
      EXPECT_EQ(far.ok(), std::string(name) == "auto") << far.status();  // auto: the CPU
    }
  }
  auto bad = CreateNamedBackend("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--backend=tpu"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace sluice::kernels
