#pragma once
// Real cuBLASLt and cuDNN descriptors built from mpq's plans (lib/runtime/cuda/plan_*.h). Host-only
// library calls: they work without a GPU, so tests/cuda/lt_descriptors_test.cpp checks on every
// CUDA build that the libraries accept what the plans describe. Requires the CUDA headers; part
// of the static library mpq_cuda_libs (linked into the plugin and the CUDA tests).
#include <cublasLt.h>
#include <cudnn.h>

#include <string>

#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"

namespace mpq::cuda {

cudaDataType_t to_cuda(rt::cuda_plan::LtType t);
cublasComputeType_t to_cublas(rt::cuda_plan::LtCompute c);
cudnnDataType_t to_cudnn(rt::cuda_plan::ConvDataType t);
cudnnMathType_t to_cudnn(rt::cuda_plan::ConvMath m);

// The descriptors of one GEMM (owned; destroyed with the object). `status` is the first failing
// cuBLASLt status (0 when all were created) and `failed_call` names the call.
struct LtGemmDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  int status = 0;
  std::string failed_call;
  explicit LtGemmDescriptors(const rt::cuda_plan::GemmPlan& p);
  ~LtGemmDescriptors();
  LtGemmDescriptors(const LtGemmDescriptors&) = delete;
  LtGemmDescriptors& operator=(const LtGemmDescriptors&) = delete;
};

struct CudnnConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int status = 0;
  std::string failed_call;
  explicit CudnnConvDescriptors(const rt::cuda_plan::ConvPlan& p);
  ~CudnnConvDescriptors();
  CudnnConvDescriptors(const CudnnConvDescriptors&) = delete;
  CudnnConvDescriptors& operator=(const CudnnConvDescriptors&) = delete;
};

}  // namespace mpq::cuda
