// The QAT loop (train/qat.h) end to end on the shipped Fashion-MNIST ResNet: the loss falls, the
// export computes exactly what the fine-tuned fake-quant model computed, an interrupted run resumed
// from its checkpoint ends bit-identical to an uninterrupted one, and bad input (labels missing for
// ce, a checkpoint of another model or other settings, nothing to train, a diverging run) is a clear
// error.
#include <catch2/catch.hpp>

#include <cstring>

#include "core/file_io.h"
#include "data/npy.h"
#include "ir/onnx_io.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/qat.h"

using namespace mpq;
using namespace mpq::train;
namespace fs = std::filesystem;

namespace {

fs::path resnet() { return test::source_dir() / "tests/models/fashion/fashion_resnet.onnx"; }
fs::path eval_dir() { return test::source_dir() / "calib_data/eval"; }

// A labelled folder with the first `rows` test images (calib_data/eval holds 1000).
fs::path small_data(const test::TempDir& dir, int64_t rows) {
  const fs::path out = dir / "data";
  fs::create_directories(out);
  const ir::Model m = ir::load_model(resnet());
  const RowDataset all = RowDataset::load(eval_dir(), m);
  const std::vector<int64_t> idx = RowDataset::range(0, rows);
  data::write_npy(out / "images.npy", all.batch(idx).at("input"));
  data::write_npy(out / "labels.npy", all.labels(idx));
  return out;
}

QatOptions base(const fs::path& data) {
  QatOptions o;
  o.model = resnet();
  o.data = data;
  o.batch_size = 16;
  o.steps = 8;
  o.lr = 1e-3;
  o.threads = 2;
  o.calib_samples = 64;
  o.method = calib::RangeMethod::MinMax;
  o.command = "qat_test";
  return o;
}

std::string serialize(const ir::Model& m) {
  test::TempDir d;
  ir::save_model(m, d / "m.onnx");
  return read_file_bytes(d / "m.onnx");
}

}  // namespace

TEST_CASE("QAT lowers the loss and the export computes what was trained", "[qat]") {
  test::TempDir dir;
  QatOptions o = base(small_data(dir, 128));
  o.loss = "ce";
  o.steps = 16;
  std::vector<double> losses;
  o.progress = [&](const QatProgress& p) { losses.push_back(p.loss); };
  o.eval_data = o.data;
  const QatResult r = qat_finetune(o);
  REQUIRE(losses.size() == 16);
  const double first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4, last = (losses[12] + losses[13] + losses[14] + losses[15]) / 4;
  INFO("mean loss of the first 4 steps " << first << ", of the last 4 " << last);
  CHECK(last < first);
  CHECK(r.before.accuracy > 0.5);
  CHECK(r.after.agreement > 0.5);
  CHECK(test::count_ops(r.exported, "QuantizeLinear") > 0);
  CHECK(test::count_ops(r.exported, "FakeQuant") == 0);
  CHECK(r.exported.get_metadata("mpq.qat.steps") == "16");
  // The export, run by mpq, agrees exactly with the fine-tuned fake-quant model's evaluation.
  ir::Model fp32 = ir::load_model(resnet());
  const QatMetrics m = evaluate_against(r.exported, fp32, o.data, 256, 2);
  CHECK(m.agreement == r.after.agreement);
  CHECK(m.rel_l2 == Approx(r.after.rel_l2).epsilon(1e-6));
}

TEST_CASE("An interrupted QAT run resumes bit-identically", "[qat][checkpoint]") {
  test::TempDir dir;
  const fs::path data = small_data(dir, 96);
  for (Amp amp : {Amp::Off, Amp::Fp16}) {
    INFO("amp " << amp_name(amp));
    QatOptions straight = base(data);
    straight.amp = amp;
    straight.checkpoint_dir = dir / ("a_" + std::string(amp_name(amp)));
    const QatResult a = qat_finetune(straight);

    QatOptions first = base(data);
    first.amp = amp;
    first.checkpoint_dir = dir / ("b_" + std::string(amp_name(amp)));
    int seen = 0;
    first.progress = [&](const QatProgress&) { ++seen; };
    first.stop_requested = [&] { return seen >= 3; };
    const QatResult stopped = qat_finetune(first);
    CHECK(stopped.interrupted);
    CHECK(stopped.steps_done == 3);
    CHECK(Checkpoint::load(first.checkpoint_dir / "qat.ckpt").meta().at("step").get<int64_t>() == 3);

    QatOptions again = base(data);
    again.amp = amp;
    again.checkpoint_dir = first.checkpoint_dir;
    again.resume = true;
    const QatResult b = qat_finetune(again);
    CHECK(b.start_step == 3);
    CHECK(serialize(a.exported) == serialize(b.exported));
  }
}

