// fuse_qdq_pair: an activation's QuantizeLinear -> DequantizeLinear pair becomes one mpq::FakeQuant
// with the same values bit for bit (ties, clamping, NaN, inf); guarded cases are left alone; on QDQ
// versions of the shipped CNNs, `mpq run`'s pipeline fuses every pair (into a FakeQuant node, or
// into the convolution before it) and keeps the convolutions' tensors channel-blocked through the
// quantization, with the same outputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "calib/calibrator.h"
#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/fuse_qdq_pair.h"
#include "passes/inference_fusion.h"
#include "passes/insert_qdq.h"
#include "passes/pass.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/devices.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  DType zp_type = DType::Int8;  // Undefined: no zero point (uint8)
  int32_t zero_point = 3;
  std::vector<float> q_scale = {0.05f};
  float dq_scale = 0.05f;        // the reader's scale
  int readers = 1;               // DequantizeLinear readers of the quantized tensor
  bool quantized_is_output = false;
  bool other_reader = false;     // an Identity also reads the quantized tensor
  bool constant_input = false;   // the quantized tensor is a constant (a weight), not a graph input
};

Tensor zero_point_tensor(DType t, int32_t v) {
  if (t == DType::UInt8) return Tensor::from<uint8_t>({}, {static_cast<uint8_t>(v)});
  return Tensor::from<int8_t>({}, {static_cast<int8_t>(v)});
}

// x[3, 4, 5] -> QuantizeLinear -> DequantizeLinear (x readers) -> Relu each -> y0, y1, ...
Model qdq_model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  const Shape shape{3, 4, 5};
  Value* x = nullptr;
  if (o.constant_input) {
    x = g.add_initializer("x", test::random_tensor(shape, 5, -3.0f, 3.0f));
  } else {
    x = g.add_value("x", ValueType::tensor(DType::Float32, shape));
    g.add_input(x);
  }
  Value* s = g.add_initializer("s", Tensor::from<float>({static_cast<int64_t>(o.q_scale.size())}, o.q_scale));
  if (o.q_scale.size() == 1) s = g.add_initializer("s_scalar", Tensor::from<float>({}, {o.q_scale[0]}));
  std::vector<Value*> q_in = {x, s};
  if (o.zp_type != DType::Undefined) {
    Tensor zp = zero_point_tensor(o.zp_type, o.zero_point);
    if (o.q_scale.size() > 1) {
      zp = o.zp_type == DType::UInt8 ? Tensor::from<uint8_t>({static_cast<int64_t>(o.q_scale.size())}, std::vector<uint8_t>(o.q_scale.size(), static_cast<uint8_t>(o.zero_point)))
                                     : Tensor::from<int8_t>({static_cast<int64_t>(o.q_scale.size())}, std::vector<int8_t>(o.q_scale.size(), static_cast<int8_t>(o.zero_point)));
    }
    q_in.push_back(g.add_initializer("zp", zp));
  }
  Value* q = g.add_value("q");
  Node* qn = g.add_node("QuantizeLinear", q_in, {q}, "quant");
  if (o.q_scale.size() > 1) qn->set_attr(Attribute::make_int("axis", 1));
  if (o.quantized_is_output) g.add_output(q);
  for (int r = 0; r < o.readers; ++r) {
    std::vector<Value*> dq_in = {q, o.dq_scale == o.q_scale[0] && o.q_scale.size() == 1
                                        ? s
                                        : g.add_initializer("s_dq" + std::to_string(r), Tensor::from<float>({}, {o.dq_scale}))};
    if (o.q_scale.size() > 1) dq_in[1] = g.find("s");
    if (q_in.size() > 2) dq_in.push_back(q_in[2]);
    Value* d = g.add_value("d" + std::to_string(r));
    Node* dn = g.add_node("DequantizeLinear", dq_in, {d}, "dequant" + std::to_string(r));
    if (o.q_scale.size() > 1) dn->set_attr(Attribute::make_int("axis", 1));
    Value* y = g.add_value("y" + std::to_string(r));
    g.add_node("Relu", {d}, {y}, "relu" + std::to_string(r));
    g.add_output(y);
  }
  if (o.other_reader) {
    Value* i = g.add_value("q_copy");
    g.add_node("Identity", {q}, {i}, "copy");
    g.add_output(i);
  }
  return m;
}

