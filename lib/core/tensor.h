#pragma once
// Tensor: a dtype, a shape and a reference-counted buffer on the host or a device. Copies share the
// buffer; clone() copies it. Kernels never write into a tensor they did not allocate, except an
// input whose buffer nothing else holds any more (KernelContext::input_reusable).
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace mpq {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);  // 1 for a scalar
std::string shape_str(const Shape& shape);  // "[1,3,224,224]"

enum class Device : uint8_t { CPU = 0, CUDA = 1 };
const char* device_name(Device d);

// Host memory from a size-classed cache: the executor frees and re-allocates the same sizes on
// every feed, and reusing blocks avoids page faults on each run. Blocks are 64-byte aligned.
std::shared_ptr<void> host_alloc(size_t bytes);
// Bytes currently held in the shared cache (not in use); for tests and memory reports. Each
// thread also keeps up to 64 MiB of the blocks it freed, for itself, outside this count.
size_t host_cache_bytes();
// Frees the shared cache now, and each thread's own blocks (and its spare shared_ptr control
// blocks) at its next allocation or free.
void host_cache_trim();
// Bytes of host tensor memory handed out and not yet returned (in size classes), and the largest
// that figure has been since the last reset: the training engine reports its peak activation and
// gradient memory from these.
size_t host_bytes_in_use();
size_t host_peak_bytes();
void host_reset_peak();

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized host tensor (strings: empty strings).
  Tensor(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  // Wrap an existing buffer (host or device) without copying.
  static Tensor wrap(DType dtype, Shape shape, std::shared_ptr<void> data, Device device = Device::CPU);
  template <typename T>
  static Tensor from(Shape shape, const std::vector<T>& values);
  template <typename T>
  static Tensor from(Shape shape, std::initializer_list<T> values) {
    return from<T>(std::move(shape), std::vector<T>(values));
  }
  template <typename T>
  static Tensor scalar(T value) {
    return from<T>({}, std::vector<T>{value});
  }
  static Tensor from_strings(Shape shape, std::vector<std::string> values);

  bool defined() const { return dtype_ != DType::Undefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const { return shape_.at(static_cast<size_t>(axis < 0 ? axis + rank() : axis)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return dtype_storage_bytes(dtype_, numel()); }
  Device device() const { return device_; }
  bool is_host() const { return device_ == Device::CPU; }

  void* raw_data() { return data_.get(); }
  const void* raw_data() const { return data_.get(); }
  const std::shared_ptr<void>& buffer() const { return data_; }

  template <typename T>
  T* data() {
    check_type(dtype_of<T>);
    return static_cast<T*>(data_.get());
  }
  template <typename T>
  const T* data() const {
    check_type(dtype_of<T>);
    return static_cast<const T*>(data_.get());
  }
  std::vector<std::string>& strings();
  const std::vector<std::string>& strings() const;

  // Same buffer, new shape (element count must match).
  Tensor reshaped(Shape shape) const;
  // Deep copy on the host.
  Tensor clone() const;
  // Element i converted to double / int64 (slow; for tests, reports and shape math).
  double get_double(int64_t i) const;
  int64_t get_int64(int64_t i) const;
  // Every element as int64 (shape tensors, axes, pads). Fails on non-integer types.
  std::vector<int64_t> to_int64_vector() const;
  // Convert a numeric tensor to another numeric dtype on the host (saturating ONNX Cast semantics
  // for float->int is the Cast kernel's job; this is a plain C++ conversion for internal use).
  Tensor cast_to(DType to) const;

  bool same_buffer(const Tensor& other) const { return data_ && data_ == other.data_; }

 private:
  void check_type(DType expected) const;

  DType dtype_ = DType::Undefined;
  Shape shape_;
  Device device_ = Device::CPU;
  std::shared_ptr<void> data_;
  std::shared_ptr<std::vector<std::string>> strings_;
};

template <typename T>
Tensor Tensor::from(Shape shape, const std::vector<T>& values) {
  Tensor t(dtype_of<T>, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel())
    fail_internal("Tensor::from: {} values for shape {}", values.size(), shape_str(t.shape()));
  T* dst = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) dst[i] = values[i];
  return t;
}

}  // namespace mpq
