#pragma once
// The kernel entry points of kernels/ops.h as a table of function pointers, so that code compiled
// by g++ (the CUDA node runner, runtime/cuda/node_runner.h) can be pointed at either side:
// host_ops_table() (the nvcc host harness, host memory; for the tests) or gpu_ops_table() (the
// __global__ launchers, device memory; exported by the plugin). Overloads get distinct names.
#include "kernels/lib_ops.h"
#include "kernels/ops.h"

namespace mpq::cuda {

struct OpsTable {
  int (*unary)(UnaryOp, float, float, const float*, float*, int64_t, const LaunchCtx&);
  int (*binary)(BinaryOp, const Broadcast2&, const float*, const float*, float*, int64_t, const LaunchCtx&);
  int (*reduce)(ReduceOp, const float*, float*, int64_t, int64_t, int64_t, const LaunchCtx&);
  int (*softmax)(bool, const float*, float*, int64_t, int64_t, int64_t, const LaunchCtx&);
  int (*layer_norm)(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, float,
                    const LaunchCtx&);
  int (*pool2d)(bool, bool, const Pool2dGeom&, const float*, float*, const LaunchCtx&);
  int (*resize2d)(const Resize2dGeom&, const float*, float*, const LaunchCtx&);
  int (*gather)(const float*, const int64_t*, float*, int64_t, int64_t, int64_t, int64_t, int*, const LaunchCtx&);
  int (*strided_copy)(const StridedView&, const float*, float*, int64_t, const LaunchCtx&);
  int (*concat_part)(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, const LaunchCtx&);
  int (*quantize_i8)(const QuantLayout&, const float*, int8_t*, const LaunchCtx&);
  int (*quantize_u8)(const QuantLayout&, const float*, uint8_t*, const LaunchCtx&);
  int (*dequantize_i8)(const QuantLayout&, const int8_t*, float*, const LaunchCtx&);
  int (*dequantize_u8)(const QuantLayout&, const uint8_t*, float*, const LaunchCtx&);
  int (*dequantize_i32)(const QuantLayout&, const int32_t*, float*, const LaunchCtx&);
  int (*fake_quant)(const QuantLayout&, const float*, float*, const LaunchCtx&);
  int (*fake_quant_bias)(const float*, const float*, const float*, int64_t, int64_t, float*, const LaunchCtx&);  // version 11
  int (*matmul)(const MatmulGeom&, const float*, const float*, float*, const LaunchCtx&);
  int (*conv_direct)(const ConvGeom&, const float*, const float*, float*, const LaunchCtx&);
  // Library-backed entries (kernels/lib_ops.h): cuBLASLt / cuDNN on the GPU, the direct bodies on
  // the host.
  LibStatus (*gemm)(const rt::cuda_plan::GemmPlan&, const void*, const void*, void*, void*, size_t, const LaunchCtx&);
  LibStatus (*conv_workspace)(const rt::cuda_plan::ConvPlan&, size_t*, const LaunchCtx&);
  LibStatus (*conv_forward)(const rt::cuda_plan::ConvPlan&, const float*, const float*, float*, void*, size_t,
                            const LaunchCtx&);
  LibStatus (*conv_backward_workspace)(const rt::cuda_plan::ConvPlan&, rt::cuda_plan::ConvDirection, size_t*,
                                       const LaunchCtx&);
  LibStatus (*conv_backward_data)(const rt::cuda_plan::ConvPlan&, const float*, const float*, float*, void*, size_t,
                                  const LaunchCtx&);
  LibStatus (*conv_backward_filter)(const rt::cuda_plan::ConvPlan&, const float*, const float*, float*, void*, size_t,
                                    const LaunchCtx&);
  // Training entries (kernels/bodies/linalg.cuh, train.cuh, spatial.cuh): the backward bodies the
  // CUDA backward runner (train/cuda/backward_runner.h) calls.
  int (*channel_grad_sum)(int64_t, int64_t, int64_t, const float*, float*, const LaunchCtx&);
  int (*unary_grad)(UnaryOp, float, const float*, const float*, const float*, float*, int64_t, const LaunchCtx&);
  int (*softmax_grad)(bool, const float*, const float*, float*, int64_t, int64_t, int64_t, const LaunchCtx&);
  int (*pool2d_grad)(bool, bool, const Pool2dGeom&, const float*, const float*, float*, const LaunchCtx&);
  int (*sum_to_shape)(const Broadcast2&, const int64_t*, const float*, float*, int64_t, const LaunchCtx&);
  int (*clip_grad)(const float*, const float*, float*, int64_t, float, float, const LaunchCtx&);
  int (*broadcast_divide)(const StridedView&, float, const float*, float*, int64_t, const LaunchCtx&);
  int (*fake_quant_backward)(const QuantLayout&, const float*, const float*, float*, double*, const LaunchCtx&);
  int (*channel_sum)(int64_t, int64_t, int64_t, const double*, const double*, float*, const LaunchCtx&);
  int (*reduce_extreme_grad)(int, const int64_t*, const bool*, const float*, const float*, const float*, float*, int64_t,
                             const LaunchCtx&);
  int (*layer_norm_grad_x)(const float*, const float*, const float*, const float*, const float*, float*, int64_t, int64_t,
                           const LaunchCtx&);
  int (*batch_norm_stats)(const float*, const float*, const float*, float*, float*, int64_t, int64_t, int64_t, float, float*,
                          float*, float, const LaunchCtx&);
  int (*batch_norm_apply)(const float*, const float*, const float*, const float*, const float*, float*, int64_t, int64_t,
                          int64_t, const LaunchCtx&);
  int (*batch_norm_grad_sums)(const float*, const float*, const float*, const float*, double*, float*, float*, int64_t, int64_t,
                              int64_t, const LaunchCtx&);
  int (*batch_norm_grad_x)(bool, const float*, const float*, const float*, const float*, const float*, const double*, float*,
                           int64_t, int64_t, int64_t, const LaunchCtx&);
  int (*resize2d_grad)(const Resize2dGeom&, const float*, float*, const LaunchCtx&);
  int (*slice_grad)(const SliceGeom&, const float*, float*, int64_t, const LaunchCtx&);
  int (*prelu_grad)(const Broadcast2&, const float*, const float*, const float*, float*, float*, int64_t, const LaunchCtx&);
  int (*where_grad)(const Broadcast2&, const bool*, const float*, float*, int64_t, bool, const LaunchCtx&);
  int (*gather_grad_indexed)(const int64_t*, const int64_t*, const float*, float*, int64_t, int64_t, int64_t, int64_t,
                             const LaunchCtx&);
  int (*layer_norm_grad_params)(const float*, const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                                const LaunchCtx&);
  // The parameter update (version 7): GradScaler's unscale, the global gradient norm's partial sums,
  // SGD and AdamW steps and the divergence check (train/cuda/device_parameters.h).
  int (*unscale)(float, float*, int64_t, int*, const LaunchCtx&);
  int (*sum_squares)(const float*, int64_t, double*, bool, const LaunchCtx&);
  int (*sum_partials)(const double*, int64_t, double*, const LaunchCtx&);
  int (*check_values)(const float*, int64_t, bool, int*, const LaunchCtx&);
  int (*sgd_step)(const SgdStep&, float*, const float*, float*, int64_t, const LaunchCtx&);
  int (*adamw_step)(const AdamWStep&, float*, const float*, float*, float*, int64_t, const LaunchCtx&);
  void (*release_stream)(void*);
  // Mixed precision (version 10): FP32 <-> FP16 / BF16 storage conversions.
  int (*convert_float)(FloatConvert, const void*, void*, int64_t, const LaunchCtx&);
};

const OpsTable& host_ops_table();  // in mpq_cuda_host
const OpsTable& gpu_ops_table();   // in mpq_cuda_gpu_ops

}  // namespace mpq::cuda