// Values that probe every branch: ties at .5 steps of the scale, both zeros, clamping on both
// sides, NaN and infinities.
Tensor probe_input() {
  Tensor t = test::random_tensor({3, 4, 5}, 17, -12.0f, 12.0f);
  float* p = t.data<float>();
  const float s = 0.05f;
  const float special[] = {0.5f * s, 1.5f * s, -2.5f * s, 0.0f, -0.0f, 1000.0f, -1000.0f,
                           std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 6.225f, -6.525f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); ++i) p[i * 5] = special[i];
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * 4) == 0;
}

passes::PassStats fuse_and_compare(Model& m) {
  rt::Feeds feeds;
  if (!m.graph->inputs().empty()) feeds["x"] = probe_input();
  const auto before = test::run_model(m, feeds);
  passes::FuseQdqPair pass;
  const passes::PassStats s = passes::run_pass(pass, m);
  REQUIRE(verify(m).empty());
  const auto after = test::run_model(m, feeds);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].dtype() == DType::Float32) CHECK(same_bits(after[i], before[i]));
  }
  return s;
}

}  // namespace

TEST_CASE("fuse_qdq_pair makes one FakeQuant of a QuantizeLinear and its readers, same bits", "[passes][fuse][qdq]") {
  for (const DType zp_type : {DType::Int8, DType::UInt8, DType::Undefined})
    for (const int readers : {1, 3}) {
      INFO("zero point type " << dtype_name(zp_type) << ", " << readers << " reader(s)");
      Options o;
      o.zp_type = zp_type;
      o.zero_point = zp_type == DType::UInt8 ? 128 : (zp_type == DType::Int8 ? 3 : 0);
      o.readers = readers;
      Model m = qdq_model(o);
      CHECK(fuse_and_compare(m).changed == 1);
      CHECK(test::count_ops(m, "QuantizeLinear") == 0);
      CHECK(test::count_ops(m, "DequantizeLinear") == 0);
      CHECK(test::count_ops(m, "FakeQuant") == 1);
      for (const auto& n : m.graph->nodes())
        if (n->op_type == "FakeQuant") {
          CHECK(n->domain == "mpq");
          CHECK(n->attr_int("qmin", 0) == (zp_type == DType::Int8 ? -128 : 0));
          CHECK(n->attr_int("qmax", 0) == (zp_type == DType::Int8 ? 127 : 255));
          CHECK(n->output(0)->uses().size() == static_cast<size_t>(readers));  // every Relu reads it
        }
    }
}

TEST_CASE("fuse_qdq_pair leaves guarded patterns alone", "[passes][fuse][qdq]") {
  auto unchanged = [](const Options& o) {
    Model m = qdq_model(o);
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  };
  SECTION("a reader dequantizes with another scale") {
    Options o;
    o.dq_scale = 0.1f;
    unchanged(o);
  }
  SECTION("a scale per channel") {
    Options o;
    o.q_scale = {0.05f, 0.1f, 0.2f, 0.4f};
    unchanged(o);
  }
  SECTION("the quantized tensor is a graph output") {
    Options o;
    o.quantized_is_output = true;
    unchanged(o);
  }
  SECTION("another op reads the quantized tensor") {
    Options o;
    o.other_reader = true;
    unchanged(o);
  }
  SECTION("a quantized constant (left for constant folding)") {
    Options o;
    o.constant_input = true;
    unchanged(o);
  }
  SECTION("a float16 input") {
    Model m = qdq_model(Options{});
    m.graph->find("x")->type = ValueType::tensor(DType::Float16, {3, 4, 5});
    passes::FuseQdqPair pass;
    CHECK(passes::run_pass(pass, m).changed == 0);
  }
  SECTION("a later reader's output is a graph output") {
    Options o;
    o.readers = 2;
    Model m = qdq_model(o);
    m.graph->add_output(m.graph->find("d1"));
    const size_t nodes = m.graph->num_nodes();
    CHECK(fuse_and_compare(m).changed == 0);
    CHECK(m.graph->num_nodes() == nodes);
  }
}

