#include "runtime/cuda/caching_allocator.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/cuda/status.h"

namespace mpq::rt::gpu {

namespace {
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeGranule = size_t{2} << 20;
constexpr int kCudaErrorMemoryAllocation = 2;
}  // namespace

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kSmallGranule;
  const size_t g = bytes <= kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + g - 1) / g * g;
}

CachingAllocator::CachingAllocator(DeviceMemoryBackend& backend, size_t max_cached_bytes)
    : backend_(backend), max_cached_(max_cached_bytes) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void* CachingAllocator::allocate(size_t bytes, void* stream, const std::string& node, const std::string& op) {
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  // Best fit on this stream, but never a block more than twice the request (a huge cached block
  // would otherwise be pinned by a tiny tensor).
  auto it = free_.lower_bound({stream, size});
  if (it != free_.end() && it->first.first == stream && it->first.second <= 2 * size) {
    void* p = it->second;
    const size_t got = it->first.second;
    free_.erase(it);
    stats_.cached -= got;
    live_[p] = Block{got, stream};
    stats_.in_use += got;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    ++stats_.cache_hits;
    return p;
  }
  void* p = nullptr;
  int code = backend_.allocate(&p, size);
  if (code != 0 && stats_.cached > 0) {
    // Out of memory (or fragmented): give the cache back and try once more.
    ++stats_.oom_retries;
    release_cached_locked();
    code = backend_.allocate(&p, size);
  }
  if (code != 0 || !p) {
    const std::string text = backend_.error_text(code) +
                             fmt::format(" (requested {} bytes; {} bytes in use by mpq)", size, stats_.in_use);
    cuda_plan::fail_cuda_status(cuda_plan::CudaLibrary::Runtime, code ? code : kCudaErrorMemoryAllocation, "cudaMalloc",
                                text, node, op);
  }
  ++stats_.backend_allocations;
  live_[p] = Block{size, stream};
  stats_.in_use += size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) fail_internal("CachingAllocator: freeing {} which it did not allocate (or twice)", ptr);
  const Block b = it->second;
  live_.erase(it);
  stats_.in_use -= b.size;
  free_.emplace(std::make_pair(b.stream, b.size), ptr);
  stats_.cached += b.size;
  trim_locked();
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (const auto& [key, p] : free_) backend_.release(p);
  free_.clear();
  stats_.cached = 0;
}

// Over the cache limit: return the largest free blocks first.
void CachingAllocator::trim_locked() {
  while (stats_.cached > max_cached_ && !free_.empty()) {
    auto largest = free_.begin();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first.second > largest->first.second) largest = it;
    stats_.cached -= largest->first.second;
    backend_.release(largest->second);
    free_.erase(largest);
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace mpq::rt::gpu
