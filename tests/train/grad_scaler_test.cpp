// Dynamic loss scaling with GradScaler's semantics: initial 2^16, x2 after growth_interval clean
// steps, x0.5 and a skipped step on inf/NaN, unscaling by the float32 reciprocal, state through a
// checkpoint.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "test_util.h"
#include "train/grad_scaler.h"

using namespace mpq;
using namespace mpq::train;

namespace {
std::vector<Parameter> params_with_grads(std::vector<float> g) {
  std::vector<Parameter> ps(1);
  ps[0].name = "w";
  ps[0].value = Tensor::zeros(DType::Float32, {static_cast<int64_t>(g.size())});
  ps[0].grad = Tensor::from<float>({static_cast<int64_t>(g.size())}, g);
  return ps;
}
}  // namespace

TEST_CASE("GradScaler grows after clean steps and backs off on overflow", "[train][amp]") {
  GradScalerOptions o;
  o.growth_interval = 3;
  GradScaler s(o);
  CHECK(s.scale() == 65536.0);
  for (int step = 0; step < 3; ++step) {
    auto ps = params_with_grads({65536.0f, -131072.0f});
    CHECK_FALSE(s.unscale(ps));
    CHECK(ps[0].grad.data<float>()[0] == 1.0f);
    CHECK(ps[0].grad.data<float>()[1] == -2.0f);
    s.update();
  }
  CHECK(s.scale() == 131072.0);  // doubled after 3 clean steps
  CHECK(s.growth_tracker() == 0);

  auto bad = params_with_grads({1.0f, std::numeric_limits<float>::infinity()});
  CHECK(s.unscale(bad));
  CHECK(s.found_inf());
  s.update();
  CHECK(s.scale() == 65536.0);
  CHECK(s.skipped_steps() == 1);
  auto nan = params_with_grads({std::nanf(""), 0.0f});
  CHECK(s.unscale(nan));
  s.update();
  CHECK(s.scale() == 32768.0);
  // Unscaling twice in one step divides once.
  auto ps = params_with_grads({32768.0f});
  s.unscale(ps);
  s.unscale(ps);
  CHECK(ps[0].grad.data<float>()[0] == 1.0f);
  s.update();
  CHECK_THROWS_AS(s.update(), Error);  // update without unscale
}

TEST_CASE("GradScaler defaults are PyTorch's and its state round-trips", "[train][amp]") {
  GradScaler s;
  for (int i = 0; i < 1999; ++i) {
    auto ps = params_with_grads({1.0f});
    s.unscale(ps);
    s.update();
  }
  CHECK(s.scale() == 65536.0);
  CHECK(s.growth_tracker() == 1999);
  Checkpoint c;
  s.save(c);
  test::TempDir dir;
  c.save(dir / "ckpt");
  GradScaler r;
  r.load(Checkpoint::load(dir / "ckpt"));
  CHECK(r.scale() == 65536.0);
  CHECK(r.growth_tracker() == 1999);
  auto ps = params_with_grads({1.0f});
  r.unscale(ps);
  r.update();
  CHECK(r.scale() == 131072.0);  // the 2000th clean step doubles, as it would have without the round-trip
  GradScalerOptions off;
  off.enabled = false;
  GradScaler disabled(off);
  CHECK(disabled.scale() == 1.0);
  CHECK_THROWS_AS(disabled.load(c), Error);  // written with scaling on
}
