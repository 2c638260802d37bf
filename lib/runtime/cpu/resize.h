#pragma once
// Resize's test hook (the kernels register through register_all.h): the float32 NCHW bilinear
// path has AVX2 and AVX-512 row loops that give the portable loops' bits; while a
// ScopedResizeBaseline lives every call runs the portable loops, so tests can compare them.

namespace mpq::rt::cpu {

class ScopedResizeBaseline {
 public:
  ScopedResizeBaseline();
  ~ScopedResizeBaseline();
  ScopedResizeBaseline(const ScopedResizeBaseline&) = delete;
  ScopedResizeBaseline& operator=(const ScopedResizeBaseline&) = delete;

 private:
  bool previous_;
};

}  // namespace mpq::rt::cpu
