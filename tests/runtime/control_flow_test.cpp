// If, Loop and Scan through the executor: branches and bodies reading outer-scope values, loop-
// carried values, scan outputs, zero-trip loops, nested subgraphs, Scan axes and directions
// (opset 9+) and the batched Scan-8 with sequence_lens; negative tests for bad conditions.
#include <catch2/catch.hpp>

#include <memory>

#include "core/half.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using GraphPtr = std::shared_ptr<ir::Graph>;

ir::Value* input(ir::Graph* g, const std::string& name, DType t = DType::Undefined, std::vector<ir::Dim> dims = {},
                 bool typed = false) {
  ir::Value* v = g->add_value(name, typed ? ir::ValueType::tensor(t, std::move(dims)) : ir::ValueType{});
  g->add_input(v);
  return v;
}

ir::Value* node1(ir::Graph* g, const std::string& op, std::vector<ir::Value*> ins, const std::string& out) {
  ir::Value* o = g->add_value(out);
  g->add_node(op, std::move(ins), {o}, out + "_node");
  return o;
}

std::vector<float> floats(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// Main graph: If(cond) -> then: x + y, else: x * y, with x, y read from the main graph.
struct IfModel {
  ir::Model m;
  IfModel() {
    m.set_opset("", 17);
    ir::Graph* g = m.graph.get();
    ir::Value* cond = input(g, "cond");
    ir::Value* x = input(g, "x");
    ir::Value* y = input(g, "y");
    (void)x;
    (void)y;
    auto then_g = std::make_shared<ir::Graph>("then", g);
    then_g->add_output(node1(then_g.get(), "Add", {then_g->add_outer_scope_value("x"), then_g->add_outer_scope_value("y")}, "t_out"));
    auto else_g = std::make_shared<ir::Graph>("else", g);
    else_g->add_output(node1(else_g.get(), "Mul", {else_g->add_outer_scope_value("x"), else_g->add_outer_scope_value("y")}, "e_out"));
    ir::Value* out = g->add_value("out");
    ir::Node* n = g->add_node("If", {cond}, {out}, "if");
    n->set_attr(ir::Attribute::make_graph("then_branch", then_g));
    n->set_attr(ir::Attribute::make_graph("else_branch", else_g));
    g->add_output(out);
  }
};

}  // namespace

TEST_CASE("If runs the branch chosen by the condition with outer-scope values", "[control_flow]") {
  IfModel im;
  rt::Executor exec(im.m);
  Tensor x = Tensor::from<float>({3}, {1, 2, 3}), y = Tensor::from<float>({3}, {4, 5, 6});
  auto out = exec.run({{"cond", Tensor::scalar<bool>(true)}, {"x", x}, {"y", y}});
  CHECK(floats(out[0]) == std::vector<float>{5, 7, 9});
  out = exec.run({{"cond", Tensor::scalar<bool>(false)}, {"x", x}, {"y", y}});
  CHECK(floats(out[0]) == std::vector<float>{4, 10, 18});
  // A one-element [1] condition is accepted.
  out = exec.run({{"cond", Tensor::from<bool>({1}, {true})}, {"x", x}, {"y", y}});
  CHECK(floats(out[0]) == std::vector<float>{5, 7, 9});
}

TEST_CASE("If rejects a non-bool or non-scalar condition", "[control_flow][negative]") {
  IfModel im;
  rt::Executor exec(im.m);
  Tensor x = Tensor::from<float>({3}, {1, 2, 3});
  CHECK_THROWS_AS(exec.run({{"cond", Tensor::scalar<float>(1.0f)}, {"x", x}, {"y", x}}), Error);
  CHECK_THROWS_AS(exec.run({{"cond", Tensor::from<bool>({2}, {true, false})}, {"x", x}, {"y", x}}), Error);
  CHECK_THROWS_AS(exec.run({{"cond", Tensor::scalar<int64_t>(1)}, {"x", x}, {"y", x}}), Error);
  try {
    exec.run({{"cond", Tensor::scalar<float>(1.0f)}, {"x", x}, {"y", x}});
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadInput);
    CHECK(std::string(e.what()).find("If node 'if'") != std::string::npos);
  }
}

