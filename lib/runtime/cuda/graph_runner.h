#pragma once
// Runs a model's top-level graph node by node on a kernel table: nodes that plan_node() places on
// the device run through run_planned_node() on device tensors; every other node (and Gemm/Conv,
// whose cuBLASLt/cuDNN execution is not written) runs its CPU kernel with explicit copies of its
// inputs and outputs, logged once per op type. This is the shape the executor's CUDA path will
// take; it is not wired into Executor or `--device` yet. With host_ops_table() and host memory it
// runs whole models on this machine (tests/cuda/graph_runner_test.cpp, against the CPU executor);
// with gpu_ops_table() and cudaMalloc it is the GPU path (NEVER RUN on a GPU yet).
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/node_runner.h"
#include "runtime/executor.h"

namespace mpq::rt::gpu {

struct GraphRunStats {
  std::map<std::string, int> on_device;  // op type -> nodes run by the kernel table
  std::map<std::string, int> on_cpu;     // op type -> nodes run by the CPU kernels (with copies)
};

// Returns the graph outputs as host tensors. Nodes with subgraphs (If, Loop, Scan) are refused
// (Unsupported) for now.
std::vector<Tensor> run_graph(const ir::Model& model, const Feeds& feeds, KernelRuntime& rt, FallbackLog& log,
                              GraphRunStats* stats = nullptr);

}  // namespace mpq::rt::gpu
