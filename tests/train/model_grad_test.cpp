// Whole-model gradients of the shipped Fashion-MNIST models against PyTorch autograd. The
// reference files (tests/models/fashion/grad_refs/*.ckpt) were written once by
// scripts/make_grad_refs.py: PyTorch evaluates each ONNX graph as written in float64 on 16 test
// images and differentiates the mean cross-entropy. mpq computes the same in float32; every
// parameter's gradient must agree to relative L2 1e-4, the loss to 1e-5, and mpq's default choice of
// trainable parameters must be the reference's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>

#include "ir/onnx_io.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/checkpoint.h"
#include "train/loss.h"

using namespace mpq;
using namespace mpq::train;

namespace {

// Nodes of `domain`::`op` in the graph the engine runs.
size_t count_ops(const Autograd& engine, const std::string& domain, const std::string& op) {
  size_t n = 0;
  for (const auto& node : engine.graph().nodes()) n += node->domain == domain && node->op_type == op;
  return n;
}

void check_model(const std::string& model_name, const std::string& mode, int threads, bool fuse = true,
                 const std::function<void(const Autograd&)>& check_graph = {}) {
  const auto dir = test::source_dir() / "tests" / "models" / "fashion";
  const Checkpoint ref = Checkpoint::load(dir / "grad_refs" / (model_name + "_" + mode + ".ckpt"));
  const ir::Model model = ir::load_model(dir / (model_name + ".onnx"));
  AutogradOptions o;
  o.threads = threads;
  o.training = mode == "train";
  o.fuse = fuse;
  Autograd engine(model, o);
  if (check_graph) check_graph(engine);

  std::vector<std::string> ours, theirs = ref.meta().at("parameters").get<std::vector<std::string>>();
  for (const Parameter& p : engine.parameters()) ours.push_back(p.name);
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  CHECK(ours == theirs);

  const std::vector<Tensor> out = engine.forward({{"input", ref.get("input")}});
  const LossResult loss = cross_entropy(out[0], ref.get("labels"));
  CHECK(loss.value == Approx(ref.meta().at("loss").get<double>()).epsilon(1e-5));
  engine.backward({loss.grad});
  double worst = 0;
  std::string worst_name;
  for (const Parameter& p : engine.parameters()) {
    INFO(model_name << " " << mode << ": " << p.name);
    const Tensor& want = ref.get("grad/" + p.name);
    REQUIRE(want.shape() == p.grad.shape());
    const double err = test::rel_l2(p.grad, want);
    if (err > worst) {
      worst = err;
      worst_name = p.name;
    }
    CHECK(err <= 1e-4);
  }
  UNSCOPED_INFO(model_name << " " << mode << ": worst relative L2 " << worst << " (" << worst_name << ")");
  CHECK(worst <= 1e-4);
}

}  // namespace

TEST_CASE("ResNet gradients match PyTorch (frozen and batch-statistics BatchNorm)", "[train][model]") {
  check_model("fashion_resnet", "eval", 2);
  check_model("fashion_resnet", "train", 3);
}

TEST_CASE("MobileNet gradients match PyTorch", "[train][model]") { check_model("fashion_mobilenet", "eval", 2); }

TEST_CASE("ViT gradients match PyTorch, LayerNorm and GELU fused or as written", "[train][model]") {
  // Fused (the default): the nine-node LayerNorms and five-node GELUs train as one node each.
  check_model("fashion_vit", "eval", 2, true, [](const Autograd& e) {
    CHECK(count_ops(e, "mpq", "LayerNormalization") == 9);
    CHECK(count_ops(e, "mpq", "Gelu") == 4);
    CHECK(count_ops(e, "", "Pow") == 0);
    CHECK(count_ops(e, "", "Erf") == 0);
  });
  check_model("fashion_vit", "eval", 1, false, [](const Autograd& e) {
    CHECK(count_ops(e, "mpq", "LayerNormalization") == 0);
    CHECK(count_ops(e, "", "Pow") == 9);
    CHECK(count_ops(e, "", "Erf") == 4);
  });
}
