#pragma once
// Naive scalar reference implementations of the compute-heavy ops (Conv, ConvTranspose, Gemm,
// MatMul, MaxPool, AveragePool). They are the ground truth that the fast CPU kernels (and later
// the CUDA kernels) are tested against: one loop nest per op, accumulation in double, every
// attribute already resolved (explicit pads, no auto_pad), no threads, no BLAS. Slow on purpose.
//
// Layouts follow ONNX: X is [N, C, D1, ..., Dk] with any number k >= 1 of spatial dimensions.
// Float32 and float64 tensors are accepted (matmul_ref and gemm_ref also take integer types).
// Shape errors are reported as mpq::Error (BadInput).
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mpq::rt::cpu {

// Resolved geometry of a convolution or pooling window over k spatial dimensions.
struct WindowGeometry {
  std::vector<int64_t> kernel;     // k window sizes (pools; conv takes them from W)
  std::vector<int64_t> strides;    // k values (empty: all 1)
  std::vector<int64_t> dilations;  // k values (empty: all 1)
  std::vector<int64_t> pads;       // 2k values: all begins, then all ends (empty: all 0)
  int64_t group = 1;               // conv only
  bool ceil_mode = false;          // pools only
};

// Y[n, m, o...] = B[m] + sum_{c in group(m), k...} X[n, c, o*s + k*d - pad_begin] * W[m, c, k...]
// W is [M, C/group, K1..Kk]; bias (may be null) is [M].
Tensor conv_ref(const Tensor& x, const Tensor& w, const Tensor* bias, const WindowGeometry& g);

// Transposed convolution: every X[n, c, i...] scatters X * W[c, m, k...] to
// Y[n, m, i*s + k*d - pad_begin]. W is [C, M/group, K1..Kk]; the output size per dimension is
// s*(in-1) + output_padding + (K-1)*d + 1 - pad_begin - pad_end.
Tensor conv_transpose_ref(const Tensor& x, const Tensor& w, const Tensor* bias, const WindowGeometry& g,
                          const std::vector<int64_t>& output_padding = {});

// alpha * op(A) * op(B) + beta * C, with C (may be null) unidirectionally broadcast to [M, N].
Tensor gemm_ref(const Tensor& a, const Tensor& b, const Tensor* c, double alpha, double beta, bool trans_a,
                bool trans_b);

// numpy.matmul: 1-D operands promoted (and the added dimension removed), batch dimensions broadcast.
Tensor matmul_ref(const Tensor& a, const Tensor& b);

// Output spatial size of a pooling window (ceil_mode: a last window must start inside the input
// or its begin padding, as in ONNX Runtime and PyTorch).
int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad_begin,
                         int64_t pad_end, bool ceil_mode);

// Max over each window (padding never wins). When `indices` is given it receives the flat index
// into X of each maximum (first one on ties), row-major (storage_order 0) or with the spatial
// dimensions in column-major order (storage_order 1).
Tensor max_pool_ref(const Tensor& x, const WindowGeometry& g, Tensor* indices = nullptr, int storage_order = 0);

// Mean over each window. count_include_pad: divide by the taps inside the padded input (the
// ceil_mode overhang past the end padding never counts); otherwise by the taps inside X.
Tensor avg_pool_ref(const Tensor& x, const WindowGeometry& g, bool count_include_pad);

}  // namespace mpq::rt::cpu
