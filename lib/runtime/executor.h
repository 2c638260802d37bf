#pragma once
// The executor: plans a graph once (execution order, one kernel per node, the last reader of
// every value) and then runs many feeds. A value's buffer is released as soon as its last reader
// has run, so it returns to the host cache and the next allocation of that size reuses it.
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "runtime/kernel.h"

namespace mpq::cuda {
struct OpsTable;
}
namespace mpq::rt::gpu {
struct DeviceMemoryBackend;
}

namespace mpq::rt {

struct ExecOptions {
  BackendKind backend = BackendKind::CPU;
  int threads = 0;  // <= 0: one per hardware thread (CPU kernels, and CUDA's CPU fallbacks)
  // Registry to take kernels from (tests pass their own); nullptr means OpRegistry::global().
  const OpRegistry* registry = nullptr;
  // BackendKind::CUDA only, for tests: run on this kernel table and memory instead of the CUDA
  // plugin's (the host harness and host memory stand in for a GPU). Both or neither.
  const cuda::OpsTable* cuda_ops = nullptr;
  gpu::DeviceMemoryBackend* cuda_memory = nullptr;
  // BackendKind::CUDA: FP32 GEMMs and convolutions may use TF32 tensor-core math (`--tf32`).
  bool allow_tf32 = false;
  // CPU, two or more threads: a batch whose rows the graph provably keeps apart runs as one part
  // per thread, each on a single-thread executor (runtime/batch_rows.h). Off: every batch runs
  // whole, its convolutions still split by images (tests of that split turn this off).
  bool split_rows = true;
  // CPU: producers of a Concat's inputs write into slices of its output where the slices are
  // contiguous (runtime/concat_in_place.h). Off (or MPQ_CONCAT_IN_PLACE=0): every Concat copies.
  bool concat_in_place = true;
  // CPU: Shape and the small integer ops that compute on its output keep their outputs between
  // runs and skip their kernels while what they read is unchanged (runtime/shape_value_cache.h).
  // Off (or MPQ_SHAPE_VALUE_CACHE=0): they run on every call.
  bool shape_value_cache = true;
};

// Where a run's time went, per op type ("domain::Op" outside the default domain) or per node (then
// `node` is its name), summed over every run since the executor was made or the profile was cleared.
struct OpTime {
  std::string op;
  std::string node;
  int64_t calls = 0;
  double seconds = 0.0;
};

// Sees every graph input as fed and every node output of the top-level graph as computed,
// without graph surgery (calibration, per-layer validation). The tensor is only valid during the
// call; copy what must be kept.
using Observer = std::function<void(const ir::Value& value, const Tensor& tensor)>;

using Feeds = std::unordered_map<std::string, Tensor>;

class Executor {
 public:
  // Resolves a kernel for every node (subgraphs included); an op without one is an Unsupported
  // error naming the node. The model must outlive the executor. BackendKind::CUDA runs the graph
  // through the CUDA graph runner (runtime/cuda/graph_runner.h): nodes without a CUDA kernel run
  // their CPU kernel with explicit copies; no usable GPU or plugin is a BadInput error
  // ("--device cuda: ...").
  Executor(const ir::Model& model, ExecOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs one feed (by graph input name) and returns the graph outputs in order. Feeds are checked
  // against the declared input types first (missing, wrong dtype, wrong rank or fixed dimension).
  std::vector<Tensor> run(const Feeds& feeds);
  // Same, additionally returning the named intermediate values (kept alive past their last use).
  std::vector<Tensor> run(const Feeds& feeds, const std::vector<std::string>& extra_values,
                          std::vector<Tensor>* extra_out);

  void set_observer(Observer observer) { observer_ = std::move(observer); }

  // While on (`mpq run --profile`, CPU), every node of the top-level graph is timed; off (the
  // default), the executor reads no clock per node. profile(): time per op type, or per node with
  // by_node (`--profile-nodes`), slowest first.
  void set_profiling(bool on);
  std::vector<OpTime> profile(bool by_node = false) const;
  void clear_profile();

  const ir::Model& model() const { return model_; }
  const std::vector<std::string>& input_names() const { return input_names_; }
  const std::vector<std::string>& output_names() const { return output_names_; }
  ThreadPool& pool();

  // Checks one feed against the model's inputs without running (BadInput on a mismatch).
  void check_feeds(const Feeds& feeds) const;

  struct Impl;
  struct CudaPath;

 private:
  const ir::Model& model_;
  ExecOptions options_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<CudaPath> cuda_;  // BackendKind::CUDA: the graph runner's state
  Observer observer_;
  std::vector<std::string> input_names_;
  std::vector<std::string> output_names_;
};

// Checks one feed against a graph's declared inputs (missing, unknown, wrong dtype, rank or fixed
// dimension); a BadInput error names the input.
void check_feeds(const ir::Graph& graph, const Feeds& feeds);

// Ops (as "domain::Op" or "Op") in the model and its subgraphs that have no kernel on `backend`.
std::vector<std::string> unsupported_ops(const ir::Model& model, BackendKind backend = BackendKind::CPU);

}  // namespace mpq::rt
