// Optimizers, schedule and clipping against PyTorch. The expected values below were produced once
// by torch 2.15 (torch.optim.SGD / AdamW with two parameter groups: weight decay 0.01 at lr 0.1 and
// no decay at lr 0.05; gradients g_t as in `grads_at`; clip_grad_norm_; CosineAnnealingLR) and are
// pasted here so that CI needs no torch.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "train/optimizer.h"

using namespace mpq;
using namespace mpq::train;

namespace {

std::vector<Parameter> two_params() {
  std::vector<Parameter> ps(2);
  ps[0].name = "p";
  ps[0].value = Tensor::from<float>({4}, {0.5f, -1.0f, 2.0f, 0.25f});
  ps[1].name = "q";
  ps[1].value = Tensor::from<float>({2}, {1.5f, -0.75f});
  for (Parameter& p : ps) p.grad = Tensor::zeros(DType::Float32, p.value.shape());
  return ps;
}

void grads_at(std::vector<Parameter>& ps, int t) {
  const float ft = static_cast<float>(t);
  const float g0[4] = {0.1f * ft + 0.2f, -0.3f, 0.05f * ft, 1.0f - 0.2f * ft};
  const float g1[2] = {0.4f - 0.1f * ft, 0.2f * ft};
  for (int i = 0; i < 4; ++i) ps[0].grad.data<float>()[i] = g0[i];
  for (int i = 0; i < 2; ++i) ps[1].grad.data<float>()[i] = g1[i];
}

std::vector<ParamGroup> groups() {
  return {ParamGroup{"decay", {0}, 1.0, 0.01, false}, ParamGroup{"no-decay", {1}, 0.5, 0.0, false}};
}

using Expected = std::vector<std::pair<std::vector<float>, std::vector<float>>>;

void check_steps(Optimizer& opt, const Expected& want) {
  std::vector<Parameter> ps = two_params();
  for (size_t t = 0; t < want.size(); ++t) {
    grads_at(ps, static_cast<int>(t));
    opt.step(ps, 0.1);
    INFO("step " << t);
    for (int i = 0; i < 4; ++i) CHECK(ps[0].value.data<float>()[i] == Approx(want[t].first[static_cast<size_t>(i)]).epsilon(2e-6).margin(1e-7));
    for (int i = 0; i < 2; ++i) CHECK(ps[1].value.data<float>()[i] == Approx(want[t].second[static_cast<size_t>(i)]).epsilon(2e-6).margin(1e-7));
  }
  CHECK(opt.steps() == static_cast<int64_t>(want.size()));
}

}  // namespace

TEST_CASE("SGD with momentum, Nesterov and plain match torch.optim.SGD", "[train][optim]") {
  SECTION("momentum 0.9") {
    auto opt = make_sgd(groups(), {0.9, 0.0, false});
    check_steps(*opt, {{{0.479499996f, -0.968999982f, 1.99800003f, 0.149749994f}, {1.48000002f, -0.75f}},
                       {{0.430570483f, -0.910130978f, 1.98920202f, -0.0206247587f}, {1.44700003f, -0.75999999f}},
                       {{0.34610337f, -0.826238751f, 1.96929467f, -0.233941421f}, {1.4073f, -0.788999975f}},
                       {{0.219736844f, -0.719909489f, 1.93440866f, -0.465692461f}, {1.36657f, -0.845099986f}}});
  }
  SECTION("Nesterov") {
    auto opt = make_sgd(groups(), {0.9, 0.0, true});
    check_steps(*opt, {{{0.461050004f, -0.941100001f, 1.99619997f, 0.0595249869f}, {1.46200001f, -0.75f}},
                       {{0.386568993f, -0.857201934f, 1.98128724f, -0.173790634f}, {1.41729999f, -0.768999994f}},
                       {{0.270216554f, -0.750911951f, 1.9513979f, -0.425390899f}, {1.37156999f, -0.815100014f}},
                       {{0.106333867f, -0.624595702f, 1.90307295f, -0.673179328f}, {1.32991302f, -0.895590007f}}});
  }
  SECTION("no momentum") {
    auto opt = make_sgd(groups(), {0.0, 0.0, false});
    check_steps(*opt, {{{0.479499996f, -0.968999982f, 1.99800003f, 0.149749994f}, {1.48000002f, -0.75f}},
                       {{0.449020505f, -0.938030958f, 1.99100208f, 0.0696002394f}, {1.46500003f, -0.75999999f}},
                       {{0.408571482f, -0.907092929f, 1.97901106f, 0.00953063555f}, {1.45500004f, -0.779999971f}},
                       {{0.35816291f, -0.876185834f, 1.96203208f, -0.0304788966f}, {1.45000005f, -0.810000002f}}});
  }
}

TEST_CASE("AdamW matches torch.optim.AdamW (decoupled decay, bias correction)", "[train][optim]") {
  auto opt = make_adamw(groups());
  check_steps(*opt, {{{0.399500012f, -0.899000049f, 1.99800003f, 0.149750024f}, {1.45000005f, -0.75f}},
                     {{0.300019771f, -0.798101008f, 1.92158842f, 0.0507877022f}, {1.40087128f, -0.787206829f}},
                     {{0.200995058f, -0.697302878f, 1.83680964f, -0.0455407314f}, {1.35374391f, -0.828635454f}},
                     {{0.101994962f, -0.596605539f, 1.7478236f, -0.137209654f}, {1.31047928f, -0.872210085f}}});
}

