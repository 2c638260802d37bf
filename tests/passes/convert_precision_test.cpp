// convert_precision: the FP16/BF16 conversion pass. Small hand-built graphs check each rule (where
// Casts go, what stays FP32, which tensors are converted), the test models check accuracy, size and
// Cast counts, and every ONNX backend test case whose ops mpq supports is converted, verified, run
// and compared with its expected outputs. Converted test-data models are written to
// <build>/tests/out/convert_fp16 for scripts/ort_check_converted.py (ONNX Runtime loads them).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "core/half.h"
#include "data/feeds.h"
#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "passes/convert_precision.h"
#include "passes/precision_data.h"
#include "passes/precision_policy.h"
#include "passes/precision_schema.h"
#include "runtime/executor.h"
#include "runtime/low_precision.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;
namespace fs = std::filesystem;
namespace pp = mpq::passes::precision;

namespace {

using test::count_ops;

Node* find_node(const Graph& g, const std::string& name) {
  for (const auto& n : g.nodes())
    if (n->name == name) return n.get();
  return nullptr;
}

// Element type of a value of a converted graph: its initializer or declared type, else what the
// schemas imply from the graph's inputs and constants.
DType elem(const Value* v) {
  if (v->has_initializer()) return v->initializer().dtype();
  if (v->type.is_tensor() && v->type.elem != DType::Undefined) return v->type.elem;
  const Graph* g = v->graph();
  Model probe;  // opset for the schema lookups (the output types the tests rely on are the same at 13..17)
  probe.set_opset("", 13);
  pp::TypeMap types = pp::infer_elem_types(probe, *g, {});
  auto it = types.find(v);
  return it == types.end() ? DType::Undefined : it->second;
}

// The node input `i` after conversion, looking through one Cast.
const Value* through_cast(const Value* v) {
  if (v->producer() && v->producer()->op_type == "Cast") return v->producer()->input(0);
  return v;
}

std::vector<Tensor> run(const Model& m, const rt::Feeds& feeds) { return test::run_model(m, feeds); }

double cosine(const Tensor& a, const Tensor& b) { return pp::compare_tensors(a, b).cosine; }

Value* add_const(Graph& g, const std::string& name, Tensor t) { return g.add_initializer(g.unique_name(name), std::move(t)); }

passes::ConvertReport convert(Model& m, passes::ConvertOptions o = {}) {
  passes::ConvertReport r = passes::convert_precision(m, o);
  auto problems = verify(m);
  INFO((problems.empty() ? std::string() : problems.front()));
  REQUIRE(problems.empty());
  return r;
}

// Saves, reloads and verifies: what a user gets from `mpq convert`.
Model roundtrip(const Model& m) {
  Model back = parse_model(serialize_model(m), fs::path(), "converted");
  auto problems = verify(back);
  INFO((problems.empty() ? std::string() : problems.front()));
  REQUIRE(problems.empty());
  return back;
}

// x[1,3,8,8] -> Conv(w) -> Relu -> Flatten -> MatMul(wm) -> Softmax -> y
Model conv_softmax_model() {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{1, 3, 8, 8}));
  g.add_input(x);
  Value* w = add_const(g, "w", test::random_tensor({4, 3, 3, 3}, 1));
  Value* c = g.add_value("c");
  g.add_node("Conv", {x, w}, {c}, "conv")->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Value* r = g.add_value("r");
  g.add_node("Relu", {c}, {r}, "relu");
  Value* f = g.add_value("f");
  g.add_node("Flatten", {r}, {f}, "flatten");
  Value* wm = add_const(g, "wm", test::random_tensor({256, 10}, 2, -0.1f, 0.1f));
  Value* mm = g.add_value("mm");
  g.add_node("MatMul", {f, wm}, {mm}, "matmul");
  Value* y = g.add_value("y", ValueType::tensor(DType::Float32, Shape{1, 10}));
  g.add_node("Softmax", {mm}, {y}, "softmax");
  g.add_output(y);
  return m;
}

}  // namespace

