#pragma once
// The GPU side of `run(body, ctx)`, which kernels/ops_*.inc call once per entry point: the body over
// the launch's grid on its stream (kernels/grid.cuh). host_harness.cu defines the host side.
#include "kernels/grid.cuh"
#include "kernels/ops.h"

namespace mpq::cuda::gpu {

template <class Body>
int run(const Body& body, const LaunchCtx& c) {
  return run_on_device_grid(body, c.shape, c.stream);
}

}  // namespace mpq::cuda::gpu
