#include "runtime/shape_rules.h"

#include <fmt/format.h>

#include <algorithm>

namespace mpq::rt {

namespace {

// normalize_axis's rule (runtime/cpu/common.h): axis in [-rank, rank), rank 0 taking axis 0.
bool normalized(int64_t axis, int64_t rank, int64_t* a, std::string* why) {
  *a = axis < 0 ? axis + rank : axis;
  if (*a >= 0 && *a < std::max<int64_t>(rank, 1)) return true;
  *why = fmt::format("axis {} is out of range for rank {}", axis, rank);
  return false;
}

}  // namespace

std::string reshape_shape(const Shape& in, const std::vector<int64_t>& spec, bool allowzero, Shape* out) {
  const int64_t numel = shape_numel(in);
  out->assign(spec.size(), 0);
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    const int64_t d = spec[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size())
        return fmt::format("shape {} copies dimension {} (0) but the input {} has rank {}", shape_str(spec), i, shape_str(in),
                           in.size());
      (*out)[i] = in[i];
    } else if (d == -1) {
      if (infer >= 0) return fmt::format("shape {} has more than one -1", shape_str(spec));
      infer = static_cast<int>(i);
      continue;
    } else if (d < -1) {
      return fmt::format("shape {} has an invalid dimension {}", shape_str(spec), d);
    } else {
      (*out)[i] = d;
    }
    known *= (*out)[i];
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return fmt::format("cannot reshape {} ({} elements) to {}", shape_str(in), numel, shape_str(spec));
    (*out)[static_cast<size_t>(infer)] = numel / known;
  }
  if (shape_numel(*out) != numel) return fmt::format("cannot reshape {} ({} elements) to {}", shape_str(in), numel, shape_str(spec));
  return "";
}

std::string flatten_shape(const Shape& in, int64_t axis, Shape* out) {
  const int64_t r = static_cast<int64_t>(in.size());
  const int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a > r) return fmt::format("axis {} is out of range for rank {}", axis, r);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i) (i < a ? outer : inner) *= in[static_cast<size_t>(i)];
  *out = {outer, inner};
  return "";
}

std::string squeeze_shape(const Shape& in, const std::vector<int64_t>& axes, Shape* out) {
  const int64_t r = static_cast<int64_t>(in.size());
  std::vector<bool> drop(in.size(), false);
  if (axes.empty())
    for (size_t i = 0; i < in.size(); ++i) drop[i] = in[i] == 1;
  for (int64_t a : axes) {
    int64_t ax = 0;
    std::string why;
    if (!normalized(a, r, &ax, &why)) return why;
    if (in[static_cast<size_t>(ax)] != 1) return fmt::format("cannot squeeze axis {} of shape {}: its size is not 1", a, shape_str(in));
    drop[static_cast<size_t>(ax)] = true;
  }
  out->clear();
  for (size_t i = 0; i < in.size(); ++i)
    if (!drop[i]) out->push_back(in[i]);
  return "";
}

std::string unsqueeze_shape(const Shape& in, const std::vector<int64_t>& axes, Shape* out) {
  if (axes.empty()) return "axes are required";
  const int64_t out_rank = static_cast<int64_t>(in.size() + axes.size());
  std::vector<bool> is_new(static_cast<size_t>(out_rank), false);
  for (int64_t a : axes) {
    int64_t ax = 0;
    std::string why;
    if (!normalized(a, out_rank, &ax, &why)) return why;
    if (is_new[static_cast<size_t>(ax)]) return fmt::format("axis {} is repeated in {}", a, shape_str(axes));
    is_new[static_cast<size_t>(ax)] = true;
  }
  out->clear();
  size_t j = 0;
  for (int64_t i = 0; i < out_rank; ++i) out->push_back(is_new[static_cast<size_t>(i)] ? 1 : in[j++]);
  return "";
}

}  // namespace mpq::rt