TEST_CASE("convert_precision: tensor-core ops go low, Softmax stays FP32, Casts only at boundaries", "[passes][precision]") {
  Model m = conv_softmax_model();
  rt::Feeds feeds{{"x", test::random_tensor({1, 3, 8, 8}, 7)}};
  auto want = run(m, feeds);
  passes::ConvertReport rep = convert(m);
  Graph& g = *m.graph;
  CHECK(rep.nodes_low == 4);  // Conv, Relu, Flatten, MatMul
  CHECK(rep.nodes_fp32 == 1);
  REQUIRE(rep.kept.size() == 1);
  CHECK(rep.kept[0].node == "softmax");
  CHECK(rep.kept[0].category == "policy");
  // One Cast after the input, one before Softmax; Softmax's FP32 output is the graph output.
  CHECK(count_ops(g, "Cast") == 2);
  CHECK(rep.casts_inserted == 2);
  CHECK(elem(find_node(g, "conv")->input(0)) == DType::Float16);
  CHECK(find_node(g, "conv")->input(0)->producer()->input(0)->name() == "x");
  CHECK(elem(find_node(g, "conv")->input(1)) == DType::Float16);
  CHECK(find_node(g, "conv")->input(1)->name() == "w");  // converted in place, name kept
  CHECK(elem(find_node(g, "softmax")->input(0)) == DType::Float32);
  CHECK(g.inputs()[0]->type.elem == DType::Float32);
  CHECK(g.outputs()[0]->type.elem == DType::Float32);
  CHECK(g.outputs()[0]->name() == "y");
  CHECK(rep.initializers_converted == 2);
  passes::PrecisionLayout layout = passes::describe_precision(m);
  CHECK(layout.islands == 1);
  CHECK(layout.max_casts_per_island() == 1);
  CHECK(layout.interface_casts == 1);
  Model back = roundtrip(m);
  auto got = run(back, feeds);
  CHECK(got[0].dtype() == DType::Float32);
  CHECK(cosine(got[0], want[0]) > 0.9999);
}

TEST_CASE("convert_precision: keep_io_types off changes the interface", "[passes][precision]") {
  Model m = conv_softmax_model();
  passes::ConvertOptions o;
  o.keep_io_types = false;
  convert(m, o);
  Graph& g = *m.graph;
  CHECK(g.inputs()[0]->type.elem == DType::Float16);
  CHECK(g.outputs()[0]->type.elem == DType::Float16);
  CHECK(g.outputs()[0]->name() == "y");
  // The FP16 input feeds Conv directly; Softmax's FP32 result is cast once for the output.
  CHECK(find_node(g, "conv")->input(0)->name() == "x");
  CHECK(count_ops(g, "Cast") == 2);
  CHECK(g.outputs()[0]->producer()->op_type == "Cast");
  rt::Feeds feeds{{"x", rt::narrow_from_float32(test::random_tensor({1, 3, 8, 8}, 7), DType::Float16)}};
  auto got = run(roundtrip(m), feeds);
  CHECK(got[0].dtype() == DType::Float16);
}

TEST_CASE("convert_precision: one shared Cast per boundary tensor, initializers converted only where used low",
          "[passes][precision]") {
  // x -> MatMul(w) -> h ; h -> Exp -> e ; h -> Softmax -> s ; h -> Relu -> r
  // w also feeds an FP32 consumer (ReduceSum), so it gets a float16 copy.
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 8}));
  g.add_input(x);
  Value* w = add_const(g, "w", test::random_tensor({8, 8}, 3));
  Value* h = g.add_value("h");
  g.add_node("MatMul", {x, w}, {h}, "mm");
  Value* e = g.add_value("e");
  g.add_node("Exp", {h}, {e}, "exp");
  Value* s = g.add_value("s");
  g.add_node("Softmax", {h}, {s}, "softmax");
  Value* r = g.add_value("r");
  g.add_node("Relu", {h}, {r}, "relu");
  Value* ws = g.add_value("ws");
  g.add_node("ReduceSum", {w}, {ws}, "wsum")->set_attr(Attribute::make_int("keepdims", 0));
  for (Value* v : {e, s, r, ws}) g.add_output(v);
  rt::Feeds feeds{{"x", test::random_tensor({2, 8}, 4)}};
  auto want = run(m, feeds);
  passes::ConvertReport rep = convert(m);
  // h (fp16) is cast once for Exp and Softmax together; r needs one Cast for its FP32 output.
  const Value* exp_in = find_node(g, "exp")->input(0);
  CHECK(exp_in == find_node(g, "softmax")->input(0));
  CHECK(elem(exp_in) == DType::Float32);
  CHECK(exp_in->producer()->op_type == "Cast");
  CHECK(find_node(g, "relu")->input(0)->name() == "h");
  CHECK(count_ops(g, "Cast") == 3);  // x, h, relu output
  // w stays float32 for ReduceSum; MatMul reads a float16 copy.
  CHECK(elem(find_node(g, "wsum")->input(0)) == DType::Float32);
  CHECK(find_node(g, "wsum")->input(0)->name() == "w");
  CHECK(elem(find_node(g, "mm")->input(1)) == DType::Float16);
  CHECK(rep.initializer_copies == 1);
  auto got = run(roundtrip(m), feeds);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].dtype() == DType::Float32);
    CHECK(cosine(got[i], want[i]) > 0.9999);
  }
}

