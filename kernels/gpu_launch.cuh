#pragma once
// The GPU side of `run(body, ctx)`, which kernels/ops_*.inc call once per entry point: the body over
// the launch's grid on its stream (kernels/grid.cuh). host_harness.cu defines the host side.
#include <cuda_runtime.h>

#include "kernels/bodies/chunk_sum.cuh"
#include "kernels/grid.cuh"
#include "kernels/ops.h"

namespace mpq::cuda::gpu {

template <class Body>
int run(const Body& body, const LaunchCtx& c) {
  return run_on_device_grid(body, c.shape, c.stream);
}

// A temporary buffer for an entry point's intermediate results (a few partial sums per segment),
// from CUDA's stream-ordered allocator: freed on the stream after the launches queued before the
// free, so no synchronisation is needed. It is not mpq's caching allocator (the kernel table has
// no handle to it): these buffers are small and short-lived, and the driver's pool reuses them.
// A failed allocation is returned as the entry point's status, and cleared from CUDA's last error
// so that the next launch does not report it again.
template <class T>
class Scratch {
 public:
  Scratch(size_t n, const LaunchCtx& c) : stream_(static_cast<cudaStream_t>(c.stream)) {
    status_ = static_cast<int>(cudaMallocAsync(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T), stream_));
    if (status_ != 0) {
      p_ = nullptr;
      (void)cudaGetLastError();
    }
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }
  int status() const { return status_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
  int status_ = 0;
};

#include "kernels/chunk_sums.inc"

}  // namespace mpq::cuda::gpu
