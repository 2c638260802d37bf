// Concat written in place by its producers (runtime/concat_in_place.h): repeated runs join without
// copying where the slices are contiguous and aligned, give the bits of the copying Concat in every
// case, and fall back to the copy where a shape changes, a producer hands over another tensor, the
// slices would be strided or unaligned, or the value is a graph output.
#include <catch2/catch.hpp>

#include <cstring>

#include "ir/onnx_io.h"
#include "passes/inference_fusion.h"
#include "runtime/concat_in_place.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

ir::ValueType image(int64_t c, const char* h = "H") {
  return ir::ValueType::tensor(DType::Float32, {ir::Dim::symbol("N"), ir::Dim::fixed(c), ir::Dim::symbol(h), ir::Dim::symbol("W")});
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_same_bits(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) CHECK(same_bits(got[k], want[k]));
}

// A 3x3 convolution (pads 1) of `in` with cout channels named `name`, weights from `seed`.
ir::Value* add_conv(ir::Graph& g, ir::Value* in, int64_t cin, int64_t cout, const std::string& name, uint32_t seed) {
  ir::Value* out = g.add_value(name, image(cout));
  g.add_node("Conv", {in, g.add_initializer(name + "_w", test::random_tensor({cout, cin, 3, 3}, seed)),
                      g.add_initializer(name + "_b", test::random_tensor({cout}, seed + 1))},
             {out}, name + "_conv")
      ->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
  return out;
}

// x[N, 4, H, W] -> Conv(8) = a -> Relu = r; a -> Conv(8) = b; Concat(r, b, axis) -> Conv(3) -> y
// (axis 0: -> Relu -> y). After the Concat, an Add reads a and r (a slice); its sum is a second
// output. `identity` puts an Identity after r, a producer that hands over its input instead of
// allocating; `concat_is_output` makes the Concat's output a graph output too.
struct UnetLike {
  ir::Model m;
  explicit UnetLike(int64_t axis = 1, bool identity = false, bool concat_is_output = false) {
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    ir::Value* x = g.add_value("x", image(4));
    g.add_input(x);
    ir::Value* a = add_conv(g, x, 4, 8, "a", 1);
    ir::Value* r = g.add_value("r", image(8));
    g.add_node("Relu", {a}, {r}, "relu");
    if (identity) {
      ir::Value* id = g.add_value("id", image(8));
      g.add_node("Identity", {r}, {id}, "identity");
      r = id;
    }
    ir::Value* b = add_conv(g, a, 8, 8, "b", 3);
    ir::Value* cat = g.add_value("cat");
    g.add_node("Concat", {r, b}, {cat}, "concat")->set_attr(ir::Attribute::make_int("axis", axis));
    ir::Value* y = nullptr;
    if (axis == 1) {
      y = add_conv(g, cat, 16, 3, "y", 5);
    } else {
      y = g.add_value("y");
      g.add_node("Relu", {cat}, {y}, "relu_y");
    }
    g.add_output(y);
    // a + r after the Concat: r, a slice, is read again once the Concat has run.
    ir::Value* sum = g.add_value("sum");
    g.add_node("Add", {a, r}, {sum}, "add");
    g.add_output(sum);
    if (concat_is_output) g.add_output(cat);
  }
};

std::vector<Tensor> run(const ir::Model& m, const Tensor& x, bool in_place, int runs, int threads = 1) {
  rt::ExecOptions o;
  o.threads = threads;
  o.concat_in_place = in_place;
  o.split_rows = false;
  rt::Executor exec(m, o);
  std::vector<Tensor> out;
  for (int i = 0; i < runs; ++i) out = exec.run({{"x", x}});
  return out;
}

// Three runs of m on x with the in-place Concat on: how many joins they made, each output checked
// bit for bit against the copying Concat's.
int64_t joins_in_three_runs(const ir::Model& m, const Tensor& x, int threads = 1) {
  const int64_t before = rt::InPlaceConcats::joined_count();
  const std::vector<Tensor> got = run(m, x, true, 3, threads);
  const int64_t joins = rt::InPlaceConcats::joined_count() - before;
  const std::vector<Tensor> want = run(m, x, false, 1);
  check_same_bits(got, want);
  return joins;
}

}  // namespace

TEST_CASE("Concat along channels of one image joins in place and gives the copy's bits", "[concat_in_place]") {
  UnetLike u;
  // 8 channels of 8 x 8 floats: slices of 2 KiB, aligned.
  const Tensor x = test::random_tensor({1, 4, 8, 8}, 11);
  const std::vector<Tensor> want = run(u.m, x, false, 1);
  rt::ExecOptions o;
  o.threads = 2;
  rt::Executor exec(u.m, o);
  for (int i = 0; i < 4; ++i) {
    INFO("run " << i);
    const int64_t before = rt::InPlaceConcats::joined_count();
    const std::vector<Tensor> got = exec.run({{"x", x}});
    // The first run arms the Concat with its shapes; every later one joins.
    CHECK(rt::InPlaceConcats::joined_count() - before == (i == 0 ? 0 : 1));
    check_same_bits(got, want);
  }
  SECTION("fused for inference as mpq run runs it") {
    UnetLike fused_u;
    ir::Model& fused = fused_u.m;
    passes::fuse_for_inference(fused, rt::BackendKind::CPU);
    rt::Executor e2(fused, o);
    for (int i = 0; i < 3; ++i)
      for (const Tensor& t : e2.run({{"x", x}})) CHECK(t.defined());
    const int64_t before = rt::InPlaceConcats::joined_count();
    const std::vector<Tensor> got = e2.run({{"x", x}});
    CHECK(rt::InPlaceConcats::joined_count() - before == 1);
    check_same_bits(got, want);
  }
}

