#include "validate/metrics.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/low_precision.h"

namespace mpq::validate {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Sums over one block. Four independent lanes keep the loop pipelined; the lane order is fixed,
// so results are reproducible.
struct BlockSums {
  double rr = 0, cc = 0, rc = 0, ee = 0, abs = 0, max_abs = 0;
};

BlockSums block_sums(const float* r, const float* c, int64_t n) {
  double rr[4] = {0, 0, 0, 0}, cc[4] = {0, 0, 0, 0}, rc[4] = {0, 0, 0, 0}, ee[4] = {0, 0, 0, 0}, ab[4] = {0, 0, 0, 0};
  double mx[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const double a = r[i + k], b = c[i + k], e = b - a, ae = std::fabs(e);
      rr[k] += a * a;
      cc[k] += b * b;
      rc[k] += a * b;
      ee[k] += e * e;
      ab[k] += ae;
      // NaN-propagating max: a NaN error must not be hidden by std::max.
      mx[k] = (ae > mx[k] || ae != ae) ? ae : mx[k];
    }
  }
  for (; i < n; ++i) {
    const double a = r[i], b = c[i], e = b - a, ae = std::fabs(e);
    rr[0] += a * a;
    cc[0] += b * b;
    rc[0] += a * b;
    ee[0] += e * e;
    ab[0] += ae;
    mx[0] = (ae > mx[0] || ae != ae) ? ae : mx[0];
  }
  BlockSums s;
  s.rr = (rr[0] + rr[1]) + (rr[2] + rr[3]);
  s.cc = (cc[0] + cc[1]) + (cc[2] + cc[3]);
  s.rc = (rc[0] + rc[1]) + (rc[2] + rc[3]);
  s.ee = (ee[0] + ee[1]) + (ee[2] + ee[3]);
  s.abs = (ab[0] + ab[1]) + (ab[2] + ab[3]);
  s.max_abs = mx[0];
  for (int k = 1; k < 4; ++k) s.max_abs = (mx[k] > s.max_abs || mx[k] != mx[k]) ? mx[k] : s.max_abs;
  return s;
}

int64_t count_nonfinite(const float* r, const float* c, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += (!std::isfinite(r[i]) || !std::isfinite(c[i])) ? 1 : 0;
  return bad;
}

double cosine_of(double rr, double cc, double rc) {
  if (rr == 0.0 && cc == 0.0) return 1.0;
  if (rr == 0.0 || cc == 0.0) return 0.0;
  return rc / std::sqrt(rr * cc);
}

}  // namespace

void ErrorStats::add(const float* ref, const float* cand, int64_t n) {
  if (n <= 0) return;
  BlockSums s = block_sums(ref, cand, n);
  if (!std::isfinite(s.rr) || !std::isfinite(s.cc) || !std::isfinite(s.ee)) nonfinite_ += count_nonfinite(ref, cand, n);
  count_ += n;
  rr_ += s.rr;
  cc_ += s.cc;
  rc_ += s.rc;
  ee_ += s.ee;
  abs_ += s.abs;
  max_abs_ = (s.max_abs > max_abs_ || s.max_abs != s.max_abs) ? s.max_abs : max_abs_;
}

void ErrorStats::add_rows(const float* ref, const float* cand, int64_t n, int64_t rows) {
  if (rows <= 0 || n % rows != 0) {
    add(ref, cand, n);
    return;
  }
  const int64_t per = n / rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref + r * per;
    const float* b = cand + r * per;
    BlockSums s = block_sums(a, b, per);
    if (!std::isfinite(s.rr) || !std::isfinite(s.cc) || !std::isfinite(s.ee)) nonfinite_ += count_nonfinite(a, b, per);
    count_ += per;
    rr_ += s.rr;
    cc_ += s.cc;
    rc_ += s.rc;
    ee_ += s.ee;
    abs_ += s.abs;
    max_abs_ = (s.max_abs > max_abs_ || s.max_abs != s.max_abs) ? s.max_abs : max_abs_;
    const double cos = cosine_of(s.rr, s.cc, s.rc);
    if (rows_ == 0 || cos < min_row_cosine_ || cos != cos) min_row_cosine_ = cos;
    ++rows_;
  }
}

void ErrorStats::add(const Tensor& ref, const Tensor& cand) {
  if (ref.shape() != cand.shape())
    fail_input("shapes differ: reference {} vs candidate {}", shape_str(ref.shape()), shape_str(cand.shape()));
  Tensor a = as_float32(ref), b = as_float32(cand);
  add(a.data<float>(), b.data<float>(), a.numel());
}

void ErrorStats::merge(const ErrorStats& o) {
  count_ += o.count_;
  nonfinite_ += o.nonfinite_;
  rr_ += o.rr_;
  cc_ += o.cc_;
  rc_ += o.rc_;
  ee_ += o.ee_;
  abs_ += o.abs_;
  max_abs_ = (o.max_abs_ > max_abs_ || o.max_abs_ != o.max_abs_) ? o.max_abs_ : max_abs_;
  if (o.rows_) {
    if (rows_ == 0 || o.min_row_cosine_ < min_row_cosine_ || o.min_row_cosine_ != o.min_row_cosine_)
      min_row_cosine_ = o.min_row_cosine_;
    rows_ += o.rows_;
  }
}

double ErrorStats::cosine() const {
  if (count_ == 0 || nonfinite_) return kNaN;
  return cosine_of(rr_, cc_, rc_);
}

