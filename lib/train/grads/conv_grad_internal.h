#pragma once
// Internal to the Conv / ConvTranspose backward (conv_grad.cpp, conv_grad_depthwise.cpp): the
// direct depthwise backward. Not a public API.
#include <cstdint>

#include "runtime/cpu/conv_common.h"
#include "runtime/thread_pool.h"

namespace mpq::train::grads {

// Backward of a depthwise Conv (group == C, W [C*mult, 1, KH, KW]) over 1-D or 2-D windows (1-D
// passes in[1] = k[1] = out[1] = 1 in the leading slots of g, as rt::cpu::to_window3 does).
// x [N, C, H, W] and dw [C*mult, KH*KW] are read / written only when dw is not null; w and dx
// likewise. Each dW element sums over the images in order, each dX plane is written by one task:
// the results do not depend on the thread count.
template <typename T>
void depthwise_conv_backward(rt::ThreadPool& pool, const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t n,
                             int64_t c, int64_t mult, const rt::cpu::Window3& g);

extern template void depthwise_conv_backward<float>(rt::ThreadPool&, const float*, const float*, const float*, float*,
                                                    float*, int64_t, int64_t, int64_t, const rt::cpu::Window3&);
extern template void depthwise_conv_backward<double>(rt::ThreadPool&, const double*, const double*, const double*,
                                                     double*, double*, int64_t, int64_t, int64_t,
                                                     const rt::cpu::Window3&);

// True for the windows depthwise_conv_backward serves (at most two spatial dimensions).
inline bool depthwise_backward_applies(const rt::cpu::Window3& g) {
  return g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1 && g.pb[0] == 0;
}

}  // namespace mpq::train::grads
