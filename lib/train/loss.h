#pragma once
// Training losses with their gradients, computed in double and returned as float32 (float64 for
// float64 inputs). Each is the mean over the batch, as PyTorch's default reductions are, so a loss
// does not change scale with the batch size. A non-finite input gives a non-finite loss and
// gradient, which the training step then skips (as GradScaler skips inf/NaN gradients).
#include "core/tensor.h"

namespace mpq::train {

struct LossResult {
  double value = 0.0;
  Tensor grad;  // dL/d(first argument), same shape
};

// Cross-entropy of logits [N, C, d1...] (class axis 1) against integer labels [N, d1...]
// (int64 or int32, values in [0, C)): mean over every labelled position of -log softmax(logits)[label].
LossResult cross_entropy(const Tensor& logits, const Tensor& labels);

// Mean squared error over every element.
LossResult mse(const Tensor& prediction, const Tensor& target);

// Knowledge distillation (Hinton et al.): T^2 * KL(softmax(teacher / T) || softmax(student / T)),
// summed over the classes (axis 1) and averaged over the other positions (PyTorch's "batchmean" for
// [N, C] logits). The gradient is T * (softmax(student / T) - softmax(teacher / T)) / positions.
LossResult kl_distillation(const Tensor& student_logits, const Tensor& teacher_logits, double temperature);

// Fraction of positions where argmax over axis 1 of `logits` equals `labels` (accuracy) or the
// teacher's argmax (agreement), and the counts behind it.
struct Top1 {
  int64_t correct = 0;
  int64_t total = 0;
};
Top1 top1_against_labels(const Tensor& logits, const Tensor& labels);
Top1 top1_agreement(const Tensor& logits, const Tensor& reference_logits);

}  // namespace mpq::train