namespace {

// Loop(M, cond, s0) with body (i, c, s) -> (c', s + x, s + x as a scan output), where
// c' = i < limit (limit read from the main graph) when `while_cond`, else c passes through.
struct LoopModel {
  ir::Model m;
  explicit LoopModel(bool while_cond) {
    m.set_opset("", 17);
    ir::Graph* g = m.graph.get();
    ir::Value* M = input(g, "M");
    ir::Value* cond = input(g, "cond");
    ir::Value* s0 = input(g, "s0");
    input(g, "x");
    input(g, "limit");
    auto body = std::make_shared<ir::Graph>("body", g);
    ir::Value* i = input(body.get(), "i");
    ir::Value* c = input(body.get(), "c");
    ir::Value* s = input(body.get(), "s");
    ir::Value* sum = node1(body.get(), "Add", {s, body->add_outer_scope_value("x")}, "sum");
    ir::Value* c_out = while_cond ? node1(body.get(), "Less", {i, body->add_outer_scope_value("limit")}, "c_out") : c;
    ir::Value* scan = node1(body.get(), "Mul", {sum, sum}, "sq");
    scan->type = ir::ValueType::tensor(DType::Float32, Shape{2});
    body->add_output(c_out);
    body->add_output(sum);
    body->add_output(scan);
    ir::Value* s_final = g->add_value("s_final");
    ir::Value* scans = g->add_value("scans");
    ir::Node* n = g->add_node("Loop", {M, cond, s0}, {s_final, scans}, "loop");
    n->set_attr(ir::Attribute::make_graph("body", body));
    g->add_output(s_final);
    g->add_output(scans);
  }
};

}  // namespace

TEST_CASE("Loop with a trip count accumulates carried values and scan outputs", "[control_flow]") {
  LoopModel lm(false);
  rt::Executor exec(lm.m);
  rt::Feeds feeds{{"M", Tensor::scalar<int64_t>(4)},
                  {"cond", Tensor::scalar<bool>(true)},
                  {"s0", Tensor::from<float>({2}, {1, -1})},
                  {"x", Tensor::from<float>({2}, {0.5f, 2})},
                  {"limit", Tensor::scalar<int64_t>(100)}};
  auto out = exec.run(feeds);
  CHECK(floats(out[0]) == std::vector<float>{3, 7});
  REQUIRE(out[1].shape() == Shape{4, 2});
  CHECK(floats(out[1]) == std::vector<float>{2.25f, 1, 4, 9, 6.25f, 25, 9, 49});

  SECTION("zero trips: initial values and an empty scan output of the declared shape") {
    feeds["M"] = Tensor::scalar<int64_t>(0);
    out = exec.run(feeds);
    CHECK(floats(out[0]) == std::vector<float>{1, -1});
    CHECK(out[1].shape() == Shape{0, 2});
    CHECK(out[1].dtype() == DType::Float32);
  }
  SECTION("cond false on entry runs nothing") {
    feeds["cond"] = Tensor::scalar<bool>(false);
    out = exec.run(feeds);
    CHECK(floats(out[0]) == std::vector<float>{1, -1});
    CHECK(out[1].shape() == Shape{0, 2});
  }
}

TEST_CASE("Loop as a while loop stops when the body condition turns false", "[control_flow]") {
  LoopModel lm(true);
  rt::Executor exec(lm.m);
  rt::Feeds feeds{{"M", Tensor::scalar<int64_t>(1000)},
                  {"cond", Tensor::scalar<bool>(true)},
                  {"s0", Tensor::from<float>({2}, {0, 0})},
                  {"x", Tensor::from<float>({2}, {1, 10})},
                  {"limit", Tensor::scalar<int64_t>(2)}};
  // Iterations i = 0, 1, 2 run (the condition computed in iteration 2 is false).
  auto out = exec.run(feeds);
  CHECK(floats(out[0]) == std::vector<float>{3, 30});
  CHECK(out[1].shape() == Shape{3, 2});
  // The trip count still bounds the loop.
  feeds["M"] = Tensor::scalar<int64_t>(2);
  out = exec.run(feeds);
  CHECK(floats(out[0]) == std::vector<float>{2, 20});
}

TEST_CASE("Loop keeps float16 loop-carried values in float16", "[control_flow]") {
  LoopModel lm(false);
  rt::Executor exec(lm.m);
  Tensor s0(DType::Float16, {2}), x(DType::Float16, {2});
  s0.data<Float16>()[0] = to_half(1.0f);
  s0.data<Float16>()[1] = to_half(-1.0f);
  x.data<Float16>()[0] = to_half(0.5f);
  x.data<Float16>()[1] = to_half(2.0f);
  auto out = exec.run({{"M", Tensor::scalar<int64_t>(3)}, {"cond", Tensor::scalar<bool>(true)}, {"s0", s0}, {"x", x},
                       {"limit", Tensor::scalar<int64_t>(100)}});
  REQUIRE(out[0].dtype() == DType::Float16);
  CHECK(out[0].get_double(0) == 2.5);
  CHECK(out[0].get_double(1) == 5.0);
  REQUIRE(out[1].dtype() == DType::Float16);
  CHECK(out[1].shape() == Shape{3, 2});
  CHECK(out[1].get_double(5) == 25.0);
}

