#pragma once
// Direct matrix product and convolution bodies, one thread per output element. They are not the
// fast path (cuBLASLt and cuDNN are): on the host they are how the tests check that mpq's
// cuBLASLt/cuDNN plans describe the right computation (operand swap, transposes, leading
// dimensions, batch strides, groups, pads, dilations) against the CPU kernels; on the GPU they run
// when the library declines a problem (no cuBLASLt algorithm, no cuDNN engine within the
// workspace budget), so a node never has to leave the device for that reason.
#include "kernels/hd.h"

namespace mpq::cuda {

// Column-major C = op(A) * op(B) per batch (MatmulGeom). FP32 accumulation in k order.
struct MatmulBody {
  MatmulGeom g;
  const float* a;
  const float* b;
  float* c;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.batch * g.m * g.n;
    for (int64_t idx = t.global(); idx < total; idx += t.stride()) {
      const int64_t i = idx % g.m, j = (idx / g.m) % g.n, bt = idx / (g.m * g.n);
      const float* ab = a + bt * g.stride_a;
      const float* bb = b + bt * g.stride_b;
      float s = 0.0f;
      for (int64_t k = 0; k < g.k; ++k) {
        const float av = g.trans_a ? ab[k + i * g.lda] : ab[i + k * g.lda];
        const float bv = g.trans_b ? bb[j + k * g.ldb] : bb[k + j * g.ldb];
        s += av * bv;
      }
      c[bt * g.stride_c + i + j * g.ldc] = s;
    }
  }
};

// NCDHW cross-correlation with groups, strides, dilations and leading pads (ConvGeom); W is
// [M, C/group, KD, KH, KW]. No bias: the runner adds it with the broadcasting Add body.
struct ConvBody {
  ConvGeom g;
  const float* x;
  const float* w;
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.n * g.m * g.od * g.oh * g.ow;
    const int64_t cg = g.c / g.group, mg = g.m / g.group;
    for (int64_t idx = t.global(); idx < total; idx += t.stride()) {
      int64_t r = idx;
      const int64_t ox = r % g.ow;
      r /= g.ow;
      const int64_t oy = r % g.oh;
      r /= g.oh;
      const int64_t oz = r % g.od;
      r /= g.od;
      const int64_t oc = r % g.m, n = r / g.m;
      const int64_t c0 = (oc / mg) * cg;
      float s = 0.0f;
      for (int64_t ci = 0; ci < cg; ++ci) {
        const float* xp = x + ((n * g.c + c0 + ci) * g.id) * g.ih * g.iw;
        const float* wp = w + ((oc * cg + ci) * g.kd) * g.kh * g.kw;
        for (int64_t kz = 0; kz < g.kd; ++kz) {
          const int64_t zz = oz * g.sd + kz * g.dd - g.pd;
          if (zz < 0 || zz >= g.id) continue;
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t yy = oy * g.sh + ky * g.dh - g.ph;
            if (yy < 0 || yy >= g.ih) continue;
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t xx = ox * g.sw + kx * g.dw - g.pw;
              if (xx < 0 || xx >= g.iw) continue;
              s += xp[(zz * g.ih + yy) * g.iw + xx] * wp[(kz * g.kh + ky) * g.kw + kx];
            }
          }
        }
      }
      y[idx] = s;
    }
  }
};

}  // namespace mpq::cuda
