// The host harness: nvcc compiles the kernel bodies here as __host__ code and runs each over every
// (block, thread) of the launch, one after another. The Catch2 tests in tests/cuda/ call these
// through kernels/ops.h and compare with mpq's CPU kernels and references; this is how the bodies
// are verified on machines without a GPU. Part of the static library mpq_cuda_host, not the plugin.
#include "kernels/bodies/elementwise.cuh"
#include "kernels/bodies/quant.cuh"
#include "kernels/bodies/reduce.cuh"
#include "kernels/bodies/shape.cuh"
#include "kernels/bodies/spatial.cuh"
#include "kernels/grid.cuh"
#include "kernels/ops.h"
#include "kernels/ops_table.h"

namespace mpq::cuda::host {

namespace {
template <class Body>
int run(const Body& body, const LaunchCtx& c) {
  return run_on_host_grid(body, c.shape);
}
}  // namespace

#include "kernels/ops_data.inc"
#include "kernels/ops_elementwise.inc"
#include "kernels/ops_quant.inc"

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
