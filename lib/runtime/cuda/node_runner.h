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
};

// `inputs`: device tensors (undefined for omitted optional inputs). Returns one device tensor per
// node output (LayerNormalization: Y, Mean, InvStdDev). Gemm and Conv go through the table's
// library entries (cuBLASLt / cuDNN on the GPU, the direct bodies on the host) with workspace from
// the caching allocator and the bias added by the Add body. Throws Unsupported for Fallback plans
// and for library statuses of the *_NOT_SUPPORTED kind: the caller runs the CPU kernel instead.
std::vector<Tensor> run_planned_node(const cuda_plan::NodeLaunch& l, const ir::Node& node, const std::vector<Tensor>& inputs,
                                     KernelRuntime& rt);

}  // namespace mpq::rt::gpu
