#pragma once
// Host-callable entry points of the CUDA code in kernels/. Plain C++: no CUDA headers, so the
// rest of mpq compiles with g++ alone. Only declared when MPQ_HAVE_CUDA is defined.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mpq::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
};

struct ProbeResult {
  int runtime_version = 0;
  int driver_version = 0;  // 0 when no driver is installed
  std::vector<DeviceInfo> devices;
  std::string error;  // why no device is usable ("no CUDA device", driver too old, ...)
  size_t cublaslt_version = 0;
};

// Queries the driver and devices; never throws, never aborts when there is no GPU.
ProbeResult probe();

// Smoke test of the whole path (allocation, a kernel launch, cuBLASLt handle): computes
// y = a*x + y on the device for the given host vectors. Returns an empty string on success, else
// the CUDA error text.
std::string saxpy_selftest(float a, const std::vector<float>& x, std::vector<float>& y);

}  // namespace mpq::cuda