TEST_CASE("QAT refuses bad input with clear messages", "[qat][errors]") {
  test::TempDir dir;
  const fs::path data = small_data(dir, 32);
  // ce without labels
  const fs::path unlabelled = dir / "unlabelled";
  fs::create_directories(unlabelled);
  fs::copy_file(data / "images.npy", unlabelled / "images.npy");
  QatOptions ce = base(unlabelled);
  ce.loss = "ce";
  CHECK_THROWS_WITH(qat_finetune(ce), Catch::Contains("labels") && Catch::Contains("distill"));
  // A checkpoint from another model or with other settings.
  QatOptions a = base(data);
  a.steps = 2;
  a.checkpoint_dir = dir / "ckpt";
  qat_finetune(a);
  QatOptions other = base(data);
  other.steps = 2;
  other.model = test::source_dir() / "tests/models/fashion/fashion_mobilenet.onnx";
  other.checkpoint_dir = a.checkpoint_dir;
  other.resume = true;
  CHECK_THROWS_WITH(qat_finetune(other), Catch::Contains("another model"));
  QatOptions bits = a;
  bits.resume = true;
  bits.quant.weight_bits = 4;
  CHECK_THROWS_WITH(qat_finetune(bits), Catch::Contains("weight_bits"));
  QatOptions nothing = base(data);
  nothing.resume = true;
  nothing.checkpoint_dir = dir / "empty";
  CHECK_THROWS_WITH(qat_finetune(nothing), Catch::Contains("no checkpoint"));
  // Hyperparameters out of their domain: refused before any work, as PyTorch's optimizers refuse a
  // negative decay (a negative clipping norm would flip the gradients).
  QatOptions decay = base(data);
  decay.weight_decay = -0.01;
  CHECK_THROWS_WITH(qat_finetune(decay), Catch::Contains("--weight-decay must be 0 or more, got -0.01"));
  QatOptions clip = base(data);
  clip.max_grad_norm = -1.0;
  CHECK_THROWS_WITH(qat_finetune(clip), Catch::Contains("--clip-grad-norm must be 0"));
  QatOptions rate = base(data);
  rate.lr = 0.0;
  CHECK_THROWS_WITH(qat_finetune(rate), Catch::Contains("--lr must be positive"));
  // A learning rate that blows the weights up: a clear error, not a NaN model.
  QatOptions wild = base(data);
  wild.lr = 1e12;
  wild.steps = 30;
  wild.max_bad_steps = 4;
  try {
    qat_finetune(wild);
    FAIL("diverging run did not fail");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("diverged") != std::string::npos);
    CHECK(e.exit_code() == 2);
  }
}

TEST_CASE("QAT needs trainable weights", "[qat][errors]") {
  // Relu only: nothing to train.
  ir::Model m;
  m.set_opset("", 13);
  ir::Value* x = m.graph->add_value("input", ir::ValueType::tensor(DType::Float32, {ir::Dim::symbol("N"), ir::Dim::fixed(4)}));
  m.graph->add_input(x);
  ir::Value* y = m.graph->add_value("y");
  m.graph->add_node("Relu", {x}, {y});
  m.graph->add_output(y);
  test::TempDir dir;
  test::write_model(m, dir / "relu.onnx");
  fs::create_directories(dir / "d");
  data::write_npy(dir / "d" / "x.npy", test::random_tensor({8, 4}, 1));
  QatOptions o = base(dir / "d");
  o.model = dir / "relu.onnx";
  o.calib_samples = 8;
  CHECK_THROWS_WITH(qat_finetune(o), Catch::Contains("nothing to train"));
}
