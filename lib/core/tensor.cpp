#include "core/tensor.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/dispatch.h"
#include "core/half.h"

namespace mpq {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

namespace {

// Size classes: 8 steps per power of two, so a reused block wastes at most 12.5%.
size_t size_class(size_t bytes) {
  if (bytes <= 256) return 256;
  const int log2 = 63 - __builtin_clzll(bytes);
  const size_t step = (size_t{1} << log2) / 8;
  return (bytes + step - 1) / step * step;
}

// A dense index of the size classes, for the per-thread lists: 256 is 0, then 8 per power of two.
constexpr size_t kClassIndices = 64 * 8;
size_t class_index(size_t cls) {
  if (cls <= 256) return 0;
  const int log2 = 63 - __builtin_clzll(cls);
  return static_cast<size_t>(log2 - 8) * 8 + (cls - (size_t{1} << log2)) / ((size_t{1} << log2) / 8);
}
size_t class_of_index(size_t index) {
  const size_t power = size_t{1} << (index / 8 + 8);
  return power + index % 8 * (power / 8);
}

class HostCache {
 public:
  static HostCache& instance() {
    static HostCache* cache = new HostCache();  // never destroyed: blocks may outlive static teardown
    return *cache;
  }
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= cls;
    return p;
  }
  void give(void* p, size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + cls > kMaxHeld) {
      std::free(p);
      return;
    }
    free_[cls].push_back(p);
    held_ += cls;
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  void trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    held_ = 0;
  }

 private:
  static constexpr size_t kMaxHeld = size_t(1) << 30;
  std::mutex mu_;
  // Blocks per size class; the lists keep their capacity, so a steady state of runs that free and
  // take the same sizes allocates nothing here.
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t held_ = 0;
};

// 0 before the thread's LocalCache is made, 1 while it lives, 2 after its destructor (at thread
// exit, or for the main thread before static objects are destroyed: a static Tensor freed then must
// not touch it). A plain int stays readable throughout.
thread_local int t_local_state = 0;

// host_cache_trim() bumps this; each thread frees its own kept blocks at its next allocation or
// free (another thread's cache cannot be touched safely from here).
std::atomic<uint64_t> g_trim_generation{0};

// Blocks freed on a thread are kept for that thread first, up to kMaxLocal bytes: an executor
// running part of a batch on each thread (runtime/batch_rows.h) then gets back blocks its own core
// wrote last, instead of ones the other core holds in its cache (writing those moves every cache
// line between the cores). The rest goes to the shared cache; a thread's blocks return there when
// it ends.
class LocalCache {
 public:
  LocalCache() { t_local_state = 1; }
  ~LocalCache() {
    t_local_state = 2;
    for (size_t i = 0; i < kClassIndices; ++i)
      for (void* p : free_[i]) HostCache::instance().give(p, class_of_index(i));
  }
  void* take(size_t cls) {
    sync();
    std::vector<void*>& blocks = free_[class_index(cls)];
    if (blocks.empty()) return HostCache::instance().take(cls);
    void* p = blocks.back();
    blocks.pop_back();
    held_ -= cls;
    return p;
  }
  void give(void* p, size_t cls) {
    sync();
    if (held_ + cls > kMaxLocal) return HostCache::instance().give(p, cls);
    free_[class_index(cls)].push_back(p);
    held_ += cls;
  }

 private:
  void sync() {
    const uint64_t g = g_trim_generation.load(std::memory_order_relaxed);
    if (g == generation_) return;
    for (std::vector<void*>& blocks : free_) {
      for (void* p : blocks) std::free(p);
      blocks.clear();
    }
    held_ = 0;
    generation_ = g;
  }
  static constexpr size_t kMaxLocal = size_t(64) << 20;
  // Indexed by class_index: a run's allocations and frees here do no hashing.
  std::array<std::vector<void*>, kClassIndices> free_;
  size_t held_ = 0;
  uint64_t generation_ = g_trim_generation.load(std::memory_order_relaxed);
};

