#pragma once
// The only operations in the kernel bodies that behave differently on the device and in the host
// harness. Kept here, small and named, and listed in docs/gpu.md: the host tests run the host
// branch, so these lines are exactly the ones that have never been executed (see docs/gpu.md).
#include "kernels/hd.h"

namespace mpq::cuda {

// counts[i] += 1 from many threads at once. Device: atomicAdd on a 64-bit counter. Host harness:
// the threads run one after another, so a plain increment is the same result.
MPQ_HD inline void hd_atomic_increment(unsigned long long* counter) {
#if defined(__CUDA_ARCH__)
  atomicAdd(counter, 1ULL);
#else
  *counter += 1ULL;
#endif
}

}  // namespace mpq::cuda
