// Values computed from shapes kept between runs (runtime/shape_value_cache.h): a reshape target
// built from Shape, Gather, Unsqueeze and Concat is computed once per input shape, recomputed
// where a shape changes (and only as far as the change reaches), never kept where it is a graph
// output or too large, never handed to the caller (through a view, or as an extra value) where
// the caller's writes could reach a later run, never taken from a feed's buffer, and every run
// gives the outputs of an executor that keeps nothing.
#include <catch2/catch.hpp>

#include <cstring>

#include "runtime/executor.h"
#include "runtime/shape_value_cache.h"
#include "test_util.h"

using namespace mpq;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// x[N, T, 6] -> Reshape(x, Concat(Unsqueeze(Shape(x)[0]), Unsqueeze(Shape(x)[1]), [2], [3]))
// -> Transpose(0, 2, 1, 3) -> y, the split into two heads of an exported attention block.
// `shape_is_output`: Shape(x) is a graph output too. `fill`: a second output
// ReduceSum(ConstantOfShape([T * fill])), a value computed from shapes that is large for fill 20.
struct HeadSplit {
  ir::Model m;
  explicit HeadSplit(bool shape_is_output = false, int64_t fill = 0) {
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    auto i64 = [&](const std::string& name, std::vector<int64_t> v, Shape shape) {
      return g.add_initializer(name, Tensor::from<int64_t>(std::move(shape), v));
    };
    ir::Value* x = g.add_value(
        "x", ir::ValueType::tensor(DType::Float32, {ir::Dim::symbol("N"), ir::Dim::symbol("T"), ir::Dim::fixed(6)}));
    g.add_input(x);
    ir::Value* s = g.add_value("s");
    g.add_node("Shape", {x}, {s}, "shape");
    ir::Value* n = g.add_value("n");
    ir::Value* t = g.add_value("t");
    g.add_node("Gather", {s, i64("zero", {0}, {})}, {n}, "gather_n");
    g.add_node("Gather", {s, i64("one", {1}, {})}, {t}, "gather_t");
    ir::Value* axes = i64("axes", {0}, {1});
    ir::Value* nu = g.add_value("nu");
    ir::Value* tu = g.add_value("tu");
    g.add_node("Unsqueeze", {n, axes}, {nu}, "unsqueeze_n");
    g.add_node("Unsqueeze", {t, axes}, {tu}, "unsqueeze_t");
    ir::Value* target = g.add_value("target");
    g.add_node("Concat", {nu, tu, i64("heads", {2}, {1}), i64("dims", {3}, {1})}, {target}, "concat")
        ->set_attr(ir::Attribute::make_int("axis", 0));
    ir::Value* r = g.add_value("r");
    g.add_node("Reshape", {x, target}, {r}, "reshape");
    ir::Value* y = g.add_value("y");
    g.add_node("Transpose", {r}, {y}, "transpose")->set_attr(ir::Attribute::make_ints("perm", {0, 2, 1, 3}));
    g.add_output(y);
    if (shape_is_output) g.add_output(s);
    if (fill > 0) {
      ir::Value* count = g.add_value("count");
      g.add_node("Mul", {tu, i64("fill", {fill}, {1})}, {count}, "mul");
      ir::Value* ones = g.add_value("ones");
      g.add_node("ConstantOfShape", {count}, {ones}, "constant_of_shape")
          ->set_attr(ir::Attribute::make_tensor("value", Tensor::from<float>({1}, {1.0f})));
      ir::Value* total = g.add_value("total");
      g.add_node("ReduceSum", {ones}, {total}, "reduce_sum")->set_attr(ir::Attribute::make_int("keepdims", 0));
      g.add_output(total);
    }
  }
};

rt::ExecOptions options(bool keep) {
  rt::ExecOptions o;
  o.threads = 1;
  o.shape_value_cache = keep;
  return o;
}

// Runs `exec` on x and checks every output against an executor that keeps nothing; returns how
// many steps reused kept outputs.
int64_t reused_in_run(rt::Executor& exec, const ir::Model& m, const Tensor& x) {
  const int64_t before = rt::ShapeValueCache::reused_count();
  const std::vector<Tensor> got = exec.run({{"x", x}});
  const int64_t reused = rt::ShapeValueCache::reused_count() - before;
  rt::Executor plain(m, options(false));
  const std::vector<Tensor> want = plain.run({{"x", x}});
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("output " << k);
    CHECK(same_bits(got[k], want[k]));
  }
  return reused;
}

}  // namespace