TEST_CASE("Concat in place falls back to the copy where it cannot join", "[concat_in_place]") {
  SECTION("a new shape: the views no longer fit, the next run joins again") {
    UnetLike u;
    rt::ExecOptions o;
    o.threads = 1;
    rt::Executor exec(u.m, o);
    const Tensor small = test::random_tensor({1, 4, 8, 8}, 21), large = test::random_tensor({1, 4, 16, 8}, 22);
    exec.run({{"x", small}});
    for (const Tensor* x : {&large, &small, &small, &large, &large}) {
      const std::vector<Tensor> got = exec.run({{"x", *x}});
      const std::vector<Tensor> want = run(u.m, *x, false, 1);
      check_same_bits(got, want);
    }
  }
  SECTION("a producer that hands over its input (Identity)") {
    CHECK(joins_in_three_runs(UnetLike(1, true).m, test::random_tensor({1, 4, 8, 8}, 23)) == 0);
  }
  SECTION("a batch of two along channels: strided slices") {
    CHECK(joins_in_three_runs(UnetLike().m, test::random_tensor({2, 4, 8, 8}, 24), 2) == 0);
  }
  SECTION("slices off a cache line: 8 channels of 3 x 5 floats") {
    CHECK(joins_in_three_runs(UnetLike().m, test::random_tensor({1, 4, 3, 5}, 25)) == 0);
  }
  SECTION("the Concat's output is a graph output (it still joins)") {
    CHECK(joins_in_three_runs(UnetLike(1, false, true).m, test::random_tensor({1, 4, 8, 8}, 26)) == 2);
  }
}

TEST_CASE("Concat along the batch axis joins in place for any batch", "[concat_in_place]") {
  CHECK(joins_in_three_runs(UnetLike(0).m, test::random_tensor({3, 4, 8, 8}, 31), 2) == 2);
}

TEST_CASE("Results kept from an earlier run are not overwritten by the next", "[concat_in_place]") {
  UnetLike u;
  rt::ExecOptions o;
  o.threads = 1;
  rt::Executor exec(u.m, o);
  const Tensor x1 = test::random_tensor({1, 4, 8, 8}, 41), x2 = test::random_tensor({1, 4, 8, 8}, 42);
  exec.run({{"x", x1}});
  const std::vector<Tensor> first = exec.run({{"x", x1}});
  const std::vector<Tensor> copy{first[0].clone(), first[1].clone()};
  exec.run({{"x", x2}});
  check_same_bits(first, copy);
}

TEST_CASE("Nested Concats, slices that are graph outputs, and a Concat taken in place as Z", "[concat_in_place]") {
  auto build = [](const char* kind) {
    ir::Model m;
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    ir::Value* x = g.add_value("x", image(4));
    g.add_input(x);
    ir::Value* a = add_conv(g, x, 4, 8, "a", 60);
    ir::Value* b = add_conv(g, x, 4, 8, "b", 62);
    ir::Value* cat = g.add_value("cat");
    g.add_node("Concat", {a, b}, {cat}, "concat")->set_attr(ir::Attribute::make_int("axis", 1));
    const std::string k = kind;
    if (k == "nested") {
      // cat -> Concat(cat, d): the inner one joins; the outer one sees the inner's own buffer.
      ir::Value* d = add_conv(g, x, 4, 16, "d", 64);
      ir::Value* outer = g.add_value("outer");
      g.add_node("Concat", {cat, d}, {outer}, "outer_concat")->set_attr(ir::Attribute::make_int("axis", 1));
      ir::Value* y = g.add_value("y");
      g.add_node("Relu", {outer}, {y}, "relu");
      g.add_output(y);
    } else if (k == "output") {
      // a is a graph output: never a slice (the caller gets it whole).
      g.add_output(a);
      ir::Value* y = g.add_value("y");
      g.add_node("Relu", {cat}, {y}, "relu");
      g.add_output(y);
    } else {
      // y = Conv(x) + cat: fused into one convolution whose Z is the Concat's output, which dies
      // there, so the sum may be written over it in place.
      ir::Value* c = add_conv(g, x, 4, 16, "c", 64);
      ir::Value* y = g.add_value("y");
      g.add_node("Add", {c, cat}, {y}, "add");
      g.add_output(y);
    }
    return m;
  };
  for (const char* kind : {"nested", "output", "z"}) {
    INFO(kind);
    ir::Model m = build(kind);
    passes::fuse_for_inference(m, rt::BackendKind::CPU);
    const Tensor x = test::random_tensor({1, 4, 8, 8}, 71);
    const std::vector<Tensor> want = run(m, x, false, 1);
    rt::ExecOptions o;
    o.threads = 2;
    rt::Executor exec(m, o);
    std::vector<int64_t> joins;
    for (int i = 0; i < 4; ++i) {
      const int64_t before = rt::InPlaceConcats::joined_count();
      const std::vector<Tensor> got = exec.run({{"x", x}});
      joins.push_back(rt::InPlaceConcats::joined_count() - before);
      check_same_bits(got, want);
    }
    const std::string k = kind;
    // nested: the inner Concat joins from the second run on, the outer never; output: a is no
    // slice, so the Concat never joins; z: joins from the second run on.
    CHECK(joins == std::vector<int64_t>(k == "output" ? std::vector<int64_t>{0, 0, 0, 0} : std::vector<int64_t>{0, 1, 1, 1}));
  }
}
