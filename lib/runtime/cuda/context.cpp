#include "runtime/cuda/context.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "runtime/cuda_loader.h"

namespace mpq::rt::gpu {

bool FallbackLog::note(const std::string& op, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!seen_.insert(op).second) return false;
  spdlog::warn("{} has no CUDA kernel ({}): it runs on the CPU, with its inputs and outputs copied", op, reason);
  return true;
}

std::set<std::string> FallbackLog::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

CudaContext::CudaContext() {
  std::string why;
  api_ = cuda_plugin(&why);
  if (!api_) fail_input("--device cuda: {}", why);
  if (!api_->ops) fail_input("--device cuda: the CUDA plugin has no kernel table");
  const int code = api_->stream_create(&stream_);
  if (code != 0)
    fail_input("--device cuda: cannot create a CUDA stream: {} ({})", api_->error_string ? api_->error_string(code) : "",
               code);
  backend_ = std::make_unique<PluginMemoryBackend>(*api_);
  allocator_ = std::make_unique<CachingAllocator>(*backend_);
}

CudaContext::~CudaContext() {
  allocator_.reset();  // returns the cached blocks before the stream goes
  if (stream_) api_->stream_destroy(stream_);
}

}  // namespace mpq::rt::gpu