thread_local LocalCache t_local_cache;

void* take_block(size_t cls) {
  return t_local_state == 2 ? HostCache::instance().take(cls) : t_local_cache.take(cls);
}
void give_block(void* p, size_t cls) {
  if (t_local_state == 2) return HostCache::instance().give(p, cls);
  t_local_cache.give(p, cls);
}

}  // namespace

namespace {
std::atomic<size_t> g_in_use{0};
std::atomic<size_t> g_peak{0};

void note_alloc(size_t cls) {
  const size_t now = g_in_use.fetch_add(cls, std::memory_order_relaxed) + cls;
  size_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// The control blocks of host buffers' shared_ptrs come from a per-thread list: a node output is a
// new tensor on every run, and its control block would otherwise be a malloc and a free each time
// (the ViT shipped here makes about 150 tensors per run at batch 1).
thread_local int t_control_state = 0;  // as t_local_state, for t_control_blocks

class ControlBlocks {
 public:
  static constexpr size_t kBytes = 64;  // larger control blocks (none here) bypass the list
  ControlBlocks() { t_control_state = 1; }
  ~ControlBlocks() {
    t_control_state = 2;
    release();
  }
  void* take() {
    sync();
    if (free_.empty()) return ::operator new(kBytes);
    void* p = free_.back();
    free_.pop_back();
    return p;
  }
  void give(void* p) {
    sync();
    if (free_.size() >= kMaxKept) return ::operator delete(p);
    try {
      free_.push_back(p);
    } catch (...) {  // called while a tensor is freed: growing the list must not throw from there
      ::operator delete(p);
    }
  }

 private:
  // host_cache_trim() empties this list too, at the thread's next allocation or free.
  void sync() {
    const uint64_t g = g_trim_generation.load(std::memory_order_relaxed);
    if (g == generation_) return;
    release();
    generation_ = g;
  }
  void release() {
    for (void* p : free_) ::operator delete(p);
    free_.clear();
    free_.shrink_to_fit();
  }
  static constexpr size_t kMaxKept = size_t{1} << 16;
  std::vector<void*> free_;
  uint64_t generation_ = g_trim_generation.load(std::memory_order_relaxed);
};

thread_local ControlBlocks t_control_blocks;

// Blocks go back to the list of the thread that frees them, which need not be the one that took
// them: every block is an operator new of kBytes, so any list (or operator delete) takes it.
template <typename T>
struct ControlBlockAllocator {
  using value_type = T;
  ControlBlockAllocator() = default;
  template <typename U>
  ControlBlockAllocator(const ControlBlockAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    if (n * sizeof(T) > ControlBlocks::kBytes) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(t_control_state == 2 ? ::operator new(ControlBlocks::kBytes) : t_control_blocks.take());
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) > ControlBlocks::kBytes || t_control_state == 2) return ::operator delete(p);
    t_control_blocks.give(p);
  }
  template <typename U>
  bool operator==(const ControlBlockAllocator<U>&) const { return true; }  // != follows (C++20)
};

struct HostDeleter {
  size_t cls;
  void operator()(void* q) const {
    g_in_use.fetch_sub(cls, std::memory_order_relaxed);
    give_block(q, cls);
  }
};

}  // namespace

std::shared_ptr<void> host_alloc(size_t bytes) {
  size_t cls = size_class(bytes == 0 ? 1 : bytes);
  void* p = take_block(cls);
  if (!p) {
    p = std::aligned_alloc(64, (cls + 63) / 64 * 64);  // size must be a multiple of the alignment
    if (!p) fail_internal("out of host memory allocating {} bytes", cls);
  }
  note_alloc(cls);
  return std::shared_ptr<void>(p, HostDeleter{cls}, ControlBlockAllocator<void>{});
}

