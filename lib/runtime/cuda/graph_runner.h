#pragma once
// Runs a model's top-level graph node by node on a kernel table: nodes that plan_node() places on
// the device run through run_planned_node() on device tensors (Gemm/Conv through cuBLASLt/cuDNN);
// every other node -- and any node whose library call reports NOT_SUPPORTED -- runs its CPU kernel
// with explicit copies of its inputs and outputs, logged once per op type. A value's device buffer
// goes back to the caching allocator after its last reader. This is the executor's CUDA path
// (Executor with BackendKind::CUDA). With host_ops_table() and host memory it runs whole models on
// this machine (tests/cuda/graph_runner_test.cpp, against the CPU executor); with the plugin's
// gpu_ops_table() and cudaMalloc it is the GPU path (run on an H100 by scripts/gpu_check.sh (docs/gpu.md)).
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/node_runner.h"
#include "runtime/executor.h"

namespace mpq::rt::gpu {

struct GraphRunStats {
  std::map<std::string, int> on_device;  // op type -> nodes run by the kernel table (Shape, Size: from the dimensions alone)
  std::map<std::string, int> on_cpu;     // op type -> nodes run by the CPU kernels (with copies)
};

// The Executor features the runner serves: an observer of every fed input and computed value
// (each copied to the host for it: calibration and per-layer validation, not fast paths) and
// intermediate values returned by name.
struct GraphRunHooks {
  const Observer* observer = nullptr;
  std::vector<std::string> extra_values;
  std::vector<Tensor>* extra_out = nullptr;
  // Device copies of the initializers kept across runs (the executor owns it): weights are
  // uploaded once, not per run. Null: uploaded per run.
  std::unordered_map<const ir::Value*, Tensor>* constants = nullptr;
};

// Returns the graph outputs as host tensors. Nodes with subgraphs (If, Loop, Scan) are refused
// (Unsupported) for now.
std::vector<Tensor> run_graph(const ir::Model& model, const Feeds& feeds, KernelRuntime& rt, FallbackLog& log,
                              GraphRunStats* stats = nullptr, const GraphRunHooks* hooks = nullptr);

}  // namespace mpq::rt::gpu
