#include "runtime/cuda/plan_conv.h"

#include <algorithm>

#include "core/error.h"

namespace mpq::rt::cuda_plan {

namespace {
std::vector<int> packed_strides(const std::vector<int>& dims) {
  std::vector<int> s(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * dims[d + 1];
  return s;
}
NdDesc desc(const std::vector<int64_t>& dims64) {
  NdDesc d;
  for (int64_t v : dims64) d.dims.push_back(static_cast<int>(v));
  d.strides = packed_strides(d.dims);
  return d;
}
}  // namespace

ConvPlan plan_conv(const ConvRequest& r) {
  const size_t rank = r.x.size();
  if (rank < 3 || r.w.size() != rank) fail_input("Conv: X has rank {} and W rank {}", rank, r.w.size());
  const size_t k = rank - 2;
  auto or_ones = [&](const std::vector<int64_t>& v, const char* what) {
    if (v.empty()) return std::vector<int64_t>(k, 1);
    if (v.size() != k) fail_input("Conv: {} needs {} values", what, k);
    return v;
  };
  const std::vector<int64_t> s = or_ones(r.strides, "strides"), dl = or_ones(r.dilations, "dilations");
  std::vector<int64_t> pads = r.pads.empty() ? std::vector<int64_t>(2 * k, 0) : r.pads;
  if (pads.size() != 2 * k) fail_input("Conv: pads needs {} values", 2 * k);
  if (r.group < 1 || r.x[1] % r.group != 0 || r.w[0] % r.group != 0 || r.w[1] * r.group != r.x[1])
    fail_input("Conv: channels {} / filter {}x{} do not split into {} groups", r.x[1], r.w[0], r.w[1], r.group);

  ConvPlan p;
  p.type = r.type;
  p.group = static_cast<int>(r.group);
  p.y_shape = {r.x[0], r.w[0]};
  for (size_t d = 0; d < k; ++d) {
    const int64_t span = (r.w[2 + d] - 1) * dl[d] + 1;
    const int64_t out = (r.x[2 + d] + pads[d] + pads[k + d] - span) / s[d] + 1;
    if (out < 1) fail_input("Conv: spatial dimension {} has no output (input {}, window {})", d, r.x[2 + d], span);
    p.y_shape.push_back(out);
  }
  // Half inputs accumulate in FP32 and may use tensor cores; FP32 uses them only as TF32 when asked.
  p.compute = ConvDataType::F32;
  p.math = r.type == ConvDataType::F32 ? (r.allow_tf32 ? ConvMath::TensorOp : ConvMath::Fma) : ConvMath::TensorOp;
  // A quarter of the free memory, at most 1 GiB (256 MiB when the free memory is unknown).
  p.workspace_limit = r.free_device_bytes ? std::min<size_t>(r.free_device_bytes / 4, size_t{1} << 30) : (size_t{256} << 20);

  if (k > 3) {
    p.fallback_reason = "more than 3 spatial dimensions";
    return p;
  }
  for (size_t d = 0; d < k; ++d)
    if (pads[d] != pads[k + d]) {
      p.fallback_reason = "asymmetric padding (cuDNN takes one pad per dimension)";
      return p;
    }
  std::vector<int64_t> x = r.x, w = r.w, y = p.y_shape;
  std::vector<int64_t> sp = s, dp = dl, pp(pads.begin(), pads.begin() + static_cast<long>(k));
  if (k == 1) {  // cuDNN's Nd descriptors need at least 4-D: add H = 1
    x.insert(x.begin() + 2, 1);
    w.insert(w.begin() + 2, 1);
    y.insert(y.begin() + 2, 1);
    sp.insert(sp.begin(), 1);
    dp.insert(dp.begin(), 1);
    pp.insert(pp.begin(), 0);
  }
  for (int64_t v : x)
    if (v > 0x7fffffff) {
      p.fallback_reason = "a dimension exceeds cuDNN's 32-bit limit";
      return p;
    }
  p.x = desc(x);
  p.w = desc(w);
  p.y = desc(y);
  for (size_t d = 0; d < sp.size(); ++d) {
    p.strides.push_back(static_cast<int>(sp[d]));
    p.dilations.push_back(static_cast<int>(dp[d]));
    p.pads.push_back(static_cast<int>(pp[d]));
  }
  p.use_cudnn = true;
  return p;
}

}  // namespace mpq::rt::cuda_plan
