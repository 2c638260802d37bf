#pragma once
// Running a kernel body over a 1-D launch, on the host (the test harness) or on the device.
#include "kernels/hd.h"

namespace mpq::cuda {

// Every (block, thread) pair of the launch, in order: the same index space the GPU covers, so
// tails (threads past n) and the grid-stride loop (n > blocks * threads) are exercised here.
template <class Body>
int run_on_host_grid(const Body& body, const LaunchShape& s) {
  for (int64_t b = 0; b < s.blocks; ++b)
    for (int64_t t = 0; t < s.threads; ++t) body(Thread{b, t, s.threads, s.blocks});
  return 0;
}

#if defined(__CUDACC__)
template <class Body>
__global__ void body_kernel(Body body) {
  body(Thread{static_cast<int64_t>(blockIdx.x), static_cast<int64_t>(threadIdx.x), static_cast<int64_t>(blockDim.x),
              static_cast<int64_t>(gridDim.x)});
}

// Launches `body` on `stream`; returns the launch's cudaError_t (0 on success). Errors raised
// while the kernel runs surface at the next synchronizing call, which the caller checks.
template <class Body>
int run_on_device_grid(const Body& body, const LaunchShape& s, void* stream) {
  if (s.blocks < 1 || s.threads < 1 || s.threads > 1024 || s.blocks > 0x7fffffff) return static_cast<int>(cudaErrorInvalidConfiguration);
  body_kernel<Body><<<static_cast<unsigned>(s.blocks), static_cast<unsigned>(s.threads), 0,
                      static_cast<cudaStream_t>(stream)>>>(body);
  return static_cast<int>(cudaGetLastError());
}
#endif

}  // namespace mpq::cuda
