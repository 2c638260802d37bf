// Device query and a smoke-test kernel proving the CUDA + cuBLASLt toolchain links end to end.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/cuda_api.h"
#include "kernels/memory.h"
#include "kernels/ops_table.h"

namespace mpq::cuda {

namespace {

__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

std::string err(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

namespace {
ProbeResult probe() {
  ProbeResult r;
  cudaRuntimeGetVersion(&r.runtime_version);
  cudaDriverGetVersion(&r.driver_version);
  r.cublaslt_version = cublasLtGetVersion();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (e == cudaErrorNoDevice || r.driver_version == 0) {
      r.error = "no CUDA device";
    } else if (e == cudaErrorInsufficientDriver) {
      r.error = "CUDA driver too old for this build (driver " + std::to_string(r.driver_version) + ", runtime " +
                std::to_string(r.runtime_version) + ")";
    } else {
      r.error = err(e, "cudaGetDeviceCount");
    }
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return r;
  }
  if (count == 0) r.error = "no CUDA device";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.major = prop.major;
    d.minor = prop.minor;
    d.total_memory = prop.totalGlobalMem;
    d.multiprocessors = prop.multiProcessorCount;
    r.devices.push_back(d);
  }
  return r;
}

std::string saxpy_selftest(float a, const std::vector<float>& x, std::vector<float>& y) {
  const int n = static_cast<int>(x.size());
  if (y.size() != x.size()) return "saxpy_selftest: size mismatch";
  float* dx = nullptr;
  float* dy = nullptr;
  const size_t bytes = sizeof(float) * x.size();
  cudaError_t e = cudaMalloc(&dx, bytes);
  if (e != cudaSuccess) return err(e, "cudaMalloc");
  e = cudaMalloc(&dy, bytes);
  if (e != cudaSuccess) {
    cudaFree(dx);
    return err(e, "cudaMalloc");
  }
  std::string result;
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) result = "cublasLtCreate failed";
  if (result.empty() && (e = cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
    result = err(e, "cudaMemcpy");
  if (result.empty() && (e = cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
    result = err(e, "cudaMemcpy");
  if (result.empty()) {
    saxpy_kernel<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
    if ((e = cudaGetLastError()) != cudaSuccess) result = err(e, "saxpy launch");
  }
  if (result.empty() && (e = cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
    result = err(e, "cudaMemcpy");
  if (lt) cublasLtDestroy(lt);
  cudaFree(dx);
  cudaFree(dy);
  return result;
}
}  // namespace

}  // namespace mpq::cuda

extern "C" __attribute__((visibility("default"))) const mpq::cuda::CudaApi* mpq_cuda_api() {
  static const mpq::cuda::CudaApi api = [] {
    mpq::cuda::CudaApi a;
    a.probe = &mpq::cuda::probe;
    a.saxpy_selftest = &mpq::cuda::saxpy_selftest;
    mpq::cuda::fill_memory_api(a);
    a.ops = &mpq::cuda::gpu_ops_table();
    a.host_ops = &mpq::cuda::host_ops_table();
    return a;
  }();
  return &api;
}
