#pragma once
// cuDNN 9 convolution plans (legacy cudnnConvolution* API: forward, backward-data,
// backward-filter) as plain data: the Nd tensor/filter/convolution descriptor contents, math type
// and workspace budget. Built on the host and unit-tested without a GPU; tests/cuda/
// cudnn_descriptors_test.cpp sets the real cuDNN descriptors from them (host-only calls) and checks
// cuDNN agrees on the output shape.
#include <cstdint>
#include <string>
#include <vector>

namespace mpq::rt::cuda_plan {

enum class ConvDataType { F32, F16, BF16 };
enum class ConvMath { Default, TensorOp, TensorOpAllowConversion, Fma };
enum class ConvDirection { Forward, BackwardData, BackwardFilter };

struct ConvRequest {
  std::vector<int64_t> x;  // [N, C, D1..Dk], k = 1..3
  std::vector<int64_t> w;  // [M, C/group, K1..Kk]
  std::vector<int64_t> strides, dilations;  // k values or empty (1)
  std::vector<int64_t> pads;                // 2k values (begins, ends) or empty (0)
  int64_t group = 1;
  ConvDataType type = ConvDataType::F32;
  bool allow_tf32 = false;
  size_t free_device_bytes = 0;  // 0: unknown
};

// Dimensions and packed strides of a cuDNN Nd descriptor (1-D convolutions become 2-D with H = 1,
// because cuDNN's Nd API starts at 4-D tensors).
struct NdDesc {
  std::vector<int> dims, strides;
};

struct ConvPlan {
  bool use_cudnn = false;
  std::string fallback_reason;  // e.g. asymmetric padding, rank > 3
  NdDesc x, w, y;               // w: filter dims only (packed NCHW)
  std::vector<int> pads, strides, dilations;  // spatial, symmetric pads (cuDNN has one pad per dim)
  int group = 1;
  ConvDataType type = ConvDataType::F32;
  ConvDataType compute = ConvDataType::F32;  // accumulation: FP32 for every input type
  ConvMath math = ConvMath::Default;
  size_t workspace_limit = 0;  // algorithms needing more are skipped by the find/heuristics step
  std::vector<int64_t> y_shape;  // mpq's output shape (1-D: without the added H)
};

ConvPlan plan_conv(const ConvRequest& r);

}  // namespace mpq::rt::cuda_plan
