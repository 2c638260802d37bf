#include "kernels/lib_descriptors.h"

#include <cstdint>

namespace mpq::cuda {

using rt::cuda_plan::ConvDataType;
using rt::cuda_plan::ConvMath;
using rt::cuda_plan::LtCompute;
using rt::cuda_plan::LtType;

cudaDataType_t to_cuda(LtType t) {
  switch (t) {
    case LtType::F32: return CUDA_R_32F;
    case LtType::F16: return CUDA_R_16F;
    case LtType::BF16: return CUDA_R_16BF;
    case LtType::I8: return CUDA_R_8I;
    case LtType::I32: return CUDA_R_32I;
  }
  return CUDA_R_32F;
}

cublasComputeType_t to_cublas(LtCompute c) {
  switch (c) {
    case LtCompute::F32: return CUBLAS_COMPUTE_32F;
    case LtCompute::F32_FAST_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case LtCompute::I32: return CUBLAS_COMPUTE_32I;
  }
  return CUBLAS_COMPUTE_32F;
}

cudnnDataType_t to_cudnn(ConvDataType t) {
  switch (t) {
    case ConvDataType::F32: return CUDNN_DATA_FLOAT;
    case ConvDataType::F16: return CUDNN_DATA_HALF;
    case ConvDataType::BF16: return CUDNN_DATA_BFLOAT16;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnMathType_t to_cudnn(ConvMath m) {
  switch (m) {
    case ConvMath::Default: return CUDNN_DEFAULT_MATH;
    case ConvMath::TensorOp: return CUDNN_TENSOR_OP_MATH;
    case ConvMath::TensorOpAllowConversion: return CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    case ConvMath::Fma: return CUDNN_FMA_MATH;
  }
  return CUDNN_DEFAULT_MATH;
}

namespace {
// Records the first failure; later calls are skipped.
template <class F>
void step(int& status, std::string& failed, const char* call, F&& f) {
  if (status != 0) return;
  const int s = static_cast<int>(f());
  if (s != 0) {
    status = s;
    failed = call;
  }
}
}  // namespace

LtGemmDescriptors::LtGemmDescriptors(const rt::cuda_plan::GemmPlan& p) {
  const cudaDataType_t scale = to_cuda(p.scale_type);
  step(status, failed_call, "cublasLtMatmulDescCreate", [&] { return cublasLtMatmulDescCreate(&op, to_cublas(p.compute), scale); });
  const cublasOperation_t ta = p.op_a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.op_b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  step(status, failed_call, "cublasLtMatmulDescSetAttribute(TRANSA)",
       [&] { return cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta); });
  step(status, failed_call, "cublasLtMatmulDescSetAttribute(TRANSB)",
       [&] { return cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb); });
  auto layout = [&](cublasLtMatrixLayout_t* out, const rt::cuda_plan::LtLayout& l, const char* name) {
    step(status, failed_call, name, [&] {
      return cublasLtMatrixLayoutCreate(out, to_cuda(l.type), static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.cols), l.ld);
    });
    if (l.batch > 1) {
      const int32_t count = static_cast<int32_t>(l.batch);
      const int64_t stride = l.batch_stride;
      step(status, failed_call, "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)",
           [&] { return cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count); });
      step(status, failed_call, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", [&] {
        return cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
      });
    }
  };
  layout(&a, p.a, "cublasLtMatrixLayoutCreate(A)");
  layout(&b, p.b, "cublasLtMatrixLayoutCreate(B)");
  layout(&c, p.c, "cublasLtMatrixLayoutCreate(C)");
  step(status, failed_call, "cublasLtMatmulPreferenceCreate", [&] { return cublasLtMatmulPreferenceCreate(&pref); });
  const uint64_t ws = p.workspace_bytes;
  step(status, failed_call, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", [&] {
    return cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  });
  const uint32_t al[3] = {static_cast<uint32_t>(p.align_a), static_cast<uint32_t>(p.align_b), static_cast<uint32_t>(p.align_c)};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    step(status, failed_call, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", [&] {
      return cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &al[i < 3 ? i : 2], sizeof(uint32_t));
    });
}

LtGemmDescriptors::~LtGemmDescriptors() {
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (op) cublasLtMatmulDescDestroy(op);
}

CudnnConvDescriptors::CudnnConvDescriptors(const rt::cuda_plan::ConvPlan& p) {
  const cudnnDataType_t t = to_cudnn(p.type);
  const int nd = static_cast<int>(p.x.dims.size());
  step(status, failed_call, "cudnnCreateTensorDescriptor", [&] { return cudnnCreateTensorDescriptor(&x); });
  step(status, failed_call, "cudnnCreateTensorDescriptor", [&] { return cudnnCreateTensorDescriptor(&y); });
  step(status, failed_call, "cudnnCreateFilterDescriptor", [&] { return cudnnCreateFilterDescriptor(&w); });
  step(status, failed_call, "cudnnCreateConvolutionDescriptor", [&] { return cudnnCreateConvolutionDescriptor(&conv); });
  step(status, failed_call, "cudnnSetTensorNdDescriptor(X)",
       [&] { return cudnnSetTensorNdDescriptor(x, t, nd, p.x.dims.data(), p.x.strides.data()); });
  step(status, failed_call, "cudnnSetFilterNdDescriptor",
       [&] { return cudnnSetFilterNdDescriptor(w, t, CUDNN_TENSOR_NCHW, nd, p.w.dims.data()); });
  step(status, failed_call, "cudnnSetConvolutionNdDescriptor", [&] {
    return cudnnSetConvolutionNdDescriptor(conv, nd - 2, p.pads.data(), p.strides.data(), p.dilations.data(),
                                           CUDNN_CROSS_CORRELATION, to_cudnn(p.compute));
  });
  step(status, failed_call, "cudnnSetConvolutionGroupCount", [&] { return cudnnSetConvolutionGroupCount(conv, p.group); });
  step(status, failed_call, "cudnnSetConvolutionMathType", [&] { return cudnnSetConvolutionMathType(conv, to_cudnn(p.math)); });
  step(status, failed_call, "cudnnSetTensorNdDescriptor(Y)",
       [&] { return cudnnSetTensorNdDescriptor(y, t, nd, p.y.dims.data(), p.y.strides.data()); });
}

CudnnConvDescriptors::~CudnnConvDescriptors() {
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (x) cudnnDestroyTensorDescriptor(x);
}

}  // namespace mpq::cuda
