// The CUDA runtime, cuBLAS and NCCL link and answer their version queries, which need no GPU.
// Where a GPU exists, a cuBLAS handle is created on it; elsewhere that part is skipped.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gtest/gtest.h"

namespace {

TEST(CudaSmoke, LibrariesLinkAndReportVersions) {
  int runtime = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GE(runtime, 13000);

  int cublas_major = 0;
  ASSERT_EQ(cublasGetProperty(MAJOR_VERSION, &cublas_major), CUBLAS_STATUS_SUCCESS);
  EXPECT_GE(cublas_major, 13);

  int nccl = 0;
  ASSERT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  EXPECT_GT(nccl, 20000);
}

TEST(CudaSmoke, CublasHandleOnDevice) {
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device: "
                 << (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
  }
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
