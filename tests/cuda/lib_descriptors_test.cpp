// cuBLASLt and cuDNN accept the descriptors that mpq's plans describe (kernels/lib_descriptors.*):
// descriptor creation and attribute calls are host-only, so this runs without a GPU. Also checks
// the status-name table of runtime/cuda/status.cpp against the real headers. Algorithm selection
// and the calls that run work (cublasLtMatmul, cudnnConvolution*) need a GPU and are not here.
#include <catch2/catch.hpp>

#include <cublasLt.h>
#include <cudnn.h>

#include <string>

#include "kernels/lib_descriptors.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"
#include "runtime/cuda/status.h"

using namespace mpq;
using namespace mpq::rt::cuda_plan;

namespace {
uint64_t layout_u64(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a) {
  uint64_t v = 0;
  size_t written = 0;
  REQUIRE(cublasLtMatrixLayoutGetAttribute(l, a, &v, sizeof v, &written) == CUBLAS_STATUS_SUCCESS);
  return v;
}
}  // namespace

TEST_CASE("cuBLASLt accepts the GEMM plans' descriptors", "[cuda][descriptors]") {
  struct Case {
    GemmPrecision p;
    bool ta, tb;
    int64_t batch;
  };
  const Case cases[] = {{GemmPrecision::FP32, false, false, 1}, {GemmPrecision::TF32, true, false, 3},
                        {GemmPrecision::FP16, false, true, 1},  {GemmPrecision::BF16, true, true, 2},
                        {GemmPrecision::INT8, false, true, 1}};
  for (const Case& c : cases) {
    GemmRequest r;
    r.m = 12;
    r.n = 20;
    r.k = 36;
    r.trans_a = c.ta;
    r.trans_b = c.tb;
    r.batch = c.batch;
    r.precision = c.p;
    const GemmPlan p = plan_gemm(r);
    INFO("precision " << static_cast<int>(c.p) << " ta " << c.ta << " tb " << c.tb);
    REQUIRE(p.use_cublaslt);
    cuda::LtGemmDescriptors d(p);
    INFO(d.failed_call);
    REQUIRE(d.status == 0);
    CHECK(layout_u64(d.a, CUBLASLT_MATRIX_LAYOUT_ROWS) == static_cast<uint64_t>(c.tb ? 36 : 20));
    CHECK(layout_u64(d.c, CUBLASLT_MATRIX_LAYOUT_ROWS) == 20u);
    CHECK(layout_u64(d.c, CUBLASLT_MATRIX_LAYOUT_COLS) == 12u);
    int32_t compute = -1;
    size_t written = 0;
    REQUIRE(cublasLtMatmulDescGetAttribute(d.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute, sizeof compute, &written) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(compute == static_cast<int32_t>(cuda::to_cublas(p.compute)));
  }
  CHECK(cuda::to_cublas(LtCompute::F32_FAST_TF32) == CUBLAS_COMPUTE_32F_FAST_TF32);
  CHECK(cuda::to_cuda(LtType::BF16) == CUDA_R_16BF);
  WARN("cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul need a GPU: checked only by gpu_check.sh");
}

TEST_CASE("cuDNN accepts the convolution plans' descriptors and agrees on the output shape", "[cuda][descriptors]") {
  struct Case {
    std::vector<int64_t> x, w, s, d, pads;
    int64_t group;
    ConvDataType t;
  };
  const Case cases[] = {{{2, 4, 9, 11}, {6, 4, 3, 3}, {2, 1}, {}, {1, 1, 1, 1}, 1, ConvDataType::F32},
                        {{1, 6, 8, 7}, {6, 1, 3, 2}, {1, 2}, {2, 1}, {2, 0, 2, 0}, 6, ConvDataType::F16},
                        {{3, 4, 17}, {8, 2, 5}, {3}, {2}, {2, 2}, 2, ConvDataType::BF16},
                        {{1, 2, 5, 6, 7}, {4, 2, 3, 3, 3}, {1, 2, 1}, {}, {1, 0, 1, 1, 0, 1}, 1, ConvDataType::F32}};
  for (const Case& c : cases) {
    ConvRequest r{c.x, c.w, c.s, c.d, c.pads, c.group, c.t};
    const ConvPlan p = plan_conv(r);
    REQUIRE(p.use_cudnn);
    cuda::CudnnConvDescriptors d(p);
    INFO(d.failed_call << " -> " << cudnnGetErrorString(static_cast<cudnnStatus_t>(d.status)));
    REQUIRE(d.status == 0);
    std::vector<int> out(p.y.dims.size(), -1);
    REQUIRE(cudnnGetConvolutionNdForwardOutputDim(d.conv, d.x, d.w, static_cast<int>(out.size()), out.data()) ==
            CUDNN_STATUS_SUCCESS);
    CHECK(out == p.y.dims);
  }
  WARN("cudnnFind*/cudnnConvolution* (algorithm choice, workspace query, execution) need a GPU: gpu_check.sh only");
}

TEST_CASE("status names match the library headers", "[cuda][descriptors]") {
  CHECK(status_name(CudaLibrary::Runtime, cudaErrorMemoryAllocation) == "cudaErrorMemoryAllocation");
  CHECK(status_name(CudaLibrary::Runtime, cudaErrorIllegalAddress) == "cudaErrorIllegalAddress");
  CHECK(status_name(CudaLibrary::Runtime, cudaErrorNoKernelImageForDevice) == "cudaErrorNoKernelImageForDevice");
  CHECK(status_name(CudaLibrary::Runtime, cudaErrorInsufficientDriver) == "cudaErrorInsufficientDriver");
  CHECK(status_name(CudaLibrary::CublasLt, CUBLAS_STATUS_NOT_SUPPORTED) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(status_name(CudaLibrary::CublasLt, CUBLAS_STATUS_EXECUTION_FAILED) == "CUBLAS_STATUS_EXECUTION_FAILED");
  CHECK(status_name(CudaLibrary::CublasLt, CUBLAS_STATUS_INVALID_VALUE) == "CUBLAS_STATUS_INVALID_VALUE");
  CHECK(status_name(CudaLibrary::Cudnn, CUDNN_STATUS_BAD_PARAM) == "CUDNN_STATUS_BAD_PARAM");
  CHECK(status_name(CudaLibrary::Cudnn, CUDNN_STATUS_NOT_SUPPORTED_PADDING) == "CUDNN_STATUS_NOT_SUPPORTED_PADDING");
  CHECK(status_name(CudaLibrary::Cudnn, CUDNN_STATUS_EXECUTION_FAILED) == "CUDNN_STATUS_EXECUTION_FAILED");
  CHECK(status_name(CudaLibrary::Cudnn, CUDNN_STATUS_INTERNAL_ERROR) == "CUDNN_STATUS_INTERNAL_ERROR");
}
