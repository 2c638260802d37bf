#include "passes/int8_conv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "passes/drop_redundant_fake_quant.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_fake_quant.h"
#include "runtime/cpu/conv_onednn.h"

namespace mpq::passes {

namespace {

// X's grid: the scale of the FakeQuant that produced it (alone or fused into a convolution, also
// through a MaxPool or Concat of such values: passes/drop_redundant_fake_quant), where its integer
// range relative to the zero point fits int8; 0 otherwise.
float input_int8_scale(const ir::Node& conv) {
  FakeQuantGrid grid;
  if (!fake_quant_grid(conv.input(0), grid)) return 0.0f;
  if (!(grid.scale > 0.0f) || !std::isfinite(grid.scale) || grid.lo < -128.0f || grid.hi > 127.0f) return 0.0f;
  return grid.scale;
}

// Whether every value of w's channel `values` (count n) is an integer in [-qmax, qmax] times s,
// to within 1e-3 of a step (a dequantized weight is rounded to about 1e-7 of its value, at most
// about 1e-5 of a step at 127 steps).
bool on_grid(const float* values, int64_t n, float s, int qmax) {
  const double inv = 1.0 / static_cast<double>(s);
  for (int64_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(values[i]) * inv;
    const double q = std::nearbyint(t);
    if (!(std::fabs(t - q) <= 1e-3) || std::fabs(q) > qmax) return false;
  }
  return true;
}

}  // namespace

bool int8_conv_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MPQ_INT8_CONV");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

std::vector<float> int8_weight_scales(const Tensor& w, int qmax) {
  if (w.dtype() != DType::Float32 || w.rank() < 2 || w.numel() == 0) return {};
  const int64_t M = w.dim(0), per = w.numel() / M;
  const float* data = w.data<float>();
  std::vector<float> scales(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    const float* v = data + m * per;
    float amax = 0.0f;
    for (int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(v[i]));
    if (!std::isfinite(amax)) return {};
    if (amax == 0.0f) {  // all zero: any scale
      scales[static_cast<size_t>(m)] = 1.0f;
      continue;
    }
    // The channel's largest magnitude is k steps: qmax where the scale came from this channel's
    // own range (mpq's per-channel weights), fewer for a scale shared with other channels
    // (per-tensor weights), a clipped range or 4-bit weights. A wrong k usually fails within a few
    // values (zeros and +-max lie on every grid), so the search costs little; a multiple of the
    // true k may be found first, a finer grid that holds the same values exactly.
    bool found = false;
    for (int k = qmax; k >= 1 && !found; --k) {
      const float step = amax / static_cast<float>(k);
      if (on_grid(v, per, step, qmax)) {
        scales[static_cast<size_t>(m)] = step;
        found = true;
      }
    }
    if (!found) return {};
  }
  return scales;
}

namespace {

// A 1x1 convolution of one unpadded pixel (by X's declared type): squeeze-and-excitation's two.
// They stay in float, where mpq's one-pixel product (runtime/cpu/gemm_small) runs them: INT8
// MobileNetV3's six took 0.2-0.7 us each there and 0.7-0.9 us on oneDNN's int8 kernel, whose
// per-call cost outweighs 100-3,000 multiply-adds per image (the model at batch 1: 44 -> 41 us).
bool one_pixel_pointwise(const ir::Node& node, const Tensor& w) {
  if (w.dim(2) != 1 || w.dim(3) != 1) return false;
  for (const int64_t p : node.attr_ints("pads", {}))
    if (p != 0) return false;
  const ir::Value* x = node.input(0);
  if (!x || !x->type.is_tensor() || !x->type.has_shape || x->type.dims.size() != 4) return false;
  return x->type.dims[2] == ir::Dim::fixed(1) && x->type.dims[3] == ir::Dim::fixed(1);
}

}  // namespace

bool MarkInt8Conv::match(const ir::Model&, const ir::Node& node) const {
  if (!is_fused_conv(node) || node.has_attr("int8_scales") || node.num_inputs() < 2) return false;
  if (node.attr_int("group", 1) != 1) return false;
  for (const int64_t d : node.attr_ints("dilations", {}))
    if (d != 1) return false;
  const Tensor* w = constant_value(node.input(1));
  if (!w || w->dtype() != DType::Float32 || w->rank() != 4 || w->dim(1) < 8) return false;
  if (node.num_inputs() > 2 && node.input(2) && !constant_value(node.input(2))) return false;
  if (one_pixel_pointwise(node, *w)) return false;
  // Last, as the costliest (a oneDNN plan, made once per process, only for QDQ models): only where
  // oneDNN runs int8 exactly (VNNI); elsewhere a mark would only move the tensors around it to NHWC.
  return input_int8_scale(node) > 0.0f && rt::cpu::onednn_int8_convolutions();
}

void MarkInt8Conv::apply(ir::Model&, ir::Node& node, PassStats& stats) {
  const std::vector<float> w_scales = int8_weight_scales(*constant_value(node.input(1)));
  if (w_scales.empty()) {
    stats.notes.push_back(node.label() + ": weights not on an int8 grid, the convolution stays in float");
    return;
  }
  std::vector<float> scales{input_int8_scale(node)};
  scales.insert(scales.end(), w_scales.begin(), w_scales.end());
  node.set_attr(ir::Attribute::make_floats("int8_scales", scales));
  ++stats.changed;
}

}  // namespace mpq::passes