TEST_CASE("Loop rejects a bad condition or trip count", "[control_flow][negative]") {
  LoopModel lm(false);
  rt::Executor exec(lm.m);
  rt::Feeds feeds{{"M", Tensor::scalar<int64_t>(2)},
                  {"cond", Tensor::scalar<int32_t>(1)},
                  {"s0", Tensor::from<float>({2}, {0, 0})},
                  {"x", Tensor::from<float>({2}, {1, 10})},
                  {"limit", Tensor::scalar<int64_t>(2)}};
  CHECK_THROWS_AS(exec.run(feeds), Error);
  feeds["cond"] = Tensor::scalar<bool>(true);
  feeds["M"] = Tensor::from<int64_t>({2}, {1, 2});
  CHECK_THROWS_AS(exec.run(feeds), Error);
  feeds["M"] = Tensor::scalar<float>(2.0f);
  CHECK_THROWS_AS(exec.run(feeds), Error);
}

TEST_CASE("If nested in a Loop body reads values of both enclosing scopes", "[control_flow]") {
  // Loop body: s' = If(c_outer) then s + x (x from the main graph) else s * k (k from the body).
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph* g = m.graph.get();
  ir::Value* M = input(g, "M");
  ir::Value* s0 = input(g, "s0");
  input(g, "x");
  input(g, "flag");
  auto body = std::make_shared<ir::Graph>("body", g);
  input(body.get(), "i");
  ir::Value* c = input(body.get(), "c");
  ir::Value* s = input(body.get(), "s");
  ir::Value* k = node1(body.get(), "Add", {s, s}, "k");  // a body-local value used by the branch
  (void)k;
  auto then_g = std::make_shared<ir::Graph>("then", body.get());
  then_g->add_output(node1(then_g.get(), "Add", {then_g->add_outer_scope_value("s"), then_g->add_outer_scope_value("x")}, "t"));
  auto else_g = std::make_shared<ir::Graph>("else", body.get());
  else_g->add_output(node1(else_g.get(), "Mul", {else_g->add_outer_scope_value("s"), else_g->add_outer_scope_value("k")}, "e"));
  ir::Value* s_next = body->add_value("s_next");
  ir::Node* ifn = body->add_node("If", {body->add_outer_scope_value("flag")}, {s_next}, "inner_if");
  ifn->set_attr(ir::Attribute::make_graph("then_branch", then_g));
  ifn->set_attr(ir::Attribute::make_graph("else_branch", else_g));
  body->add_output(c);
  body->add_output(s_next);
  ir::Value* out = g->add_value("out");
  ir::Node* loop = g->add_node("Loop", {M, nullptr, s0}, {out}, "loop");
  loop->set_attr(ir::Attribute::make_graph("body", body));
  g->add_output(out);
  rt::Executor exec(m);
  auto r = exec.run({{"M", Tensor::scalar<int64_t>(3)}, {"s0", Tensor::from<float>({1}, {1})}, {"x", Tensor::from<float>({1}, {5})},
                     {"flag", Tensor::scalar<bool>(true)}});
  CHECK(floats(r[0]) == std::vector<float>{16});
  r = exec.run({{"M", Tensor::scalar<int64_t>(3)}, {"s0", Tensor::from<float>({1}, {1})}, {"x", Tensor::from<float>({1}, {5})},
                {"flag", Tensor::scalar<bool>(false)}});
  CHECK(floats(r[0]) == std::vector<float>{128});  // s -> s * (s + s): 1, 2, 8, 128
}

namespace {

// Scan body (state s, input x) -> (s + x, s + x): a running sum.
GraphPtr running_sum_body(ir::Graph* parent) {
  auto body = std::make_shared<ir::Graph>("scan_body", parent);
  ir::Value* s = input(body.get(), "s");
  ir::Value* x = input(body.get(), "xs");
  ir::Value* sum = node1(body.get(), "Add", {s, x}, "sum");
  ir::Value* sum2 = node1(body.get(), "Add", {sum, body->add_outer_scope_value("zero")}, "sum_out");
  body->add_output(sum);
  body->add_output(sum2);
  return body;
}

}  // namespace