TEST_CASE("convert_precision: constants beyond FP16's range keep their consumer FP32; underflow is counted",
          "[passes][precision]") {
  // Attention-style mask: scores + mask (-1e9 where masked, behind a Transpose) -> Softmax -> MatMul.
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{4, 4}));
  g.add_input(x);
  Value* wq = add_const(g, "wq", test::random_tensor({4, 4}, 5));
  Value* scores = g.add_value("scores");
  g.add_node("MatMul", {x, wq}, {scores}, "mm_scores");
  Tensor mask = Tensor::zeros(DType::Float32, {4, 4});
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) mask.data<float>()[i * 4 + j] = -1.0e9f;
  Value* mask_v = add_const(g, "mask", mask);
  Value* mask_t = g.add_value("mask_t");
  g.add_node("Transpose", {mask_v}, {mask_t}, "transpose");
  Value* masked = g.add_value("masked");
  g.add_node("Add", {scores, mask_t}, {masked}, "add_mask");
  Value* probs = g.add_value("probs");
  g.add_node("Softmax", {masked}, {probs}, "softmax");
  Tensor tiny = test::random_tensor({4, 4}, 6);
  tiny.data<float>()[0] = 1e-9f;   // below half the smallest FP16 subnormal: becomes 0
  tiny.data<float>()[1] = -2e-8f;  // likewise
  tiny.data<float>()[2] = 1e-7f;   // a subnormal, kept
  Value* wt = add_const(g, "wtiny", tiny);
  Value* y = g.add_value("y");
  g.add_node("MatMul", {probs, wt}, {y}, "mm_out");
  g.add_output(y);
  rt::Feeds feeds{{"x", test::random_tensor({4, 4}, 8)}};
  auto want = run(m, feeds);
  passes::ConvertReport rep = convert(m);
  CHECK(rep.overflow_constants >= 1);
  CHECK(elem(find_node(g, "transpose")->input(0)) == DType::Float32);
  CHECK(elem(find_node(g, "add_mask")->input(1)) == DType::Float32);
  CHECK(find_node(g, "add_mask")->input(1)->name() == "mask_t");
  CHECK(elem(find_node(g, "mm_scores")->input(1)) == DType::Float16);
  CHECK(elem(find_node(g, "mm_out")->input(1)) == DType::Float16);
  bool found = false;
  for (const auto& k : rep.kept) found = found || (k.node == "add_mask" && k.category == "constant");
  CHECK(found);
  CHECK(rep.underflow_values == 2);
  REQUIRE(rep.underflow_tensors.size() == 1);
  CHECK(rep.underflow_tensors[0].first == "wtiny");
  auto got = run(roundtrip(m), feeds);
  for (int64_t i = 0; i < got[0].numel(); ++i) CHECK(std::isfinite(got[0].get_double(i)));
  CHECK(cosine(got[0], want[0]) > 0.9999);
}

TEST_CASE("convert_precision: Resize scales and roi stay float32, Shape never gets a Cast", "[passes][precision]") {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{1, 2, 4, 4}));
  g.add_input(x);
  Value* w = add_const(g, "w", test::random_tensor({2, 2, 1, 1}, 9));
  Value* c = g.add_value("c");
  g.add_node("Conv", {x, w}, {c}, "conv");
  Value* roi = add_const(g, "roi", Tensor::from<float>({0}, std::vector<float>{}));
  Value* scales = add_const(g, "scales", Tensor::from<float>({4}, {1, 1, 2, 2}));
  Value* up = g.add_value("up");
  g.add_node("Resize", {c, roi, scales}, {up}, "resize")->set_attr(Attribute::make_string("mode", "linear"));
  Value* shape = g.add_value("shape");
  g.add_node("Shape", {up}, {shape}, "shape");
  Value* w2 = add_const(g, "w2", test::random_tensor({2, 2, 1, 1}, 10));
  Value* y = g.add_value("y");
  g.add_node("Conv", {up, w2}, {y}, "conv2");
  g.add_output(y);
  g.add_output(shape);
  rt::Feeds feeds{{"x", test::random_tensor({1, 2, 4, 4}, 11)}};
  auto want = run(m, feeds);
  convert(m);
  Node* resize = find_node(g, "resize");
  CHECK(elem(resize->input(0)) == DType::Float16);
  CHECK(elem(resize->input(1)) == DType::Float32);
  CHECK(elem(resize->input(2)) == DType::Float32);
  CHECK(resize->input(2)->name() == "scales");
  CHECK(find_node(g, "shape")->input(0)->name() == "up");
  CHECK(count_ops(g, "Cast") == 2);
  auto got = run(roundtrip(m), feeds);
  CHECK(cosine(got[0], want[0]) > 0.9999);
  CHECK(got[1].to_int64_vector() == want[1].to_int64_vector());
}

