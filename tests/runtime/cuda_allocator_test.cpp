// The CUDA caching allocator's logic (lib/runtime/cuda/caching_allocator.*) against a fake device
// backend with a capacity: size classes, reuse per stream, best fit within 2x, the cache limit,
// OOM -> release cache -> retry -> error naming node and op, double frees. No GPU needed.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "core/error.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/devices.h"

using namespace mpq;
using namespace mpq::rt::gpu;

namespace {

struct FakeBackend : DeviceMemoryBackend {
  size_t capacity, used = 0;
  std::set<void*> live;
  int allocs = 0, releases = 0;
  std::map<void*, size_t> sizes;
  explicit FakeBackend(size_t cap) : capacity(cap) {}
  int allocate(void** p, size_t bytes) override {
    if (used + bytes > capacity) return 2;  // cudaErrorMemoryAllocation
    *p = std::aligned_alloc(256, bytes);
    used += bytes;
    live.insert(*p);
    sizes[*p] = bytes;
    ++allocs;
    return 0;
  }
  int release(void* p) override {
    REQUIRE(live.erase(p) == 1);
    used -= sizes[p];
    sizes.erase(p);
    std::free(p);
    ++releases;
    return 0;
  }
  std::string error_text(int code) override { return code == 2 ? "out of memory" : ""; }
  int copy(void* dst, const void* src, size_t bytes, CopyKind, void*) override {
    std::memcpy(dst, src, bytes);
    return 0;
  }
  int synchronize(void*) override { return 0; }
};

void* const kStreamA = reinterpret_cast<void*>(0x1);
void* const kStreamB = reinterpret_cast<void*>(0x2);

}  // namespace

TEST_CASE("size classes", "[cuda_allocator]") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::round_size(1 << 20) == (1 << 20));
  CHECK(CachingAllocator::round_size((1 << 20) + 1) == (2 << 20));
  CHECK(CachingAllocator::round_size((5 << 20) + 7) == (6 << 20));
}

TEST_CASE("freed blocks are reused on the same stream only, best fit within 2x", "[cuda_allocator]") {
  FakeBackend be(1 << 30);
  {
    CachingAllocator a(be);
    void* p = a.allocate(1000, kStreamA, "n", "Add");
    CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    CHECK(a.stats().in_use == 1024);
    a.deallocate(p);
    CHECK(a.stats().in_use == 0);
    CHECK(a.stats().cached == 1024);
    void* q = a.allocate(900, kStreamA, "n", "Add");  // same class: reused
    CHECK(q == p);
    CHECK(a.stats().cache_hits == 1);
    void* r = a.allocate(900, kStreamB, "n", "Add");  // other stream: new block
    CHECK(r != p);
    CHECK(be.allocs == 2);
    a.deallocate(q);
    void* half = a.allocate(600, kStreamA, "n", "Add");  // class 1024: the cached block
    CHECK(half == q);
    a.deallocate(half);
    void* big = a.allocate(3000, kStreamA, "n", "Add");  // nothing cached is large enough
    CHECK(be.allocs == 3);
    a.deallocate(big);
    void* small = a.allocate(100, kStreamA, "n", "Add");  // 512: takes the 1024 block (2x), not 3072
    CHECK(small == q);
    a.deallocate(small);
    void* tiny = a.allocate(100, kStreamB, "n", "Add");
    a.deallocate(r);
    void* tiny2 = a.allocate(100, kStreamB, "n", "Add");  // r's 1024 block is within 2x of 512
    CHECK(tiny2 == r);
    a.deallocate(tiny);
    a.deallocate(tiny2);
    CHECK(a.stats().peak_in_use == 1024 + 1024 + 3072 - 1024);
    CHECK(a.stats().cached == 1024 + 3072 + 1024 + 512);
  }
  CHECK(be.live.empty());  // the destructor returned every cached block
  CHECK(be.releases == 4);
}