namespace {

// The QDQ model `mpq quantize --mode static` makes (min/max ranges from the shipped feeds).
Model qdq_version(const std::string& stem) {
  Model m = test::load_test_model(stem + ".onnx");
  passes::FoldConstants fold;
  passes::FuseConvBn fuse;
  passes::run_pass(fold, m);
  passes::run_pass(fuse, m);
  data::FeedSource feeds = data::FeedSource::open(test::source_dir() / "tests/models" / (stem + "_data"), m);
  calib::CalibOptions co;
  co.method = calib::RangeMethod::MinMax;
  co.max_samples = 4;
  const calib::CalibrationTable table = calib::calibrate(m, feeds, co);
  passes::insert_qdq(m, table, passes::QdqOptions{});
  return m;
}

}  // namespace

TEST_CASE("mpq run's pipeline on QDQ CNNs: every activation pair fused, tensors blocked through them, same outputs",
          "[passes][fuse][qdq][blocked][models]") {
  for (const std::string stem : {"resnet_bn_op17", "mobilenetv3_op17"}) {
    INFO(stem);
    const Model qdq = qdq_version(stem);
    const int pairs = test::count_ops(qdq, "QuantizeLinear");
    REQUIRE(pairs > 4);
    Model m = qdq.clone();
    passes::fuse_for_inference(m, rt::BackendKind::CPU);
    REQUIRE(verify(m).empty());
    // Weights and biases are folded; every activation pair but a graph output's is one FakeQuant
    // node or, right after a convolution, that convolution's fake_quant (fuse_conv_fake_quant).
    CHECK(test::count_ops(m, "DequantizeLinear") == test::count_ops(m, "QuantizeLinear"));
    int in_convs = 0;
    for (const auto& n : m.graph->nodes()) in_convs += n->has_attr("fake_quant") ? 1 : 0;
    CHECK(in_convs > 0);
    CHECK(test::count_ops(m, "FakeQuant") + in_convs >= pairs - 1);
    // Where oneDNN runs blocked convolutions, quantized tensors between them stay blocked: a
    // convolution with x_block set reads a FakeQuant's output or a fake-quantizing convolution's.
    if (rt::cpu_conv_channel_block() > 0) {
      int blocked_through = 0;
      for (const auto& n : m.graph->nodes()) {
        const Node* producer = n->num_inputs() > 0 && n->input(0) ? n->input(0)->producer() : nullptr;
        if (n->attr_int("x_block", 0) != 0 && producer &&
            (producer->op_type == "FakeQuant" || producer->has_attr("fake_quant")))
          ++blocked_through;
      }
      CHECK(blocked_through >= 3);
    }
    const Value* in = m.graph->inputs()[0];
    Shape shape;
    for (const auto& d : in->type.dims) shape.push_back(d.known() ? d.value : 2);
    const rt::Feeds f{{in->name(), test::random_tensor(shape, 9, -1.0f, 1.0f)}};
    const auto want = test::run_model(qdq, f);
    const auto got = test::run_model(m, f);
    REQUIRE(got.size() == want.size());
    // The same bits on the AVX-512 machines this was written on (relative L2 0.0); the bound leaves
    // room for blocked convolutions that sum in another order on other CPUs, where a value may
    // cross a quantizer's rounding edge.
    for (size_t i = 0; i < got.size(); ++i) CHECK(test::rel_l2(got[i], want[i]) < 1e-4);
  }
}