TEST_CASE("convert_precision: existing Casts are retargeted, no-op Casts and chains removed, integers untouched",
          "[passes][precision]") {
  // ids(int64) -> Cast(float) -> Add(x . ) ; x -> Cast(float) (no-op) -> MatMul ; Gather with int64 indices.
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{3, 4}));
  Value* ids = g.add_value("ids", ValueType::tensor(DType::Int64, Shape{3, 4}));
  g.add_input(x);
  g.add_input(ids);
  Value* xc = g.add_value("xc");
  g.add_node("Cast", {x}, {xc}, "noop_cast")->set_attr(Attribute::make_int("to", 1));
  Value* w = add_const(g, "w", test::random_tensor({4, 4}, 12));
  Value* h = g.add_value("h");
  g.add_node("MatMul", {xc, w}, {h}, "mm");
  Value* idf = g.add_value("idf");
  g.add_node("Cast", {ids}, {idf}, "id_cast")->set_attr(Attribute::make_int("to", 1));
  Value* s = g.add_value("s");
  g.add_node("Add", {h, idf}, {s}, "add");
  Value* table = add_const(g, "table", test::random_tensor({5, 3}, 13));
  Value* idx = add_const(g, "idx", Tensor::from<int64_t>({2}, {4, 1}));
  Value* gathered = g.add_value("gathered");
  g.add_node("Gather", {table, idx}, {gathered}, "gather");
  Value* w2 = add_const(g, "w2", test::random_tensor({4, 3}, 14));
  Value* p = g.add_value("p");
  g.add_node("MatMul", {s, w2}, {p}, "mm2");
  Value* y = g.add_value("y");
  g.add_node("MatMul", {gathered, p}, {y}, "mm3");
  g.add_output(y);
  rt::Feeds feeds{{"x", test::random_tensor({3, 4}, 15)}, {"ids", Tensor::from<int64_t>({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2})}};
  auto want = run(m, feeds);
  passes::ConvertReport rep = convert(m);
  Node* id_cast = find_node(g, "id_cast");
  REQUIRE(id_cast);
  CHECK(id_cast->attr_int("to", 0) == static_cast<int64_t>(DType::Float16));
  CHECK(rep.casts_retargeted >= 1);
  // The original no-op Cast became the boundary Cast to float16 (retargeted): no Cast reads a Cast.
  for (const auto& n : g.nodes())
    if (n->op_type == "Cast" && n->input(0)->producer()) CHECK(n->input(0)->producer()->op_type != "Cast");
  CHECK(find_node(g, "noop_cast")->attr_int("to", 0) == static_cast<int64_t>(DType::Float16));
  CHECK(elem(find_node(g, "gather")->input(1)) == DType::Int64);
  CHECK(find_node(g, "gather")->input(1)->name() == "idx");
  CHECK(elem(find_node(g, "gather")->input(0)) == DType::Float16);
  CHECK(count_ops(g, "Cast") == 3);  // x (the retargeted no-op), ids, output
  auto got = run(roundtrip(m), feeds);
  CHECK(cosine(got[0], want[0]) > 0.9999);
}

TEST_CASE("convert_precision: If bodies are converted and read outer values in FP32", "[passes][precision]") {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 4}));
  Value* cond = g.add_value("cond", ValueType::tensor(DType::Bool, Shape{}));
  g.add_input(x);
  g.add_input(cond);
  Value* w = add_const(g, "w", test::random_tensor({4, 4}, 16));
  Value* h = g.add_value("h");
  g.add_node("MatMul", {x, w}, {h}, "mm");
  auto branch = [&](const std::string& name, uint32_t seed) {
    auto b = std::make_shared<Graph>(name, &g);
    Value* outer = b->add_outer_scope_value("h");
    Value* bw = b->add_initializer(name + "_w", test::random_tensor({4, 4}, seed));
    Value* o1 = b->add_value(name + "_mm");
    b->add_node("MatMul", {outer, bw}, {o1}, name + "_matmul");
    Value* o2 = b->add_value(name + "_out", ValueType::tensor(DType::Float32, Shape{2, 4}));
    b->add_node("Softmax", {o1}, {o2}, name + "_softmax");
    b->add_output(o2);
    return b;
  };
  Value* y = g.add_value("y", ValueType::tensor(DType::Float32, Shape{2, 4}));
  Node* iff = g.add_node("If", {cond}, {y}, "if");
  iff->set_attr(Attribute::make_graph("then_branch", branch("then", 17)));
  iff->set_attr(Attribute::make_graph("else_branch", branch("else", 18)));
  g.add_output(y);
  Tensor xt = test::random_tensor({2, 4}, 19);
  auto want_t = run(m, {{"x", xt}, {"cond", Tensor::scalar<bool>(true)}});
  auto want_f = run(m, {{"x", xt}, {"cond", Tensor::scalar<bool>(false)}});
  passes::ConvertReport rep = convert(m);
  CHECK(rep.subgraphs == 2);
  Graph* then_b = iff->attr_graph("then_branch");
  // The body reads h in FP32 (through one Cast in the outer graph); its MatMul runs in FP16.
  Node* body_mm = find_node(*then_b, "then_matmul");
  REQUIRE(body_mm);
  const Value* body_in = through_cast(body_mm->input(0));
  CHECK(body_in->is_outer_scope());
  Value* outer_ref = g.find(body_in->name());
  REQUIRE(outer_ref);
  CHECK(elem(outer_ref) == DType::Float32);
  CHECK(elem(body_mm->input(1)) == DType::Float16);
  CHECK(then_b->outputs()[0]->type.elem == DType::Float32);
  Model back = roundtrip(m);
  auto got_t = run(back, {{"x", xt}, {"cond", Tensor::scalar<bool>(true)}});
  auto got_f = run(back, {{"x", xt}, {"cond", Tensor::scalar<bool>(false)}});
  CHECK(cosine(got_t[0], want_t[0]) > 0.9999);
  CHECK(cosine(got_f[0], want_f[0]) > 0.9999);
}

