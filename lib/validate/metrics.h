#pragma once
// Accuracy metrics between a reference tensor stream and a candidate tensor stream. Everything is
// a streaming accumulator: a batch is folded into a few running sums and then dropped, so memory
// does not grow with the number of samples or layers compared.
//
// Definitions (r = reference, c = candidate, e = c - r, sums over every element seen):
//   cosine        = sum(r*c) / sqrt(sum(r^2) * sum(c^2))      (1 when both are all zero)
//   rel_l2        = sqrt(sum(e^2) / sum(r^2))                  (0 when e is all zero)
//   snr_db        = 10 * log10(sum(r^2) / sum(e^2))            (+inf when e is all zero)
//   max_abs_error = max |e|
//   mean_abs_error= sum(|e|) / n
// Non-finite values are counted apart (a NaN or inf in either tensor makes every metric NaN, so
// no threshold can pass by accident).
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace mpq::validate {

class ErrorStats {
 public:
  // Fold n paired elements.
  void add(const float* ref, const float* cand, int64_t n);
  // Fold two tensors of the same shape (float16/bfloat16/float64 are widened). Fails (BadInput)
  // on a shape mismatch or a non-float tensor.
  void add(const Tensor& ref, const Tensor& cand);
  void merge(const ErrorStats& other);

  int64_t count() const { return count_; }
  int64_t nonfinite() const { return nonfinite_; }
  double cosine() const;
  double rel_l2() const;
  double snr_db() const;
  double max_abs_error() const;
  double mean_abs_error() const;
  // Lowest cosine of any one row (see add_rows); NaN when add_rows was never used.
  double min_row_cosine() const { return rows_ ? min_row_cosine_ : std::numeric_limits<double>::quiet_NaN(); }
  int64_t rows() const { return rows_; }
  // Fold a [rows, n/rows] batch row by row: the totals as add(), plus the worst row's cosine.
  void add_rows(const float* ref, const float* cand, int64_t n, int64_t rows);

  double sum_ref_sq() const { return rr_; }
  double sum_err_sq() const { return ee_; }

 private:
  int64_t count_ = 0;
  int64_t nonfinite_ = 0;
  double rr_ = 0, cc_ = 0, rc_ = 0, ee_ = 0, abs_ = 0, max_abs_ = 0;
  int64_t rows_ = 0;
  double min_row_cosine_ = 1.0;
};

// Cosine of two vectors with the conventions above (tests and one-off use).
double cosine_similarity(const float* a, const float* b, int64_t n);
double snr_db(const float* ref, const float* cand, int64_t n);
double rel_l2(const float* ref, const float* cand, int64_t n);
double max_abs_error(const float* ref, const float* cand, int64_t n);

// Where the class scores of an output lie: `axis` of a rank >= 2 float tensor whose extent there
// is > 1. positions = numel / classes (a [N,C] classifier has N positions, a [N,C,H,W] segmenter
// N*H*W).
struct ClassLayout {
  int64_t outer = 0, classes = 0, inner = 0;
  int64_t positions() const { return outer * inner; }
};
// nullopt when the tensor is not a score tensor along `axis` (negative counts from the end).
std::optional<ClassLayout> class_layout(const Shape& shape, int axis);
// Index of the largest score at every position, in (outer, inner) order; ties take the lowest
// class; a position holding NaN scores class -1.
std::vector<int64_t> argmax_classes(const float* scores, const ClassLayout& layout);

// Top-1 agreement between two models at every position, and accuracy against labels.
class Top1Stats {
 public:
  void add(const std::vector<int64_t>& ref_classes, const std::vector<int64_t>& cand_classes);
  // One label per position (positions must equal labels.size()).
  void add_labels(const std::vector<int64_t>& ref_classes, const std::vector<int64_t>& cand_classes,
                  const std::vector<int64_t>& labels);
  void merge(const Top1Stats& other);

  int64_t positions() const { return positions_; }
  int64_t agree() const { return agree_; }
  double agreement() const;  // NaN with no positions
  // Fraction of positions whose top-1 differs, from the counts (not 1 - agreement(), whose
  // rounding would make 998/1000 fail a 0.002 budget).
  double disagreement() const;
  int64_t labelled() const { return labelled_; }
  int64_t ref_correct() const { return ref_correct_; }
  int64_t cand_correct() const { return cand_correct_; }
  double ref_accuracy() const;   // NaN without labels
  double cand_accuracy() const;  // NaN without labels
  // Reference accuracy minus candidate accuracy (a fraction; positive = the candidate is worse).
  double accuracy_drop() const;

 private:
  int64_t positions_ = 0, agree_ = 0;
  int64_t labelled_ = 0, ref_correct_ = 0, cand_correct_ = 0;
};

// Float32 view of a float tensor (float16/bfloat16/float64 converted; float32 returned as is).
Tensor as_float32(const Tensor& t);

}  // namespace mpq::validate
