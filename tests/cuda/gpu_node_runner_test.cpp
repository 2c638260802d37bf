// The node cases of node_cases.h on a GPU: plan_node -> run_planned_node with the __global__
// launchers (gpu_ops_table) and real device memory (cudaMalloc/cudaMemcpy), compared with mpq's CPU
// kernels. Skipped, with the reason, without a GPU. NEVER RUN on a GPU yet (docs/gpu.md).
#include "gpu_support.h"
#include "node_cases.h"

using namespace mpq;
using namespace mpq::test;

namespace {
struct CudaMemory : DeviceMemoryBackend {
  int allocate(void** p, size_t bytes) override { return static_cast<int>(cudaMalloc(p, bytes)); }
  int release(void* p) override { return static_cast<int>(cudaFree(p)); }
  int copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) override {
    const cudaMemcpyKind k = kind == CopyKind::HostToDevice ? cudaMemcpyHostToDevice
                             : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
  }
  int synchronize(void* stream) override { return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }
  std::string error_text(int code) override { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
};
}  // namespace

TEST_CASE("nodes run through plan + runner + GPU launchers match the CPU kernels", "[cuda][gpu][runner]") {
  MPQ_REQUIRE_GPU();
  CudaMemory mem;
  run_node_cases(mpq::cuda::gpu_ops_table(), mem);
}
