#pragma once
// Runs one node planned by plan_node() through a kernel table: allocates the outputs from the
// caching allocator, wires the plan's parameters into the kernel entry point, checks the launch
// status (errors name the node and op). With the plugin's gpu_ops_table() and real device memory
// this is the CUDA executor's inner step (run on an H100 by scripts/gpu_check.sh (docs/gpu.md)); the host tests point it at
// host_ops_table() and a host-memory backend, so the whole path from ONNX node to kernel body is
// checked against the CPU kernels here (tests/cuda/node_runner_test.cpp).
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "kernels/ops_table.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/node_plan.h"

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::rt::gpu {

struct KernelRuntime {
  const cuda::OpsTable& ops;
  CachingAllocator& alloc;
  DeviceMemoryBackend& backend;
  void* stream = nullptr;
  // Threads for the nodes that fall back to their CPU kernels (null: one thread).
  ThreadPool* cpu_pool = nullptr;
  // Pinned memory for the graph's input and output copies (null: pageable copies).
  PinnedStaging* staging = nullptr;
  // What the graph runner plans with (TF32 for FP32 GEMMs and convolutions when asked).
  cuda_plan::PlanOptions plan = {};
};

// The pieces every device step of a node uses, with errors that name the node and op (the
// forward runner here and the training backward runner, train/cuda/backward_runner.h):
// a launch shape for `work` items on the runtime's stream; a launch status or a library status
// turned into an mpq error; an uninitialized output from the caching allocator; library workspace
// (a byte tensor, undefined when 0 bytes) and its pointer (null when undefined).
cuda::LaunchCtx node_launch_ctx(const KernelRuntime& rt, int64_t work);
void check_node_launch(const KernelRuntime& rt, const ir::Node& node, int code, const char* what);
void check_node_library(const KernelRuntime& rt, const ir::Node& node, const cuda::LibStatus& st);
Tensor node_output(KernelRuntime& rt, const ir::Node& node, DType dtype, const Shape& shape);
Tensor node_workspace(KernelRuntime& rt, const ir::Node& node, size_t bytes);
inline void* workspace_ptr(Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// `inputs`: device tensors (undefined for omitted optional inputs). Returns one device tensor per
// node output (LayerNormalization: Y, Mean, InvStdDev). Gemm and Conv go through the table's
// library entries (cuBLASLt / cuDNN on the GPU, the direct bodies on the host) with workspace from
// the caching allocator and the bias added by the Add body. Throws Unsupported for Fallback plans
// and for library statuses of the *_NOT_SUPPORTED kind: the caller runs the CPU kernel instead.
std::vector<Tensor> run_planned_node(const cuda_plan::NodeLaunch& l, const ir::Node& node, const std::vector<Tensor>& inputs,
                                     KernelRuntime& rt);

}  // namespace mpq::rt::gpu