size_t host_bytes_in_use() { return g_in_use.load(std::memory_order_relaxed); }
size_t host_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void host_reset_peak() { g_peak.store(g_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed); }

size_t host_cache_bytes() { return HostCache::instance().held(); }
void host_cache_trim() {
  g_trim_generation.fetch_add(1, std::memory_order_relaxed);
  HostCache::instance().trim();
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_)
    if (d < 0) fail_internal("tensor shape {} has a negative dimension", shape_str(shape_));
  if (dtype_ == DType::String) {
    strings_ = std::make_shared<std::vector<std::string>>(static_cast<size_t>(numel()));
  } else {
    data_ = host_alloc(nbytes());
  }
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  if (t.data_) std::memset(t.data_.get(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(DType dtype, Shape shape, std::shared_ptr<void> data, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = std::move(data);
  t.device_ = device;
  return t;
}

Tensor Tensor::from_strings(Shape shape, std::vector<std::string> values) {
  Tensor t;
  t.dtype_ = DType::String;
  t.shape_ = std::move(shape);
  if (static_cast<int64_t>(values.size()) != t.numel())
    fail_internal("Tensor::from_strings: {} values for shape {}", values.size(), shape_str(t.shape_));
  t.strings_ = std::make_shared<std::vector<std::string>>(std::move(values));
  return t;
}

std::vector<std::string>& Tensor::strings() {
  check_type(DType::String);
  return *strings_;
}
const std::vector<std::string>& Tensor::strings() const {
  check_type(DType::String);
  return *strings_;
}

void Tensor::check_type(DType expected) const {
  if (dtype_ != expected)
    fail_internal("tensor holds {} but was read as {}", dtype_name(dtype_), dtype_name(expected));
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel())
    fail_internal("cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  if (device_ != Device::CPU) fail_internal("Tensor::clone of a device tensor; copy it to the host first");
  Tensor t(dtype_, shape_);
  if (dtype_ == DType::String) {
    *t.strings_ = *strings_;
  } else if (nbytes()) {
    std::memcpy(t.data_.get(), data_.get(), nbytes());
  }
  return t;
}

double Tensor::get_double(int64_t i) const {
  switch (dtype_) {
    case DType::Float16: return to_float(data<Float16>()[i]);
    case DType::BFloat16: return to_float(data<BFloat16>()[i]);
    case DType::Bool: return data<bool>()[i] ? 1.0 : 0.0;
    default:
      return visit_arith(dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        return static_cast<double>(data<T>()[i]);
      });
  }
}

int64_t Tensor::get_int64(int64_t i) const {
  if (dtype_ == DType::Bool) return data<bool>()[i] ? 1 : 0;
  if (!dtype_is_integer(dtype_)) return static_cast<int64_t>(get_double(i));
  return visit_arith(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return static_cast<int64_t>(data<T>()[i]);
  });
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  if (!dtype_is_integer(dtype_) && dtype_ != DType::Bool)
    fail_input("expected an integer tensor, got {}", dtype_name(dtype_));
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get_int64(i);
  return out;
}

namespace {
template <typename F>
decltype(auto) visit_numeric_all(DType t, F&& f) {
  switch (t) {
    case DType::Float16: return f(TypeTag<Float16>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    default: return visit_arith_bool(t, std::forward<F>(f));
  }
}
}  // namespace

Tensor Tensor::cast_to(DType to) const {
  if (to == dtype_) return clone();
  Tensor out(to, shape_);
  const int64_t n = numel();
  visit_numeric_all(dtype_, [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    const From* src = data<From>();
    visit_numeric_all(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* dst = out.data<To>();
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<To, bool>) {
          dst[i] = convert_value<float>(src[i]) != 0.0f;
        } else if constexpr (std::is_same_v<From, bool>) {
          dst[i] = convert_value<To>(src[i] ? 1 : 0);
        } else {
          dst[i] = convert_value<To>(src[i]);
        }
      }
    });
  });
  return out;
}

}  // namespace mpq