TEST_CASE("Optimizer state round-trips through a checkpoint and resumes identically", "[train][optim]") {
  for (bool adam : {false, true}) {
    INFO((adam ? "adamw" : "sgd"));
    auto make = [&] { return adam ? make_adamw(groups()) : make_sgd(groups(), {0.9, 0.0, true}); };
    auto straight = make();
    std::vector<Parameter> a = two_params();
    for (int t = 0; t < 4; ++t) {
      grads_at(a, t);
      straight->step(a, 0.1);
    }
    auto first = make();
    std::vector<Parameter> b = two_params();
    for (int t = 0; t < 2; ++t) {
      grads_at(b, t);
      first->step(b, 0.1);
    }
    Checkpoint c;
    first->save(c, b);
    auto resumed = make();
    resumed->load(c, b);
    for (int t = 2; t < 4; ++t) {
      grads_at(b, t);
      resumed->step(b, 0.1);
    }
    for (size_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < a[k].value.numel(); ++i) CHECK(a[k].value.data<float>()[i] == b[k].value.data<float>()[i]);
    // Loading another optimizer's state is refused.
    auto other = adam ? make_sgd(groups()) : make_adamw(groups());
    CHECK_THROWS_AS(other->load(c, b), Error);
  }
}

TEST_CASE("Cosine schedule with linear warm-up", "[train][optim]") {
  LrSchedule s{0.1, 3, 10, 0.001};
  CHECK(s.at(0) == Approx(0.1 / 3));
  CHECK(s.at(1) == Approx(0.2 / 3));
  CHECK(s.at(2) == Approx(0.1));
  // After warm-up: torch's CosineAnnealingLR(T_max=7, eta_min=0.001) from step 3 on.
  const double torch_lrs[] = {0.1, 0.0950979589612, 0.081362745192, 0.0615147862308, 0.0394852137692,
                              0.019637254808, 0.00590204103883, 0.001};
  for (int k = 0; k < 8; ++k) CHECK(s.at(3 + k) == Approx(torch_lrs[k]).epsilon(1e-10));
  CHECK(s.at(50) == Approx(0.001));  // stays at the floor
}

TEST_CASE("Global-norm gradient clipping matches clip_grad_norm_", "[train][optim]") {
  std::vector<Parameter> ps(2);
  ps[0].value = Tensor::zeros(DType::Float32, {3});
  ps[0].grad = Tensor::from<float>({3}, {3.0f, -4.0f, 1.0f});
  ps[1].value = Tensor::zeros(DType::Float32, {2});
  ps[1].grad = Tensor::from<float>({2}, {2.0f, 0.5f});
  CHECK(clip_grad_norm(ps, 1.5) == Approx(5.5));
  const float want0[] = {0.8181817531585693f, -1.0909090042114258f, 0.27272725105285645f};
  const float want1[] = {0.5454545021057129f, 0.13636362552642822f};
  for (int i = 0; i < 3; ++i) CHECK(ps[0].grad.data<float>()[i] == Approx(want0[i]).epsilon(1e-6));
  for (int i = 0; i < 2; ++i) CHECK(ps[1].grad.data<float>()[i] == Approx(want1[i]).epsilon(1e-6));
  CHECK(grad_norm(ps) == Approx(1.5).epsilon(1e-5));
  // Below the limit nothing changes.
  CHECK(clip_grad_norm(ps, 10.0) == Approx(1.5).epsilon(1e-5));
  CHECK(ps[0].grad.data<float>()[0] == Approx(want0[0]).epsilon(1e-6));
}

TEST_CASE("Log-space groups keep step sizes positive and move them by relative amounts", "[train][optim]") {
  for (bool adam : {false, true}) {
    INFO((adam ? "adamw" : "sgd"));
    std::vector<Parameter> ps(1);
    ps[0].name = "scale";
    ps[0].value = Tensor::from<float>({3}, {1e-4f, 0.02f, 3.0f});
    ps[0].grad = Tensor::from<float>({3}, {50.0f, -2.0f, 0.1f});
    auto opt = adam ? make_adamw({ParamGroup{"scales", {0}, 1.0, 0.5, true}})
                    : make_sgd({ParamGroup{"scales", {0}, 1.0, 0.5, true}}, {0.0, 0.0, false});
    const std::vector<float> before = {1e-4f, 0.02f, 3.0f};
    for (int s = 0; s < 5; ++s) opt->step(ps, 0.1);
    for (int i = 0; i < 3; ++i) {
      const float v = ps[0].value.data<float>()[i];
      CHECK(v > 0.0f);
      // Adam moves u = log(v) by about lr per step: about a factor e^0.5 over 5 steps at most.
      if (adam) CHECK(std::fabs(std::log(v / before[static_cast<size_t>(i)])) <= 0.51);
    }
    // SGD in log space: v *= exp(-lr * v * g), with no weight decay.
    if (!adam) {
      float v = 3.0f;
      for (int s = 0; s < 5; ++s) v *= std::exp(-0.1f * (0.1f * v));
      CHECK(ps[0].value.data<float>()[2] == Approx(v).epsilon(1e-5));
    }
  }
}
