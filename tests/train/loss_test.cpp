// Losses against PyTorch (values produced once by torch 2.15: F.cross_entropy, F.kl_div of
// log_softmax(s/T) against softmax(t/T) with reduction='batchmean' times T^2, F.mse_loss) and
// against float64 finite differences of the loss itself.
#include <catch2/catch.hpp>

#include <cmath>

#include "test_util.h"
#include "train/loss.h"

using namespace mpq;
using namespace mpq::train;

namespace {
const Tensor kStudent = Tensor::from<float>({2, 3}, {1.0f, -0.5f, 2.0f, 0.3f, 0.1f, -1.2f});
const Tensor kTeacher = Tensor::from<float>({2, 3}, {0.5f, 0.2f, 1.0f, 2.0f, -0.3f, 0.1f});

void check_grad(const Tensor& g, const std::vector<double>& want) {
  REQUIRE(g.numel() == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) CHECK(g.get_double(static_cast<int64_t>(i)) == Approx(want[i]).epsilon(1e-5).margin(1e-7));
}

// Finite-difference check of any loss of one tensor, in float64.
template <typename F>
void check_fd(const Tensor& x64, F loss) {
  const LossResult r = loss(x64);
  for (int64_t i = 0; i < x64.numel(); ++i) {
    Tensor p = x64.clone(), m = x64.clone();
    p.data<double>()[i] += 1e-6;
    m.data<double>()[i] -= 1e-6;
    const double fd = (loss(p).value - loss(m).value) / 2e-6;
    CHECK(r.grad.data<double>()[i] == Approx(fd).epsilon(1e-6).margin(1e-9));
  }
}
}  // namespace

TEST_CASE("Cross-entropy with integer labels", "[train][loss]") {
  const Tensor labels = Tensor::from<int64_t>({2}, {2, 0});
  const LossResult r = cross_entropy(kStudent, labels);
  CHECK(r.value == Approx(0.542700350285).epsilon(1e-7));
  check_grad(r.grad, {0.12685808539390564, 0.028305863961577415, -0.15516397356987, -0.25512534379959106,
                      0.20048640668392181, 0.054638929665088654});
  // Spatial logits [N, C, H, W] average over every labelled position.
  const Tensor x = test::random_tensor({2, 5, 3, 4}, 9, -3, 3).cast_to(DType::Float64);
  Tensor y(DType::Int64, {2, 3, 4});
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = (i * 7) % 5;
  check_fd(x, [&](const Tensor& t) { return cross_entropy(t, y); });
  // Bad labels name the problem.
  CHECK_THROWS_WITH(cross_entropy(kStudent, Tensor::from<int64_t>({2}, {3, 0})), Catch::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(cross_entropy(kStudent, Tensor::from<int64_t>({3}, {0, 0, 0})), Catch::Contains("3 labels"));
  CHECK_THROWS_AS(cross_entropy(kStudent, Tensor::from<float>({2}, {0, 0})), Error);
}

TEST_CASE("KL distillation with a temperature", "[train][loss]") {
  const LossResult r = kl_distillation(kStudent, kTeacher, 2.0);
  CHECK(r.value == Approx(0.294630050659).epsilon(1e-6));
  check_grad(r.grad, {0.0024091601371765137, -0.12235146760940552, 0.11994233727455139, -0.166406512260437,
                      0.19474339485168457, -0.02833680808544159});
  const Tensor t = test::random_tensor({3, 7}, 11, -4, 4).cast_to(DType::Float64);
  for (double T : {1.0, 3.5})
    check_fd(test::random_tensor({3, 7}, 12, -4, 4).cast_to(DType::Float64),
             [&](const Tensor& s) { return kl_distillation(s, t, T); });
  // A student equal to its teacher has zero loss and zero gradient.
  const LossResult same = kl_distillation(kTeacher, kTeacher, 4.0);
  CHECK(same.value == Approx(0.0).margin(1e-12));
  CHECK(test::max_abs_diff(same.grad, Tensor::zeros(DType::Float32, {2, 3})) == 0.0);
  CHECK_THROWS_AS(kl_distillation(kStudent, kTeacher, 0.0), Error);
}

TEST_CASE("MSE", "[train][loss]") {
  const LossResult r = mse(kStudent, kTeacher);
  CHECK(r.value == Approx(1.08000004292).epsilon(1e-6));
  check_grad(r.grad, {0.1666666716337204, -0.23333333432674408, 0.3333333432674408, -0.5666667222976685,
                      0.13333334028720856, -0.4333333671092987});
  CHECK_THROWS_AS(mse(kStudent, Tensor::zeros(DType::Float32, {3, 2})), Error);
}

TEST_CASE("Top-1 accuracy and agreement", "[train][loss]") {
  const Top1 a = top1_against_labels(kStudent, Tensor::from<int64_t>({2}, {2, 1}));
  CHECK(a.correct == 1);
  CHECK(a.total == 2);
  const Top1 b = top1_agreement(kStudent, kTeacher);  // both pick class 2 in row 0 and class 0 in row 1
  CHECK(b.correct == 2);
  const Top1 c = top1_agreement(kStudent, Tensor::from<float>({2, 3}, {0, 1, 0, 0, 1, 0}));
  CHECK(c.correct == 0);
}