TEST_CASE("convert_precision: --keep-fp32 / --force-low overrides, and their errors", "[passes][precision]") {
  {
    Model m = conv_softmax_model();
    passes::ConvertOptions o;
    o.keep_fp32 = {"conv"};
    o.force_low = {"Softmax"};
    convert(m, o);
    CHECK(elem(find_node(*m.graph, "conv")->input(1)) == DType::Float32);
    CHECK(elem(find_node(*m.graph, "softmax")->input(0)) == DType::Float16);
  }
  {
    Model m = conv_softmax_model();
    passes::ConvertOptions o;
    o.keep_fp32 = {"MatMul"};
    passes::ConvertReport rep = convert(m, o);
    CHECK(elem(find_node(*m.graph, "matmul")->input(1)) == DType::Float32);
    bool user = false;
    for (const auto& k : rep.kept) user = user || (k.node == "matmul" && k.category == "user");
    CHECK(user);
  }
  {
    Model m = conv_softmax_model();
    passes::ConvertOptions o;
    o.keep_fp32 = {"NoSuchThing"};
    CHECK_THROWS_AS(passes::convert_precision(m, o), Error);
  }
  {
    Model m = conv_softmax_model();
    passes::ConvertOptions o;
    o.keep_fp32 = {"Conv"};
    o.force_low = {"Conv"};
    CHECK_THROWS_AS(passes::convert_precision(m, o), Error);
  }
  {
    Model m = conv_softmax_model();
    passes::ConvertOptions o;
    o.low = DType::Float32;
    CHECK_THROWS_AS(passes::convert_precision(m, o), Error);
  }
}

TEST_CASE("convert_precision: data-aware mode keeps nodes with large activations in FP32", "[passes][precision]") {
  Model m = conv_softmax_model();
  std::unordered_map<std::string, double> mags = {{"x", 3.0}, {"c", 5000.0}, {"r", 5000.0}, {"f", 5000.0},
                                                  {"mm", 70000.0}, {"y", 1.0}};
  passes::ConvertOptions o;
  o.magnitudes = &mags;
  passes::ConvertReport rep = convert(m, o);
  std::map<std::string, std::string> why;
  for (const auto& k : rep.kept) why[k.node] = k.category + ": " + k.reason;
  CHECK(why["conv"].find("exceeds --max-magnitude 4096") != std::string::npos);
  CHECK(why["matmul"].find("would overflow") != std::string::npos);
  CHECK(rep.nodes_low == 0);
  // A higher threshold lets the Conv go low again; the MatMul still overflows.
  Model m2 = conv_softmax_model();
  o.max_magnitude = 8192;
  rep = convert(m2, o);
  CHECK(elem(find_node(*m2.graph, "conv")->input(1)) == DType::Float16);
  CHECK(elem(find_node(*m2.graph, "matmul")->input(1)) == DType::Float32);
}