TEST_CASE("the cache is trimmed to its limit, largest blocks first", "[cuda_allocator]") {
  FakeBackend be(1 << 30);
  CachingAllocator a(be, 3 << 20);
  void* big = a.allocate(4 << 20, kStreamA, "n", "Conv");
  void* mid = a.allocate(2 << 20, kStreamA, "n", "Conv");
  a.deallocate(mid);
  CHECK(a.stats().cached == (2 << 20));
  a.deallocate(big);  // 6 MiB cached > 3 MiB: the 4 MiB block goes back
  CHECK(a.stats().cached == (2 << 20));
  CHECK(be.used == (2u << 20));
  a.release_cached();
  CHECK(be.used == 0);
}

TEST_CASE("out of memory releases the cache, retries, then names node and op", "[cuda_allocator]") {
  FakeBackend be(8 << 20);
  CachingAllocator a(be);
  void* p = a.allocate(6 << 20, kStreamA, "n", "Conv");
  a.deallocate(p);  // cached, still held from the backend
  void* q = a.allocate(4 << 20, kStreamB, "conv2", "Conv");  // fails, cache released, retry succeeds
  CHECK(q != nullptr);
  CHECK(a.stats().oom_retries == 1);
  CHECK(a.stats().cached == 0);
  try {
    a.allocate(6 << 20, kStreamB, "fc1", "Gemm");
    FAIL("no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("node 'fc1' (Gemm): cudaMalloc failed: cudaErrorMemoryAllocation (2)") != std::string::npos);
    CHECK(m.find("requested 6291456 bytes") != std::string::npos);
  }
  a.deallocate(q);
  CHECK_THROWS_AS(a.deallocate(q), Error);  // double free
  int x = 0;
  CHECK_THROWS_AS(a.deallocate(&x), Error);
}

TEST_CASE("device tensors know their device, copy explicitly and return memory to the cache", "[cuda_allocator]") {
  FakeBackend be(1 << 30);
  CachingAllocator a(be);
  const Tensor host = Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  {
    const Tensor d = to_device(host, a, be, kStreamA, "x", "Input");
    CHECK(d.device() == Device::CUDA);
    CHECK_FALSE(d.is_host());
    CHECK(d.shape() == host.shape());
    CHECK(a.stats().in_use == 512);
    const Tensor back = to_host(d, be, kStreamA, "y", "Output");
    CHECK(back.is_host());
    CHECK(std::vector<float>(back.data<float>(), back.data<float>() + 6) == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK_THROWS_AS(to_device(d, a, be, kStreamA, "x", "Input"), Error);  // already on the device
    CHECK_THROWS_AS(to_host(host, be, kStreamA, "x", "Input"), Error);
  }
  CHECK(a.stats().in_use == 0);  // the tensor's buffer went back to the cache
  CHECK(a.stats().cached == 512);
  CHECK_THROWS_AS(device_empty(a, DType::String, {2}, kStreamA, "s", "Identity"), Error);
}

TEST_CASE("CPU fallbacks are logged once per op type", "[cuda_allocator]") {
  FallbackLog log;
  CHECK(log.note("NonMaxSuppression", "no CUDA kernel"));
  CHECK_FALSE(log.note("NonMaxSuppression", "no CUDA kernel"));
  CHECK(log.note("TopK", "no CUDA kernel"));
  CHECK(log.ops() == std::set<std::string>{"NonMaxSuppression", "TopK"});
}

TEST_CASE("a CUDA context without a usable GPU is a clear error", "[cuda_allocator]") {
  if (rt::cuda_available()) {
    WARN("a CUDA device is present: the no-GPU error path is not exercised here");
    CudaContext ctx;
    CHECK(ctx.stream() != nullptr);
    return;
  }
  try {
    CudaContext ctx;
    FAIL("no error");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == ErrorKind::BadInput);
    CHECK(std::string(e.what()).rfind("--device cuda: ", 0) == 0);
  }
}