TEST_CASE("a reshape target computed from shapes is kept per input shape", "[shape_value_cache]") {
  HeadSplit h;
  rt::Executor exec(h.m, options(true));
  const Tensor a = test::random_tensor({2, 5, 6}, 1);
  const Tensor b = test::random_tensor({3, 5, 6}, 2);
  const Tensor c = test::random_tensor({3, 7, 6}, 3);
  // Shape, two Gathers, two Unsqueezes and the Concat: computed on the first run, then reused.
  CHECK(reused_in_run(exec, h.m, a) == 0);
  CHECK(reused_in_run(exec, h.m, a) == 6);
  CHECK(reused_in_run(exec, h.m, a) == 6);
  // A new batch: Shape and everything after it recompute, except the token count's Unsqueeze,
  // whose input (5) has the value it had although another step computed it.
  CHECK(reused_in_run(exec, h.m, b) == 1);
  CHECK(reused_in_run(exec, h.m, b) == 6);
  // A new token count: the batch's Unsqueeze is the one reused.
  CHECK(reused_in_run(exec, h.m, c) == 1);
  // Back to the first shape: both sizes differ from the last run's.
  CHECK(reused_in_run(exec, h.m, a) == 0);
  CHECK(reused_in_run(exec, h.m, a) == 6);
}

TEST_CASE("kept shape values are off with the option", "[shape_value_cache]") {
  HeadSplit h;
  rt::Executor exec(h.m, options(false));
  const Tensor a = test::random_tensor({2, 5, 6}, 1);
  for (int i = 0; i < 3; ++i) CHECK(reused_in_run(exec, h.m, a) == 0);
}

TEST_CASE("a shape value that is a graph output is never kept", "[shape_value_cache]") {
  HeadSplit h(/*shape_is_output=*/true);
  rt::Executor exec(h.m, options(true));
  const Tensor a = test::random_tensor({2, 5, 6}, 1);
  std::vector<Tensor> out = exec.run({{"x", a}});
  REQUIRE(out.size() == 2);
  // The caller owns what it was given and may write into it: the next run must not see that.
  out[1].data<int64_t>()[0] = 99;
  // Only Shape's output is a graph output; the Gathers read it, so nothing after it is kept either.
  for (int i = 0; i < 2; ++i) CHECK(reused_in_run(exec, h.m, a) == 0);
  out = exec.run({{"x", a}});
  CHECK(out[1].data<int64_t>()[0] == 2);
}

TEST_CASE("a large value computed from shapes is not kept", "[shape_value_cache]") {
  // T * 20 = 100 ones: past ShapeValueCache::kMaxValues, so ConstantOfShape recomputes on every
  // run (ReduceSum's output is a graph output, never kept); the six head-split steps and the Mul
  // are kept.
  HeadSplit h(false, 20);
  rt::Executor exec(h.m, options(true));
  const Tensor a = test::random_tensor({2, 5, 6}, 1);
  CHECK(reused_in_run(exec, h.m, a) == 0);
  CHECK(reused_in_run(exec, h.m, a) == 7);
  CHECK(reused_in_run(exec, h.m, a) == 7);
  // Two tokens: 40 ones, small now, but a step dropped once stays dropped.
  const Tensor b = test::random_tensor({2, 2, 6}, 2);
  CHECK(reused_in_run(exec, h.m, b) == 1);
  CHECK(reused_in_run(exec, h.m, b) == 7);
  HeadSplit small(false, 3);
  rt::Executor exec_small(small.m, options(true));
  CHECK(reused_in_run(exec_small, small.m, a) == 0);
  // 15 ones: ConstantOfShape is kept too (ReduceSum's output is a graph output, never kept).
  CHECK(reused_in_run(exec_small, small.m, a) == 8);
}