TEST_CASE("convert_precision: BF16 raises the opset as needed and respects ONNX's type constraints", "[passes][precision]") {
  Model m = conv_softmax_model();
  find_node(*m.graph, "relu")->op_type = "LeakyRelu";  // bfloat16 only from opset 16
  rt::Feeds feeds{{"x", test::random_tensor({1, 3, 8, 8}, 7)}};
  auto want = run(m, feeds);
  passes::ConvertOptions o;
  o.low = DType::BFloat16;
  {
    Model plain = conv_softmax_model();  // nothing gains bfloat16 by raising: the opset stays
    convert(plain, o);
    CHECK(plain.opset() == 13);
  }
  passes::ConvertReport rep = convert(m, o);
  CHECK(rep.opset_before == 13);
  CHECK(m.opset() == 16);
  CHECK(rep.opset_after == 16);
  // Conv has no bfloat16 before opset 22: it stays FP32 (schema); MatMul runs in bfloat16.
  CHECK(elem(find_node(*m.graph, "conv")->input(1)) == DType::Float32);
  CHECK(elem(find_node(*m.graph, "matmul")->input(1)) == DType::BFloat16);
  bool schema = false;
  for (const auto& k : rep.kept) schema = schema || (k.node == "conv" && k.category == "schema");
  CHECK(schema);
  auto got = run(roundtrip(m), feeds);
  CHECK(cosine(got[0], want[0]) > 0.999);

  Model old;
  old.set_opset("", 9);
  Graph& g = *old.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2, 2}));
  g.add_input(x);
  Value* y = g.add_value("y");
  Node* sc = g.add_node("Scan", {x}, {y}, "scan");
  auto body = std::make_shared<Graph>("body", &g);
  Value* bi = body->add_value("bi", ValueType::tensor(DType::Float32, Shape{2}));
  body->add_input(bi);
  Value* bo = body->add_value("bo", ValueType::tensor(DType::Float32, Shape{2}));
  body->add_node("Relu", {bi}, {bo});
  body->add_output(bo);
  sc->set_attr(Attribute::make_graph("body", body));
  sc->set_attr(Attribute::make_int("num_scan_inputs", 1));
  g.add_output(y);
  CHECK_THROWS_WITH(passes::convert_precision(old, o), Catch::Contains("opset 13"));
}

TEST_CASE("convert_precision: same model and options give byte-identical files", "[passes][precision]") {
  fs::path src = test::source_dir() / "tests/models/transformer_op13.onnx";
  Model a = load_model(src), b = load_model(src);
  convert(a);
  convert(b);
  CHECK(serialize_model(a) == serialize_model(b));
}

TEST_CASE("convert_precision: written-out LayerNorm overflows in naive FP16 but not after mpq's conversion",
          "[passes][precision][overflow]") {
  const fs::path dir = test::source_dir() / "tests/models";
  Model ref = load_model(dir / "fp16_overflow.onnx");
  data::FeedSource feeds = data::FeedSource::open(dir / "fp16_overflow_data", ref);
  REQUIRE(feeds.size() >= 1);
  // Naive: every op in FP16 (all ops forced low).
  Model naive = ref.clone();
  passes::ConvertOptions all_low;
  for (const auto& n : naive.graph->nodes()) all_low.force_low.insert(n->op_type);
  convert(naive, all_low);
  Model ours = ref.clone();
  passes::ConvertReport rep = convert(ours);
  int pattern = 0;
  for (const auto& k : rep.kept) pattern += k.category == "pattern";
  CHECK(pattern == 9);  // ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add
  CHECK(passes::describe_precision(ours).max_casts_per_island() <= 2);
  rt::ExecOptions eo;
  pp::Comparison bad = pp::compare_models(ref, roundtrip(naive), feeds, eo);
  pp::Comparison good = pp::compare_models(ref, roundtrip(ours), feeds, eo);
  INFO("naive cosine " << bad.outputs[0].cosine << ", nonfinite " << bad.outputs[0].nonfinite << "; mpq cosine "
                       << good.outputs[0].cosine);
  CHECK((bad.outputs[0].nonfinite > 0 || bad.outputs[0].cosine < 0.9));
  CHECK(good.outputs[0].nonfinite == 0);
  CHECK(good.outputs[0].cosine >= 0.999);
}

