#pragma once
// The library-backed entry points (cuBLASLt GEMM, cuDNN convolution), declared for both sides
// like kernels/ops.h:
//  - mpq::cuda::gpu (kernels/gpu_libs.cpp, in the plugin): cublasLtMatmul with a cached heuristic
//    choice, cudnnConvolutionForward / BackwardData / BackwardFilter with a cached algorithm per
//    direction (the backward ones deterministic only, written after the H100 run: not yet run on
//    a GPU); when the library declines a problem
//    (no algorithm, no engine within the workspace budget) they run the direct bodies of
//    kernels/bodies/linalg.cuh on the device instead. First run on an H100 on 2026-11-26.
//  - mpq::cuda::host (kernels/host_harness.cu): the direct bodies over the geometry the plan
//    describes (matmul_geom / conv_geom below), so the host tests check every plan -- operand swap,
//    transposes, leading dimensions, batch strides, groups, pads -- against mpq's CPU kernels.
// Plain C++ (the plans are plain data; no CUDA headers).
#include <cstddef>

#include "kernels/ops.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"

namespace mpq::cuda {

// 0 on success; else the failing library (rt::cuda_plan::CudaLibrary's order: 0 CUDA runtime,
// 1 cuBLASLt, 2 cuDNN), its status code and the call, for rt::cuda_plan::fail_cuda_status.
struct LibStatus {
  int library = 0;
  int code = 0;
  const char* call = "";
  bool ok() const { return code == 0; }
};

// The statuses the host side reports for what its direct bodies do not take (non-FP32 types);
// kernels/gpu_libs.cpp checks them against the library headers.
inline constexpr int kCublasStatusNotSupported = 15;  // CUBLAS_STATUS_NOT_SUPPORTED
inline constexpr int kCudnnStatusNotSupported = 3000;  // CUDNN_STATUS_NOT_SUPPORTED

// The plan's problem as the direct body computes it. cuBLASLt's A is mpq's B (see plan_gemm.h), so
// the body is called with (mpq B, mpq A).
inline MatmulGeom matmul_geom(const rt::cuda_plan::GemmPlan& p) {
  MatmulGeom g;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.trans_a = p.op_a_transposed;
  g.trans_b = p.op_b_transposed;
  g.lda = p.a.ld;
  g.ldb = p.b.ld;
  g.ldc = p.c.ld;
  g.batch = p.c.batch;
  g.stride_a = p.a.batch > 1 ? p.a.batch_stride : 0;
  g.stride_b = p.b.batch > 1 ? p.b.batch_stride : 0;
  g.stride_c = p.c.batch > 1 ? p.c.batch_stride : 0;
  return g;
}

inline bool gemm_is_fp32(const rt::cuda_plan::GemmPlan& p) {
  using rt::cuda_plan::LtType;
  return p.a.type == LtType::F32 && p.b.type == LtType::F32 && p.c.type == LtType::F32;
}

// cuDNN's 4-D (2-D convolution, 1-D as H = 1) or 5-D descriptors as one NCDHW geometry.
inline ConvGeom conv_geom(const rt::cuda_plan::ConvPlan& p) {
  ConvGeom g;
  const size_t nd = p.x.dims.size();
  const size_t sp = nd - 2;  // 2 or 3 spatial dimensions
  g.n = p.x.dims[0];
  g.c = p.x.dims[1];
  g.m = p.w.dims[0];
  g.group = p.group;
  auto pick = [&](const std::vector<int>& v, size_t from, int64_t fill, int64_t* d, int64_t* h, int64_t* w) {
    *d = sp == 3 ? v[from] : fill;
    *h = v[from + sp - 2];
    *w = v[from + sp - 1];
  };
  pick(p.x.dims, 2, 1, &g.id, &g.ih, &g.iw);
  pick(p.y.dims, 2, 1, &g.od, &g.oh, &g.ow);
  pick(p.w.dims, 2, 1, &g.kd, &g.kh, &g.kw);
  pick(p.strides, 0, 1, &g.sd, &g.sh, &g.sw);
  pick(p.pads, 0, 0, &g.pd, &g.ph, &g.pw);
  pick(p.dilations, 0, 1, &g.dd, &g.dh, &g.dw);
  return g;
}

#define MPQ_CUDA_DECLARE_LIBS                                                                                     \
  /* C = A * B for mpq's row-major A and B as the plan describes (C's type per the plan) */                     \
  LibStatus gemm(const rt::cuda_plan::GemmPlan& p, const void* a, const void* b, void* c, void* workspace,       \
                 size_t workspace_bytes, const LaunchCtx& ctx);                                                  \
  /* the workspace the chosen forward algorithm needs (0 for the direct body) */                                 \
  LibStatus conv_workspace(const rt::cuda_plan::ConvPlan& p, size_t* bytes, const LaunchCtx& ctx);              \
  LibStatus conv_forward(const rt::cuda_plan::ConvPlan& p, const float* x, const float* w, float* y,             \
                         void* workspace, size_t workspace_bytes, const LaunchCtx& ctx);                         \
  /* backward (training): the workspace the chosen backward-data / backward-filter algorithm needs */             \
  LibStatus conv_backward_workspace(const rt::cuda_plan::ConvPlan& p, rt::cuda_plan::ConvDirection direction,    \
                                    size_t* bytes, const LaunchCtx& ctx);                                        \
  /* dX = the plan's convolution transposed applied to dY (X's descriptor for dX) */                            \
  LibStatus conv_backward_data(const rt::cuda_plan::ConvPlan& p, const float* w, const float* dy, float* dx,     \
                               void* workspace, size_t workspace_bytes, const LaunchCtx& ctx);                   \
  /* dW from X and dY (overwritten, not accumulated) */                                                          \
  LibStatus conv_backward_filter(const rt::cuda_plan::ConvPlan& p, const float* x, const float* dy, float* dw,   \
                                 void* workspace, size_t workspace_bytes, const LaunchCtx& ctx);                 \
  /* the library state bound to a stream that is about to be destroyed (cuDNN's handle) */                       \
  void release_stream(void* stream);

namespace host {
MPQ_CUDA_DECLARE_LIBS
}
namespace gpu {
MPQ_CUDA_DECLARE_LIBS
}

}  // namespace mpq::cuda
