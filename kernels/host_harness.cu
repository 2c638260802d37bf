// The host harness: nvcc compiles the kernel bodies here as __host__ code and runs each over every
// (block, thread) of the launch, one after another. The Catch2 tests in tests/cuda/ call these
// through kernels/ops.h and compare with mpq's CPU kernels and references; this is how the bodies
// are verified on machines without a GPU. Part of the static library mpq_cuda_host, not the plugin.
#include <vector>

#include "kernels/bodies/elementwise.cuh"
#include "kernels/bodies/linalg.cuh"
#include "kernels/bodies/quant.cuh"
#include "kernels/bodies/reduce.cuh"
#include "kernels/bodies/shape.cuh"
#include "kernels/bodies/spatial.cuh"
#include "kernels/bodies/train.cuh"
#include "kernels/grid.cuh"
#include "kernels/ops.h"
#include "kernels/ops_table.h"

namespace mpq::cuda::host {

namespace {
template <class Body>
int run(const Body& body, const LaunchCtx& c) {
  return run_on_host_grid(body, c.shape);
}
template <class T>
class Scratch {
 public:
  Scratch(size_t n, const LaunchCtx&) : v_(n ? n : 1) {}
  T* get() { return v_.data(); }
  int status() const { return 0; }

 private:
  std::vector<T> v_;
};
#include "kernels/chunk_sums.inc"
}  // namespace

#include "kernels/ops_data.inc"
#include "kernels/ops_elementwise.inc"
#include "kernels/ops_linalg.inc"
#include "kernels/ops_quant.inc"
#include "kernels/ops_train.inc"

// The library entries on the host: the direct bodies over the plan's geometry (kernels/lib_ops.h).
LibStatus gemm(const rt::cuda_plan::GemmPlan& p, const void* a, const void* b, void* c, void*, size_t,
               const LaunchCtx& ctx) {
  if (!gemm_is_fp32(p)) return LibStatus{1, kCublasStatusNotSupported, "direct matmul (FP32 only on the host)"};
  // cuBLASLt's A is mpq's B.
  matmul(matmul_geom(p), static_cast<const float*>(b), static_cast<const float*>(a), static_cast<float*>(c), ctx);
  return {};
}
void release_stream(void*) {}  // nothing is bound to streams on the host
LibStatus conv_workspace(const rt::cuda_plan::ConvPlan&, size_t* bytes, const LaunchCtx&) {
  *bytes = 0;
  return {};
}
LibStatus conv_forward(const rt::cuda_plan::ConvPlan& p, const float* x, const float* w, float* y, void*, size_t,
                       const LaunchCtx& ctx) {
  if (p.type != rt::cuda_plan::ConvDataType::F32)
    return LibStatus{2, kCudnnStatusNotSupported, "direct convolution (FP32 only on the host)"};
  conv_direct(conv_geom(p), x, w, y, ctx);
  return {};
}
LibStatus conv_backward_workspace(const rt::cuda_plan::ConvPlan&, rt::cuda_plan::ConvDirection, size_t* bytes,
                                  const LaunchCtx&) {
  *bytes = 0;
  return {};
}
LibStatus conv_backward_data(const rt::cuda_plan::ConvPlan& p, const float* w, const float* dy, float* dx, void*, size_t,
                             const LaunchCtx& ctx) {
  if (p.type != rt::cuda_plan::ConvDataType::F32)
    return LibStatus{2, kCudnnStatusNotSupported, "direct convolution backward-data (FP32 only on the host)"};
  conv_grad_data(conv_geom(p), w, dy, dx, ctx);
  return {};
}
LibStatus conv_backward_filter(const rt::cuda_plan::ConvPlan& p, const float* x, const float* dy, float* dw, void*, size_t,
                               const LaunchCtx& ctx) {
  if (p.type != rt::cuda_plan::ConvDataType::F32)
    return LibStatus{2, kCudnnStatusNotSupported, "direct convolution backward-filter (FP32 only on the host)"};
  conv_grad_filter(conv_geom(p), x, dy, dw, ctx);
  return {};
}

}  // namespace mpq::cuda::host

namespace mpq::cuda {
const OpsTable& host_ops_table() {
  static const OpsTable table = [] {
    using namespace host;
#include "kernels/ops_table.inc"
  }();
  return table;
}
}  // namespace mpq::cuda