TEST_CASE("convert_precision: the test models stay accurate, shrink, and have few Casts", "[passes][precision][models]") {
  const fs::path dir = test::source_dir() / "tests/models";
  std::vector<fs::path> models;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".onnx") models.push_back(e.path());
  if (fs::exists(dir / "fashion"))
    for (const auto& e : fs::directory_iterator(dir / "fashion"))
      if (e.path().extension() == ".onnx") models.push_back(e.path());
  std::sort(models.begin(), models.end());
  REQUIRE(models.size() >= 10);
  const fs::path out_dir = fs::path(MPQ_TEST_OUT_DIR) / "convert_fp16";
  fs::create_directories(out_dir);
  for (const fs::path& path : models) {
    const std::string stem = path.stem().string();
    fs::path data_dir = path.parent_path() / (stem + "_data");
    const bool fashion = path.parent_path().filename() == "fashion";
    if (fashion) data_dir = test::source_dir() / "calib_data/eval";
    for (DType low : {DType::Float16, DType::BFloat16}) {
      INFO(stem << " " << dtype_name(low));
      Model ref = load_model(path);
      Model m = ref.clone();
      passes::ConvertOptions o;
      o.low = low;
      passes::ConvertReport rep = convert(m, o);
      std::string bytes = serialize_model(m);
      Model back = roundtrip(m);
      passes::PrecisionLayout layout = passes::describe_precision(back);
      const double before = static_cast<double>(fs::file_size(path));
      double ratio = static_cast<double>(bytes.size()) / before;
      if (low == DType::Float16) {
        save_model(m, out_dir / ("models__" + stem + ".onnx"));
        // Every float16 initializer saves half its FP32 bytes; the rest of the file (graph, names,
        // FP32 parameters of FP32 ops, provenance) stays the same, plus a Cast node and its value's
        // type (under 256 bytes) per Cast.
        double weights = 0, halved = 0;
        for (const Value* v : ref.graph->initializers())
          if (v->initializer().dtype() == DType::Float32) weights += static_cast<double>(v->initializer().nbytes());
        for (const Value* v : back.graph->initializers())
          if (v->initializer().dtype() == DType::Float16) halved += static_cast<double>(v->initializer().nbytes());
        CHECK(static_cast<double>(bytes.size()) <= before - halved + 1024 + 256.0 * layout.casts);
        if (weights >= 0.97 * before) CHECK(ratio <= 0.52);  // weight-heavy models
        // tiny_bert's residual stream starts at the FP32 embedding LayerNorm, so (widest wins) it
        // stays FP32 and joins every norm into one island: two Casts per sublayer (into and out
        // of its low-precision MatMuls), 6 sublayers, plus the head and the pooling.
        if (stem == "tiny_bert") CHECK(layout.max_casts_per_island() <= 2 * 6 + 4);
        else CHECK(layout.max_casts_per_island() <= 2);
      }
      std::cout << fmt::format("{:<22} {}: {} low, {} fp32, {} casts ({} interface, {} islands, max {}/island), size {:.1f}%",
                               stem, dtype_name(low), rep.nodes_low, rep.nodes_fp32, layout.casts, layout.interface_casts,
                               layout.islands, layout.max_casts_per_island(), 100 * ratio);
      if (!fs::exists(data_dir)) {
        std::cout << " (no data)\n";
        continue;
      }
      data::DataOptions dopts;
      dopts.max_feeds = 4;
      data::FeedSource feeds = data::FeedSource::open(data_dir, ref, dopts);
      pp::Comparison c = pp::compare_models(ref, back, feeds, rt::ExecOptions{});
      for (const auto& oc : c.outputs) {
        std::cout << fmt::format(", {} cosine {:.7f} top-1 {}/{}", oc.name, oc.cosine, oc.top1_agree, oc.rows);
        CHECK(oc.nonfinite == 0);
        if (low == DType::Float16) {
          CHECK(oc.cosine >= (stem == "fp16_overflow" ? 0.999 : 0.9999));
          if (fashion) CHECK(oc.top1_agree == oc.rows);
        } else {
          CHECK(oc.cosine >= 0.99);
        }
      }
      std::cout << "\n";
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Every ONNX backend test case whose ops mpq supports.

namespace {

// Cases whose converted outputs cannot match the FP32 expectation, with the reason.
const std::map<std::string, std::string>& conversion_exceptions() {
  static const std::map<std::string, std::string> m = {
  };
  return m;
}

// Empty when `got` (from the converted model) matches `want` (the case's FP32 expectation).
//  - float outputs of 16+ values: cosine >= 0.9999 over the finite values, inf/NaN where expected;
//  - float outputs of fewer values (cosine says little there): |got - want| <= 1e-2 * max(1, max|want|);
//  - integer, bool and string outputs: exact.
std::string compare_output(const Tensor& got, const Tensor& want, const std::string& name) {
  if (got.shape() != want.shape())
    return fmt::format("output '{}': shape {} vs {}", name, shape_str(got.shape()), shape_str(want.shape()));
  if (got.dtype() != want.dtype())
    return fmt::format("output '{}': dtype {} vs {}", name, dtype_name(got.dtype()), dtype_name(want.dtype()));
  if (want.dtype() == DType::String) return got.strings() == want.strings() ? "" : "strings differ";
  if (!dtype_is_float(want.dtype())) {
    for (int64_t i = 0; i < want.numel(); ++i)
      if (got.get_int64(i) != want.get_int64(i))
        return fmt::format("output '{}': element {} is {} instead of {}", name, i, got.get_int64(i), want.get_int64(i));
    return "";
  }
  pp::OutputComparison c = pp::compare_tensors(got, want);
  if (c.nonfinite) return fmt::format("output '{}': {} inf/NaN where the expectation is finite (or differs)", name, c.nonfinite);
  if (want.numel() >= 16) {
    if (c.cosine >= 0.9999) return "";
    return fmt::format("output '{}': cosine {:.6f} (rel-L2 {:.3g})", name, c.cosine, c.rel_l2);
  }
  double scale = 1.0;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (std::isfinite(want.get_double(i))) scale = std::max(scale, std::fabs(want.get_double(i)));
  if (c.max_abs <= 1e-2 * scale) return "";
  return fmt::format("output '{}': max |err| {:.3g} for values up to {:.3g}", name, c.max_abs, scale);
}

}  // namespace

TEST_CASE("convert_precision: every supported ONNX backend test case converts, verifies, runs and matches",
          "[passes][precision][onnx-testdata]") {
  const fs::path root = test::testdata_dir();
  REQUIRE(fs::exists(root));
  const fs::path out_dir = fs::path(MPQ_TEST_OUT_DIR) / "convert_fp16";
  fs::create_directories(out_dir);
  const char* filter_env = std::getenv("MPQ_CONVERT_FILTER");
  std::regex filter(filter_env ? filter_env : ".*");
  int converted = 0, unsupported = 0, excepted = 0, unexpected_pass = 0, original_fails = 0, against_fp32 = 0;
  std::vector<std::string> failures;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(root / suite))
      if (e.is_directory() && fs::exists(e.path() / "model.onnx")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    for (const fs::path& dir : cases) {
      const std::string name = dir.filename().string();
      if (!std::regex_search(name, filter)) continue;
      std::string result;
      try {
        Model ref = load_model(dir / "model.onnx");
        if (!rt::unsupported_ops(ref).empty()) {
          ++unsupported;
          continue;
        }
        bool plain = true;
        for (const Value* v : ref.graph->inputs()) plain = plain && v->type.is_tensor();
        for (const Value* v : ref.graph->outputs()) plain = plain && v->type.is_tensor();
        if (!plain) {
          ++unsupported;
          continue;
        }
        Model m = ref.clone();
        passes::convert_precision(m, passes::ConvertOptions{});
        auto problems = verify(m);
        if (!problems.empty()) throw std::runtime_error("verify: " + problems.front());
        save_model(m, out_dir / fmt::format("{}__{}.onnx", suite, name));
        Model back = parse_model(serialize_model(m), dir, name);
        problems = verify(back);
        if (!problems.empty()) throw std::runtime_error("re-import: " + problems.front());
        rt::Executor exec_ref(ref);
        rt::Executor exec(back);
        std::vector<Value*> inputs = back.graph->required_inputs();
        std::vector<fs::path> sets;
        for (const auto& e : fs::directory_iterator(dir))
          if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
        std::sort(sets.begin(), sets.end());
        bool counted = false;
        for (const fs::path& set : sets) {
          rt::Feeds feeds;
          for (size_t k = 0; k < inputs.size(); ++k) {
            fs::path f = set / fmt::format("input_{}.pb", k);
            if (fs::exists(f)) feeds[inputs[k]->name()] = load_tensor_pb(f);
          }
          // The FP32 model must run here for the case to say anything about the conversion; where
          // mpq's FP32 result differs from the expectation (a conformance known failure), the
          // converted model is compared with mpq's FP32 result instead.
          std::vector<Tensor> ref_outs;
          try {
            ref_outs = exec_ref.run(feeds);
          } catch (const Error& e) {
            ++original_fails;
            break;
          }
          if (!counted) {
            ++converted;
            counted = true;
          }
          std::vector<Tensor> outs = exec.run(feeds);
          for (size_t k = 0; k < outs.size() && result.empty(); ++k) {
            fs::path f = set / fmt::format("output_{}.pb", k);
            Tensor want = fs::exists(f) ? load_tensor_pb(f) : ref_outs[k];
            if (!compare_output(ref_outs[k], want, "").empty()) {
              want = ref_outs[k];
              ++against_fp32;
            }
            result = compare_output(outs[k], want, exec.output_names()[k]);
            if (!result.empty()) result = set.filename().string() + ": " + result;
          }
          if (!result.empty()) break;
        }
      } catch (const std::exception& e) {
        result = std::string("error: ") + e.what();
      }
      auto ex = conversion_exceptions().find(name);
      if (ex != conversion_exceptions().end()) {
        if (result.empty()) {
          ++unexpected_pass;
          std::cout << fmt::format("[{}] {} passes but is listed as an exception\n", suite, name);
        } else {
          ++excepted;
        }
      } else if (!result.empty()) {
        failures.push_back(fmt::format("{}/{}: {}", suite, name, result));
      }
    }
  }
  std::cout << fmt::format("FP16 conversion of ONNX test data: {} converted and run, {} failed, {} listed exceptions; "
                           "skipped: {} with unsupported ops, {} whose FP32 model does not run in mpq; {} outputs "
                           "compared with mpq's FP32 result (expectation not met in FP32)\n",
                           converted, failures.size(), excepted, unsupported, original_fails, against_fp32);
  for (const std::string& f : failures) std::cout << "  FAIL " << f << "\n";
  CHECK(failures.empty());
  CHECK(unexpected_pass == 0);
  CHECK(converted > 100);
}