namespace {

// x[N, 4] -> Reshape(x, target = Concat(Shape(x), [1])) -> y; with `target_out`, Identity(target)
// is a graph output too: a view of a kept value, which the caller may write into.
struct TargetGraph {
  ir::Model m;
  explicit TargetGraph(bool target_out) {
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, {ir::Dim::symbol("N"), ir::Dim::fixed(4)}));
    g.add_input(x);
    ir::Value* s = g.add_value("s");
    g.add_node("Shape", {x}, {s}, "shape");
    ir::Value* target = g.add_value("target");
    g.add_node("Concat", {s, g.add_initializer("one", Tensor::from<int64_t>({1}, {1}))}, {target}, "concat")
        ->set_attr(ir::Attribute::make_int("axis", 0));
    ir::Value* y = g.add_value("y");
    g.add_node("Reshape", {x, target}, {y}, "reshape");
    g.add_output(y);
    if (target_out) {
      ir::Value* t = g.add_value("t");
      g.add_node("Identity", {target}, {t}, "identity");
      g.add_output(t);
    }
  }
};

}  // namespace

TEST_CASE("what the caller writes into its results never reaches a later run", "[shape_value_cache]") {
  const Tensor a = test::random_tensor({2, 4}, 1);
  SECTION("a graph output that is a view of a kept value") {
    TargetGraph t(true);
    rt::Executor exec(t.m, options(true));
    exec.run({{"x", a}});
    std::vector<Tensor> out = exec.run({{"x", a}});  // the target is reused here
    REQUIRE(out.size() == 2);
    REQUIRE(out[1].numel() == 3);
    out[1].data<int64_t>()[0] = 8;
    out[1].data<int64_t>()[1] = 1;
    const std::vector<Tensor> again = exec.run({{"x", a}});
    CHECK(again[0].shape() == Shape{2, 4, 1});
    CHECK(again[1].data<int64_t>()[0] == 2);
  }
  SECTION("a kept value asked for as an extra value") {
    TargetGraph t(false);
    rt::Executor exec(t.m, options(true));
    exec.run({{"x", a}});
    std::vector<Tensor> extra;
    exec.run({{"x", a}}, {"target"}, &extra);
    REQUIRE(extra.size() == 1);
    extra[0].data<int64_t>()[0] = 8;
    extra[0].data<int64_t>()[1] = 1;
    CHECK(exec.run({{"x", a}})[0].shape() == Shape{2, 4, 1});
    CHECK(reused_in_run(exec, t.m, a) == 2);
  }
}

TEST_CASE("a kept value is never a view of a feed the caller writes into", "[shape_value_cache]") {
  // d: an input with a default (a small constant the caller may feed). w = Reshape(d, Shape(x)) is
  // a view of the feed; Add(w, w) and its Cast are kept steps reading it.
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, {ir::Dim::symbol("N"), ir::Dim::fixed(4)}));
  g.add_input(x);
  ir::Value* d = g.add_initializer("d", Tensor::from<int64_t>({4}, {1, 2, 3, 4}));
  g.add_input(d);
  ir::Value* s = g.add_value("s");
  g.add_node("Shape", {x}, {s}, "shape");
  ir::Value* w = g.add_value("w");
  g.add_node("Reshape", {d, s}, {w}, "reshape");
  ir::Value* twice = g.add_value("twice");
  g.add_node("Add", {w, w}, {twice}, "add");
  ir::Value* z = g.add_value("z");
  g.add_node("Cast", {twice}, {z}, "cast")->set_attr(ir::Attribute::make_int("to", 1));
  ir::Value* out = g.add_value("out");
  g.add_node("Add", {x, z}, {out}, "add_x");
  g.add_output(out);
  rt::Executor exec(m, options(true));
  rt::Executor plain(m, options(false));
  const Tensor a = Tensor::zeros(DType::Float32, {1, 4});
  Tensor feed = Tensor::from<int64_t>({4}, {1, 2, 3, 4});
  CHECK(exec.run({{"x", a}, {"d", feed}})[0].data<float>()[0] == 2.0f);
  CHECK(exec.run({{"x", a}, {"d", feed}})[0].data<float>()[0] == 2.0f);
  // The caller writes new values into the buffer it feeds.
  for (int i = 0; i < 4; ++i) feed.data<int64_t>()[i] = 10 * (i + 1);
  const std::vector<Tensor> got = exec.run({{"x", a}, {"d", feed}});
  const std::vector<Tensor> want = plain.run({{"x", a}, {"d", feed}});
  CHECK(want[0].data<float>()[0] == 20.0f);
  CHECK(same_bits(got[0], want[0]));
}