TEST_CASE("Scan (opset 9+) axes and directions", "[control_flow]") {
  // x [2, 3, 4] scanned along axis 1 (3 steps of [2, 4]); state [2, 4].
  Tensor x(DType::Float32, {2, 3, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i * i % 17) - 3.0f;
  auto run = [&](int64_t in_dir, int64_t out_axis, int64_t out_dir) {
    ir::Model m;
    m.set_opset("", 16);
    ir::Graph* g = m.graph.get();
    ir::Value* s0 = input(g, "s0");
    ir::Value* xv = input(g, "x");
    input(g, "zero");
    ir::Value* sf = g->add_value("sf");
    ir::Value* ys = g->add_value("ys");
    ir::Node* n = g->add_node("Scan", {s0, xv}, {sf, ys}, "scan");
    n->set_attr(ir::Attribute::make_graph("body", running_sum_body(g)));
    n->set_attr(ir::Attribute::make_int("num_scan_inputs", 1));
    n->set_attr(ir::Attribute::make_ints("scan_input_axes", {-2}));
    n->set_attr(ir::Attribute::make_ints("scan_input_directions", {in_dir}));
    n->set_attr(ir::Attribute::make_ints("scan_output_axes", {out_axis}));
    n->set_attr(ir::Attribute::make_ints("scan_output_directions", {out_dir}));
    g->add_output(sf);
    g->add_output(ys);
    rt::Executor exec(m);
    return exec.run({{"s0", Tensor::zeros(DType::Float32, {2, 4})}, {"x", x}, {"zero", Tensor::scalar<float>(0.0f)}});
  };
  // Reference: step t consumes x[:, idx(t), :]; output k-th collected slice.
  auto reference = [&](int64_t in_dir, int64_t out_axis, int64_t out_dir, Shape& shape) {
    std::vector<std::vector<float>> slices;
    std::vector<float> s(8, 0.0f);
    for (int64_t t = 0; t < 3; ++t) {
      const int64_t idx = in_dir ? 2 - t : t;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t j = 0; j < 4; ++j) s[static_cast<size_t>(b * 4 + j)] += x.data<float>()[(b * 3 + idx) * 4 + j];
      slices.push_back(s);
    }
    if (out_dir) std::reverse(slices.begin(), slices.end());
    std::vector<float> out;
    const int64_t a = out_axis < 0 ? out_axis + 3 : out_axis;
    if (a == 0) {
      shape = {3, 2, 4};
      for (auto& sl : slices) out.insert(out.end(), sl.begin(), sl.end());
    } else if (a == 1) {
      shape = {2, 3, 4};
      for (int64_t b = 0; b < 2; ++b)
        for (auto& sl : slices) out.insert(out.end(), sl.begin() + b * 4, sl.begin() + b * 4 + 4);
    } else {
      shape = {2, 4, 3};
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t j = 0; j < 4; ++j)
          for (auto& sl : slices) out.push_back(sl[static_cast<size_t>(b * 4 + j)]);
    }
    return std::make_pair(out, s);
  };
  for (int64_t in_dir : {0, 1})
    for (int64_t out_axis : {0, 1, -1})
      for (int64_t out_dir : {0, 1}) {
        INFO("in_dir " << in_dir << " out_axis " << out_axis << " out_dir " << out_dir);
        auto out = run(in_dir, out_axis, out_dir);
        Shape shape;
        auto [want, final_state] = reference(in_dir, out_axis, out_dir, shape);
        CHECK(floats(out[0]) == final_state);
        CHECK(out[1].shape() == shape);
        CHECK(floats(out[1]) == want);
      }
}

TEST_CASE("Scan-8 with a batch axis and sequence_lens", "[control_flow]") {
  ir::Model m;
  m.set_opset("", 8);
  ir::Graph* g = m.graph.get();
  ir::Value* lens = input(g, "lens");
  ir::Value* s0 = input(g, "s0");
  ir::Value* xv = input(g, "x");
  input(g, "zero");
  ir::Value* sf = g->add_value("sf");
  ir::Value* ys = g->add_value("ys");
  ir::Node* n = g->add_node("Scan", {lens, s0, xv}, {sf, ys}, "scan");
  n->set_attr(ir::Attribute::make_graph("body", running_sum_body(g)));
  n->set_attr(ir::Attribute::make_int("num_scan_inputs", 1));
  n->set_attr(ir::Attribute::make_ints("directions", {1}));
  g->add_output(sf);
  g->add_output(ys);
  rt::Executor exec(m);
  // Batch 2, sequence 3, element [1]: batch 0 uses all 3 steps reversed, batch 1 only 2.
  Tensor x = Tensor::from<float>({2, 3, 1}, {1, 2, 3, 10, 20, 30});
  auto out = exec.run({{"lens", Tensor::from<int32_t>({2}, {3, 2})},
                       {"s0", Tensor::from<float>({2, 1}, {0, 100})},
                       {"x", x},
                       {"zero", Tensor::scalar<float>(0.0f)}});
  CHECK(floats(out[0]) == std::vector<float>{6, 130});
  REQUIRE(out[1].shape() == Shape{2, 3, 1});
  CHECK(floats(out[1]) == std::vector<float>{3, 5, 6, 120, 130, 0});
}