double ErrorStats::rel_l2() const {
  if (count_ == 0 || nonfinite_) return kNaN;
  if (ee_ == 0.0) return 0.0;
  if (rr_ == 0.0) return kInf;
  return std::sqrt(ee_ / rr_);
}

double ErrorStats::snr_db() const {
  if (count_ == 0 || nonfinite_) return kNaN;
  if (ee_ == 0.0) return kInf;
  if (rr_ == 0.0) return -kInf;
  return 10.0 * std::log10(rr_ / ee_);
}

double ErrorStats::max_abs_error() const {
  if (count_ == 0 || nonfinite_) return kNaN;
  return max_abs_;
}

double ErrorStats::mean_abs_error() const {
  if (count_ == 0 || nonfinite_) return kNaN;
  return abs_ / static_cast<double>(count_);
}

double cosine_similarity(const float* a, const float* b, int64_t n) {
  ErrorStats s;
  s.add(a, b, n);
  return s.cosine();
}
double snr_db(const float* ref, const float* cand, int64_t n) {
  ErrorStats s;
  s.add(ref, cand, n);
  return s.snr_db();
}
double rel_l2(const float* ref, const float* cand, int64_t n) {
  ErrorStats s;
  s.add(ref, cand, n);
  return s.rel_l2();
}
double max_abs_error(const float* ref, const float* cand, int64_t n) {
  ErrorStats s;
  s.add(ref, cand, n);
  return s.max_abs_error();
}

std::optional<ClassLayout> class_layout(const Shape& shape, int axis) {
  const int rank = static_cast<int>(shape.size());
  if (rank < 2) return std::nullopt;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  ClassLayout l;
  l.outer = 1;
  for (int i = 0; i < axis; ++i) l.outer *= shape[static_cast<size_t>(i)];
  l.classes = shape[static_cast<size_t>(axis)];
  l.inner = 1;
  for (int i = axis + 1; i < rank; ++i) l.inner *= shape[static_cast<size_t>(i)];
  if (l.classes <= 1) return std::nullopt;
  return l;
}

std::vector<int64_t> argmax_classes(const float* scores, const ClassLayout& l) {
  std::vector<int64_t> out(static_cast<size_t>(l.positions()), -1);
  for (int64_t o = 0; o < l.outer; ++o) {
    const float* base = scores + o * l.classes * l.inner;
    for (int64_t in = 0; in < l.inner; ++in) {
      int64_t best = -1;
      float best_v = 0.0f;
      for (int64_t c = 0; c < l.classes; ++c) {
        const float v = base[c * l.inner + in];
        if (v != v) {
          best = -1;
          break;
        }
        if (best < 0 || v > best_v) {
          best = c;
          best_v = v;
        }
      }
      out[static_cast<size_t>(o * l.inner + in)] = best;
    }
  }
  return out;
}

void Top1Stats::add(const std::vector<int64_t>& r, const std::vector<int64_t>& c) {
  if (r.size() != c.size()) fail_input("top-1: {} reference positions vs {} candidate positions", r.size(), c.size());
  for (size_t i = 0; i < r.size(); ++i) agree_ += (r[i] >= 0 && r[i] == c[i]) ? 1 : 0;
  positions_ += static_cast<int64_t>(r.size());
}

void Top1Stats::add_labels(const std::vector<int64_t>& r, const std::vector<int64_t>& c, const std::vector<int64_t>& labels) {
  add(r, c);
  if (labels.size() != r.size()) fail_input("accuracy: {} labels for {} predictions", labels.size(), r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    ref_correct_ += (r[i] >= 0 && r[i] == labels[i]) ? 1 : 0;
    cand_correct_ += (c[i] >= 0 && c[i] == labels[i]) ? 1 : 0;
  }
  labelled_ += static_cast<int64_t>(labels.size());
}

void Top1Stats::merge(const Top1Stats& o) {
  positions_ += o.positions_;
  agree_ += o.agree_;
  labelled_ += o.labelled_;
  ref_correct_ += o.ref_correct_;
  cand_correct_ += o.cand_correct_;
}

double Top1Stats::agreement() const {
  return positions_ ? static_cast<double>(agree_) / static_cast<double>(positions_) : kNaN;
}
double Top1Stats::disagreement() const {
  return positions_ ? static_cast<double>(positions_ - agree_) / static_cast<double>(positions_) : kNaN;
}
double Top1Stats::ref_accuracy() const {
  return labelled_ ? static_cast<double>(ref_correct_) / static_cast<double>(labelled_) : kNaN;
}
double Top1Stats::cand_accuracy() const {
  return labelled_ ? static_cast<double>(cand_correct_) / static_cast<double>(labelled_) : kNaN;
}
double Top1Stats::accuracy_drop() const {
  return labelled_ ? static_cast<double>(ref_correct_ - cand_correct_) / static_cast<double>(labelled_) : kNaN;
}

Tensor as_float32(const Tensor& t) {
  switch (t.dtype()) {
    case DType::Float32:
      return t;
    case DType::Float16:
    case DType::BFloat16:
      return rt::widen_to_float32(t);
    case DType::Float64:
      return t.cast_to(DType::Float32);
    default:
      fail_input("cannot compare a {} tensor as float values", dtype_name(t.dtype()));
  }
}

}  // namespace mpq::validate
