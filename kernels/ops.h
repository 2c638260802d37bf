#pragma once
// Entry points of the shared kernel bodies, declared twice with the same signatures:
//  - mpq::cuda::host: the host harness (kernels/host_harness.cu, compiled by nvcc) runs the bodies
//    on the CPU over every block and thread of ctx.shape; pointers are host pointers.
//  - mpq::cuda::gpu: thin __global__ launchers (kernels/gpu_*.cu); pointers are device pointers,
//    launched on ctx.stream. Only ever run on a GPU machine (scripts/gpu_check.sh).
// Every function returns 0 or a cudaError_t code (the launch status); callers turn non-zero codes
// into mpq errors naming the node and op (kernels/status.h). Plain C++: no CUDA headers needed.
#include <cstdint>

#include "kernels/params.h"

namespace mpq::cuda {

struct LaunchCtx {
  LaunchShape shape;
  void* stream = nullptr;  // cudaStream_t; ignored by the host harness
};

#define MPQ_CUDA_DECLARE_OPS                                                                                        \
  int unary(UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n, const LaunchCtx& c);        \
  /* mixed precision: FP32 <-> FP16 / BF16 storage (x, y: float or uint16_t as kind says) */                      \
  int convert_float(FloatConvert kind, const void* x, void* y, int64_t n, const LaunchCtx& c);                    \
  int binary(BinaryOp op, const Broadcast2& bc, const float* a, const float* b, float* y, int64_t n,               \
             const LaunchCtx& c);                                                                                   \
  int reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t n, int64_t inner, const LaunchCtx& c);  \
  int softmax(bool log, const float* x, float* y, int64_t outer, int64_t n, int64_t inner, const LaunchCtx& c);    \
  int layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* inv_std,     \
                 int64_t rows, int64_t n, float epsilon, const LaunchCtx& c);                                       \
  int pool2d(bool is_max, bool count_include_pad, const Pool2dGeom& g, const float* x, float* y,                   \
             const LaunchCtx& c);                                                                                   \
  /* backward: x is read by MaxPool only (may be null for AveragePool) */                                         \
  int pool2d_grad(bool is_max, bool count_include_pad, const Pool2dGeom& g, const float* x, const float* dy,       \
                  float* dx, const LaunchCtx& c);                                                                   \
  int resize2d(const Resize2dGeom& g, const float* x, float* y, const LaunchCtx& c);                              \
  int resize2d_grad(const Resize2dGeom& g, const float* dy, float* dx, const LaunchCtx& c);                       \
  int gather(const float* x, const int64_t* indices, float* y, int64_t outer, int64_t axis_len, int64_t inner,     \
             int64_t count, int* bad, const LaunchCtx& c);                                                          \
  int strided_copy(const StridedView& v, const float* x, float* y, int64_t n, const LaunchCtx& c);                \
  int gather_grad(const int64_t* indices, const float* dy, float* dx, int64_t outer, int64_t axis_len,            \
                  int64_t inner, int64_t count, const LaunchCtx& c);                                              \
  /* offsets: axis_len + 1 row starts into positions (count index positions, grouped by row) */                   \
  int gather_grad_indexed(const int64_t* offsets, const int64_t* positions, const float* dy, float* dx,          \
                          int64_t outer, int64_t axis_len, int64_t inner, int64_t count, const LaunchCtx& c);      \
  int slice_grad(const SliceGeom& g, const float* dy, float* dx, int64_t n, const LaunchCtx& c);                   \
  int concat_part(const float* x, float* y, int64_t outer, int64_t part, int64_t inner, int64_t total,             \
                  int64_t offset, const LaunchCtx& c);                                                              \
  int quantize(const QuantLayout& l, const float* x, int8_t* q, const LaunchCtx& c);                              \
  int quantize(const QuantLayout& l, const float* x, uint8_t* q, const LaunchCtx& c);                             \
  int quantize(const QuantLayout& l, const float* x, int32_t* q, const LaunchCtx& c);                             \
  int dequantize(const QuantLayout& l, const int8_t* q, float* y, const LaunchCtx& c);                            \
  int dequantize(const QuantLayout& l, const uint8_t* q, float* y, const LaunchCtx& c);                           \
  int dequantize(const QuantLayout& l, const int32_t* q, float* y, const LaunchCtx& c);                           \
  int fake_quant(const QuantLayout& l, const float* x, float* y, const LaunchCtx& c);                             \
  /* mpq FakeQuantBias: b at scale input_scale * weight_scale[c] (n_weight_scales 1 or n) */                      \
  int fake_quant_bias(const float* b, const float* input_scale, const float* weight_scales, int64_t n,            \
                      int64_t n_weight_scales, float* y, const LaunchCtx& c);                                       \
  int fake_quant_backward(const QuantLayout& l, const float* x, const float* dy, float* dx, double* scale_terms,   \
                          const LaunchCtx& c);                                                                      \
  int channel_sum(int64_t outer, int64_t channels, int64_t inner, const double* terms, const double* factor,       \
                  float* out, const LaunchCtx& c);                                                                  \
  /* partial: one entry per launched thread (blocks * threads); out: one entry */                                  \
  int min_max(const float* x, int64_t n, MinMaxPartial* partial, MinMaxPartial* out, const LaunchCtx& c);          \
  int histogram(const float* x, int64_t n, float scale, int bins, unsigned long long* counts, const LaunchCtx& c);  \
  /* direct FP32 matrix product / convolution (kernels/bodies/linalg.cuh) */                                       \
  int matmul(const MatmulGeom& g, const float* a, const float* b, float* c, const LaunchCtx& ctx);                  \
  int conv_direct(const ConvGeom& g, const float* x, const float* w, float* y, const LaunchCtx& ctx);               \
  /* convolution backward (direct bodies): dX from W and dY, dW from X and dY, dB per channel of dY [n, c, s] */    \
  int conv_grad_data(const ConvGeom& g, const float* w, const float* dy, float* dx, const LaunchCtx& ctx);          \
  int conv_grad_filter(const ConvGeom& g, const float* x, const float* dy, float* dw, const LaunchCtx& ctx);        \
  int channel_grad_sum(int64_t n, int64_t c, int64_t s, const float* dy, float* db, const LaunchCtx& ctx);         \
  /* training (kernels/bodies/train.cuh); in_dims: the input's shape aligned to bc.rank */                         \
  int unary_grad(UnaryOp op, float alpha, const float* x, const float* y, const float* dy, float* dx, int64_t n,   \
                 const LaunchCtx& c);                                                                               \
  int softmax_grad(bool log, const float* y, const float* dy, float* dx, int64_t outer, int64_t n, int64_t inner,  \
                   const LaunchCtx& c);                                                                             \
  /* mean, inv_std: the forward's per-row outputs; gamma: n values; dgamma/dbeta may be null */                   \
  int layer_norm_grad_x(const float* x, const float* mean, const float* inv_std, const float* gamma,               \
                        const float* dy, float* dx, int64_t rows, int64_t n, const LaunchCtx& c);                 \
  int layer_norm_grad_params(const float* x, const float* mean, const float* inv_std, const float* dy,            \
                             float* dgamma, float* dbeta, int64_t rows, int64_t n, const LaunchCtx& c);           \
  /* BatchNormalization over [n, f, s]: stats from the batch (running_mean null) or the running ones; */         \
  /* update_mean/update_var (training, may be null): running statistics moved in place with momentum */          \
  int batch_norm_stats(const float* x, const float* running_mean, const float* running_var, float* mean,          \
                       float* inv_std, int64_t n, int64_t f, int64_t s, float epsilon, float* update_mean,         \
                       float* update_var, float momentum, const LaunchCtx& c);                                    \
  int batch_norm_apply(const float* x, const float* scale, const float* bias, const float* mean,                   \
                       const float* inv_std, float* y, int64_t n, int64_t f, int64_t s, const LaunchCtx& c);      \
  /* sums: 2 doubles per feature, read by batch_norm_grad_x in training; dscale/dbias may be null */               \
  int batch_norm_grad_sums(const float* x, const float* mean, const float* inv_std, const float* dy, double* sums,  \
                           float* dscale, float* dbias, int64_t n, int64_t f, int64_t s, const LaunchCtx& c);     \
  int batch_norm_grad_x(bool training, const float* x, const float* mean, const float* inv_std,                    \
                        const float* scale, const float* dy, const double* sums, float* dx, int64_t n, int64_t f, \
                        int64_t s, const LaunchCtx& c);                                                            \
  int clip_grad(const float* x, const float* dy, float* dx, int64_t n, float lo, float hi, const LaunchCtx& c);       \
  /* ReduceSum/ReduceMean/GlobalAveragePool backward: dx[i] = dy[view(i)] / divisor */                            \
  int broadcast_divide(const StridedView& view, float divisor, const float* dy, float* dx, int64_t n,              \
                       const LaunchCtx& c);                                                                         \
  /* ReduceMax/Min (y given) and GlobalMaxPool (y null) backward; reduced: rank flags */                           \
  int reduce_extreme_grad(int rank, const int64_t* in_dims, const bool* reduced, const float* x, const float* y,    \
                          const float* dy, float* dx, int64_t kept_n, const LaunchCtx& c);                         \
  int prelu_grad(const Broadcast2& bc, const float* x, const float* slope, const float* dy, float* dx,             \
                 float* slope_term, int64_t n, const LaunchCtx& c);                                                \
  int where_grad(const Broadcast2& bc, const bool* cond, const float* dy, float* masked, int64_t n, bool take,      \
                 const LaunchCtx& c);                                                                               \
  int sum_to_shape(const Broadcast2& bc, const int64_t* in_dims, const float* dy, float* din, int64_t in_n,         \
                   const LaunchCtx& c);                                                                             \
  /* g *= inv_scale; found_inf (may be null) set to 1 on a non-finite result */                                   \
  int unscale(float inv_scale, float* g, int64_t n, int* found_inf, const LaunchCtx& c);                          \
  /* partials: one double per launched thread, stored (or added to with accumulate) */                            \
  int sum_squares(const float* g, int64_t n, double* partials, bool accumulate, const LaunchCtx& c);              \
  int sum_partials(const double* partials, int64_t n, double* total, const LaunchCtx& c);                         \
  int check_values(const float* w, int64_t n, bool positive, int* flag, const LaunchCtx& c);                      \
  int sgd_step(const SgdStep& s, float* w, const float* g, float* buf, int64_t n, const LaunchCtx& c);            \
  int adamw_step(const AdamWStep& s, float* w, const float* g, float* m, float* v, int64_t n, const LaunchCtx& c);

namespace host {
MPQ_CUDA_DECLARE_OPS
}
namespace gpu {
MPQ_CUDA_DECLARE_OPS
}

}  // namespace mpq::cuda
