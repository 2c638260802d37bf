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

// Convolution backward, as cuDNN's backward-data and backward-filter compute it (same ConvGeom as
// ConvBody). One thread per element of the result, gathering (no atomics), FP32 accumulation in a
// fixed order: the host check of the backward library plans and the GPU fallback when cuDNN has no
// backward algorithm within the budget.

// dX[n, c, z, y, x] = sum over the output channels of c's group and the taps k whose output
// position o = (i + pad - k * dilation) / stride is whole and in range, of dY[n, m, o] * W[m, c - c0, k].
struct ConvGradDataBody {
  ConvGeom g;
  const float* w;
  const float* dy;
  float* dx;
  // The output position a tap reads input position i from, or -1.
  MPQ_HD static int64_t tap_output(int64_t i, int64_t k, int64_t s, int64_t d, int64_t p, int64_t out) {
    const int64_t num = i + p - k * d;
    if (num < 0 || num % s != 0) return -1;
    const int64_t o = num / s;
    return o < out ? o : -1;
  }
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = g.n * g.c * g.id * g.ih * g.iw;
    const int64_t cg = g.c / g.group, mg = g.m / g.group;
    for (int64_t idx = t.global(); idx < total; idx += t.stride()) {
      int64_t r = idx;
      const int64_t ix = r % g.iw;
      r /= g.iw;
      const int64_t iy = r % g.ih;
      r /= g.ih;
      const int64_t iz = r % g.id;
      r /= g.id;
      const int64_t c = r % g.c, n = r / g.c;
      const int64_t grp = c / cg, ci = c % cg;
      float s = 0.0f;
      for (int64_t mi = 0; mi < mg; ++mi) {
        const int64_t oc = grp * mg + mi;
        const float* dyp = dy + ((n * g.m + oc) * g.od) * g.oh * g.ow;
        const float* wp = w + ((oc * cg + ci) * g.kd) * g.kh * g.kw;
        for (int64_t kz = 0; kz < g.kd; ++kz) {
          const int64_t oz = tap_output(iz, kz, g.sd, g.dd, g.pd, g.od);
          if (oz < 0) continue;
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t oy = tap_output(iy, ky, g.sh, g.dh, g.ph, g.oh);
            if (oy < 0) continue;
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t ox = tap_output(ix, kx, g.sw, g.dw, g.pw, g.ow);
              if (ox < 0) continue;
              s += dyp[(oz * g.oh + oy) * g.ow + ox] * wp[(kz * g.kh + ky) * g.kw + kx];
            }
          }
        }
      }
      dx[idx] = s;
    }
  }
};

// dW[m, ci, k] = sum over n and the output positions o of dY[n, m, o] * X[n, c0 + ci, o * s + k * d - p]
// (positions in the padding read zero).
struct ConvGradFilterBody {
  ConvGeom g;
  const float* x;
  const float* dy;
  float* dw;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t cg = g.c / g.group, mg = g.m / g.group;
    const int64_t total = g.m * cg * g.kd * g.kh * g.kw;
    for (int64_t idx = t.global(); idx < total; idx += t.stride()) {
      int64_t r = idx;
      const int64_t kx = r % g.kw;
      r /= g.kw;
      const int64_t ky = r % g.kh;
      r /= g.kh;
      const int64_t kz = r % g.kd;
      r /= g.kd;
      const int64_t ci = r % cg, oc = r / cg;
      const int64_t c = (oc / mg) * cg + ci;
      float s = 0.0f;
      for (int64_t n = 0; n < g.n; ++n) {
        const float* xp = x + ((n * g.c + c) * g.id) * g.ih * g.iw;
        const float* dyp = dy + ((n * g.m + oc) * g.od) * g.oh * g.ow;
        for (int64_t oz = 0; oz < g.od; ++oz) {
          const int64_t zz = oz * g.sd + kz * g.dd - g.pd;
          if (zz < 0 || zz >= g.id) continue;
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t yy = oy * g.sh + ky * g.dh - g.ph;
            if (yy < 0 || yy >= g.ih) continue;
            for (int64_t ox = 0; ox < g.ow; ++ox) {
              const int64_t xx = ox * g.sw + kx * g.dw - g.pw;
              if (xx < 0 || xx >= g.iw) continue;
              s += dyp[(oz * g.oh + oy) * g.ow + ox] * xp[(zz * g.ih + yy) * g.iw + xx];
            }
          }
        }
      }
      dw[idx] = s;
    }
  }
};

}  // namespace mpq::cuda
