// Shape and data-movement kernels (shape_ops.cpp, shape_slice_pad.cpp) against naive references on
// odd shapes with fixed seeds: Transpose (tiled and SIMD paths, every permutation), Concat, Split,
// Slice, Expand, Tile, Pad, DepthToSpace/SpaceToDepth, plus the zero-copy view ops, Shape/Size,
// Dropout, element types other than float32 and malformed nodes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "runtime/cpu/shape_internal.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

using Attrs = std::vector<ir::Attribute>;

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             size_t n_outputs = 1, int opset = 17, int threads = 2) {
  return test::run_node(op, inputs, attrs, n_outputs, opset, threads);
}

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs = {}, int opset = 17) {
  return run_node(op, inputs, attrs, 1, opset).at(0);
}

Tensor ints(std::vector<int64_t> v) { return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v); }

// Distinct values 0..n-1 as float (exact comparisons).
Tensor iota_f(const Shape& s) {
  Tensor t(DType::Float32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

Tensor random_int8(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor t(DType::Int8, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(rng() & 0xff);
  return t;
}

bool bytes_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.dtype() == DType::String) return a.strings() == b.strings();
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Multi-index helpers for the naive references.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t o = 0;
  for (size_t d = 0; d < s.size(); ++d) o = o * s[d] + idx[d];
  return o;
}

// Naive transpose of any fixed-width type, byte by byte.
Tensor transpose_ref(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape out_shape;
  for (int64_t p : perm) out_shape.push_back(x.shape()[static_cast<size_t>(p)]);
  Tensor out(x.dtype(), out_shape);
  const size_t w = static_cast<size_t>(dtype_bits(x.dtype()) / 8);
  for (int64_t i = 0; i < out.numel(); ++i) {
    auto oi = unravel(i, out_shape);
    std::vector<int64_t> ii(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) ii[static_cast<size_t>(perm[d])] = oi[d];
    std::memcpy(static_cast<uint8_t*>(out.raw_data()) + static_cast<size_t>(i) * w,
                static_cast<const uint8_t*>(x.raw_data()) + static_cast<size_t>(ravel(ii, x.shape())) * w, w);
  }
  return out;
}

}  // namespace

TEST_CASE("Transpose matches the naive reference for every permutation", "[shape_ops]") {
  for (const Shape& s : {Shape{3, 5, 7}, Shape{2, 3, 5, 7}, Shape{1, 9, 1, 6}}) {
    std::vector<int64_t> perm(s.size());
    std::iota(perm.begin(), perm.end(), 0);
    uint32_t seed = 1;
    do {
      Tensor x = test::random_tensor(s, seed++);
      Tensor y = run1("Transpose", {x}, {ir::Attribute::make_ints("perm", perm)});
      INFO("shape " << shape_str(s) << " perm " << shape_str(perm));
      CHECK(bytes_equal(y, transpose_ref(x, perm)));
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST_CASE("Transpose keeps its plan while the input shape stays and makes a new one when it changes", "[shape_ops]") {
  // One executor (one kernel object; its input of unknown rank) over runs whose input shape stays,
  // changes and returns; a copy path, a tiled path and identity; a rank the perm does not fit right
  // after a planned shape, then that shape again.
  for (const std::vector<int64_t>& perm : {std::vector<int64_t>{2, 0, 3, 1}, std::vector<int64_t>{0, 1, 3, 2},
                                           std::vector<int64_t>{0, 1, 2, 3}}) {
    ir::Model m;
    m.set_opset("", 17);
    ir::Graph* g = m.graph.get();
    ir::Value* x = g->add_value("x", ir::ValueType::tensor_unranked(DType::Float32));
    g->add_input(x);
    ir::Value* y = g->add_value("y");
    g->add_output(y);
    g->add_node("Transpose", {x}, {y}, "node_under_test")->set_attr(ir::Attribute::make_ints("perm", perm));
    rt::ExecOptions opt;
    opt.threads = 2;
    rt::Executor ex(m, opt);
    uint32_t seed = 60;
    for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{2, 3, 5, 7}, Shape{4, 1, 9, 16}, Shape{2, 3, 5, 7}, Shape{3, 2, 33, 65}}) {
      const Tensor in = test::random_tensor(s, seed++);
      const Tensor out = ex.run({{"x", in}}).at(0);
      INFO("perm " << shape_str(perm) << ", shape " << shape_str(s));
      CHECK(bytes_equal(out, transpose_ref(in, perm)));
    }
    // A rank the perm does not fit: an error naming the node, then the executor still works.
    const Tensor before = test::random_tensor({2, 3, 5, 7}, 3);
    CHECK(bytes_equal(ex.run({{"x", before}}).at(0), transpose_ref(before, perm)));
    CHECK_THROWS_WITH(ex.run({{"x", test::random_tensor({2, 3, 5}, 1)}}), Catch::Contains("node_under_test"));
    const Tensor again = test::random_tensor({2, 3, 5, 7}, 2);
    CHECK(bytes_equal(ex.run({{"x", again}}).at(0), transpose_ref(again, perm)));
  }
}

TEST_CASE("Transpose large planes (tiled and 4x4 register paths) and other widths", "[shape_ops]") {
  // Sizes that are not multiples of the tile or the 4x4 block.
  Tensor x = test::random_tensor({3, 131, 67}, 7);
  CHECK(bytes_equal(run1("Transpose", {x}, {ir::Attribute::make_ints("perm", {0, 2, 1})}), transpose_ref(x, {0, 2, 1})));
  Tensor big = test::random_tensor({257, 515}, 8);
  CHECK(bytes_equal(run1("Transpose", {big}), transpose_ref(big, {1, 0})));
  // NCHW -> NHWC and back, the layout change CNN exporters emit.
  Tensor nchw = test::random_tensor({2, 19, 13, 11}, 9);
  CHECK(bytes_equal(run1("Transpose", {nchw}, {ir::Attribute::make_ints("perm", {0, 2, 3, 1})}), transpose_ref(nchw, {0, 2, 3, 1})));
  Tensor i8 = random_int8({5, 37, 41}, 10);
  CHECK(bytes_equal(run1("Transpose", {i8}, {ir::Attribute::make_ints("perm", {2, 0, 1})}), transpose_ref(i8, {2, 0, 1})));
  Tensor i64 = Tensor(DType::Int64, {7, 9, 5});
  for (int64_t i = 0; i < i64.numel(); ++i) i64.data<int64_t>()[i] = i * 1000003;
  CHECK(bytes_equal(run1("Transpose", {i64}, {ir::Attribute::make_ints("perm", {1, 2, 0})}), transpose_ref(i64, {1, 2, 0})));
  // float16 bits (a NaN payload included) move untouched.
  Tensor h(DType::Float16, {3, 5});
  for (int64_t i = 0; i < h.numel(); ++i) h.data<Float16>()[i].bits = static_cast<uint16_t>(0x7c01 + i * 37);
  Tensor ht = run1("Transpose", {h});
  REQUIRE(ht.dtype() == DType::Float16);
  CHECK(bytes_equal(ht, transpose_ref(h, {1, 0})));
}

TEST_CASE("for_runs visits every run's offset from any starting run", "[shape_ops]") {
  // The offsets of runs [lo, hi) against a naive enumeration, over ranges that start and end
  // inside the last dimension and cross several wraps (the parallel loops' chunks), negative and
  // zero strides, one dimension and none.
  std::mt19937 rng(41);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> layouts = {
      {{3, 8, 4, 17}, {64, 3264, 16, 192}}, {{5, 2, 7}, {-3, 100, 1}}, {{6, 4}, {0, 9}}, {{13}, {5}}, {{}, {}}};
  for (const auto& [dims, strides] : layouts) {
    rt::cpu::StridedRuns r;
    r.dims = dims;
    r.strides = strides;
    r.outer = 1;
    for (int64_t d : dims) r.outer *= d;
    std::vector<int64_t> want(static_cast<size_t>(r.outer));
    for (int64_t run = 0; run < r.outer; ++run) {
      int64_t o = run, off = 0;
      for (size_t d = dims.size(); d-- > 0;) {
        off += (o % dims[d]) * strides[d];
        o /= dims[d];
      }
      want[static_cast<size_t>(run)] = off;
    }
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t lo = static_cast<int64_t>(rng() % static_cast<uint32_t>(r.outer + 1));
      const int64_t hi = lo + static_cast<int64_t>(rng() % static_cast<uint32_t>(r.outer - lo + 1));
      std::vector<int64_t> runs, offs;
      rt::cpu::for_runs(r, lo, hi, [&](int64_t run, int64_t off) {
        runs.push_back(run);
        offs.push_back(off);
      });
      INFO("dims " << shape_str(dims) << ", runs [" << lo << ", " << hi << ")");
      REQUIRE(static_cast<int64_t>(runs.size()) == hi - lo);
      for (int64_t k = 0; k < hi - lo; ++k) {
        CHECK(runs[static_cast<size_t>(k)] == lo + k);
        CHECK(offs[static_cast<size_t>(k)] == want[static_cast<size_t>(lo + k)]);
      }
    }
  }
}

TEST_CASE("Transpose rejects a perm that is not a permutation", "[shape_ops]") {
  Tensor x = test::random_tensor({2, 3, 4}, 1);
  CHECK_THROWS_AS(run1("Transpose", {x}, {ir::Attribute::make_ints("perm", {0, 0, 1})}), Error);
  CHECK_THROWS_WITH(run1("Transpose", {x}, {ir::Attribute::make_ints("perm", {0, 1})}),
                    Catch::Contains("node_under_test"));
}

TEST_CASE("Reshape copies 0 dims, infers -1, honours allowzero and shares the buffer", "[shape_ops]") {
  Tensor x = test::random_tensor({2, 3, 4}, 3);
  Tensor y = run1("Reshape", {x, ints({0, -1})});
  CHECK(y.shape() == Shape{2, 12});
  CHECK(y.same_buffer(x));
  CHECK(run1("Reshape", {x, ints({4, 0, 2})}).shape() == Shape{4, 3, 2});
  CHECK(run1("Reshape", {x, ints({-1})}).shape() == Shape{24});
  // allowzero=1: a 0 is a real zero-size dimension.
  Tensor empty(DType::Float32, {0, 3});
  Tensor z = run1("Reshape", {empty, ints({3, 0})}, {ir::Attribute::make_int("allowzero", 1)}, 14);
  CHECK(z.shape() == Shape{3, 0});
  // Without allowzero the 0 copies the input's dimension 0 (= 0 here).
  CHECK(run1("Reshape", {empty, ints({0, 3})}).shape() == Shape{0, 3});
  // Opset 1-4 take the shape from an attribute.
  CHECK(run1("Reshape", {x}, {ir::Attribute::make_ints("shape", {6, 4})}, 4).shape() == Shape{6, 4});
}

TEST_CASE("Reshape to an incompatible shape is an error naming the node", "[shape_ops]") {
  Tensor x = test::random_tensor({2, 3, 4}, 3);
  CHECK_THROWS_WITH(run1("Reshape", {x, ints({5, -1})}), Catch::Contains("node_under_test") && Catch::Contains("reshape"));
  CHECK_THROWS_AS(run1("Reshape", {x, ints({7, 3})}), Error);
  CHECK_THROWS_AS(run1("Reshape", {x, ints({-1, -1})}), Error);
  CHECK_THROWS_AS(run1("Reshape", {x, ints({2, 3, 4, 0})}), Error);
}

TEST_CASE("Flatten, Squeeze, Unsqueeze and Identity are views", "[shape_ops]") {
  Tensor x = test::random_tensor({2, 1, 3, 1, 5}, 4);
  Tensor f = run1("Flatten", {x}, {ir::Attribute::make_int("axis", -2)});
  CHECK(f.shape() == Shape{6, 5});
  CHECK(f.same_buffer(x));
  CHECK(run1("Flatten", {x}, {ir::Attribute::make_int("axis", 0)}).shape() == Shape{1, 30});
  CHECK(run1("Flatten", {x}, {ir::Attribute::make_int("axis", 5)}).shape() == Shape{30, 1});
  CHECK_THROWS_AS(run1("Flatten", {x}, {ir::Attribute::make_int("axis", 6)}), Error);

  CHECK(run1("Squeeze", {x}).shape() == Shape{2, 3, 5});
  CHECK(run1("Squeeze", {x, ints({-2})}).shape() == Shape{2, 1, 3, 5});
  CHECK(run1("Squeeze", {x}, {ir::Attribute::make_ints("axes", {1})}, 11).shape() == Shape{2, 3, 1, 5});
  CHECK_THROWS_WITH(run1("Squeeze", {x, ints({0})}), Catch::Contains("node_under_test"));

  Tensor u = run1("Unsqueeze", {x, ints({0, -1})});
  CHECK(u.shape() == Shape{1, 2, 1, 3, 1, 5, 1});
  CHECK(u.same_buffer(x));
  CHECK(run1("Unsqueeze", {x}, {ir::Attribute::make_ints("axes", {6, 2})}, 11).shape() == Shape{2, 1, 1, 3, 1, 5, 1});
  CHECK_THROWS_AS(run1("Unsqueeze", {x, ints({1, 1})}), Error);
  CHECK_THROWS_AS(run1("Unsqueeze", {x, ints({8})}), Error);

  CHECK(run1("Identity", {x}).same_buffer(x));
}

TEST_CASE("Shape, Size and Dropout in inference", "[shape_ops]") {
  Tensor x = test::random_tensor({2, 3, 5, 7}, 5);
  CHECK(run1("Shape", {x}).to_int64_vector() == std::vector<int64_t>{2, 3, 5, 7});
  CHECK(run1("Shape", {x}, {ir::Attribute::make_int("start", 1), ir::Attribute::make_int("end", -1)}, 15).to_int64_vector() ==
        std::vector<int64_t>{3, 5});
  CHECK(run1("Shape", {x}, {ir::Attribute::make_int("start", -10), ir::Attribute::make_int("end", 10)}, 15).to_int64_vector() ==
        std::vector<int64_t>{2, 3, 5, 7});
  CHECK(run1("Shape", {x}, {ir::Attribute::make_int("start", 3), ir::Attribute::make_int("end", 1)}, 15).numel() == 0);
  Tensor sz = run1("Size", {x});
  CHECK(sz.rank() == 0);
  CHECK(sz.get_int64(0) == 210);

  auto outs = run_node("Dropout", {x, Tensor::scalar<float>(0.3f)}, {}, 2, 13);
  CHECK(bytes_equal(outs[0], x));
  REQUIRE(outs[1].dtype() == DType::Bool);
  bool all = true;
  for (int64_t i = 0; i < outs[1].numel(); ++i) all = all && outs[1].data<bool>()[i];
  CHECK(all);
  // training_mode=true with ratio 0 is still the identity.
  Tensor train = Tensor::scalar<bool>(true);
  CHECK(bytes_equal(run_node("Dropout", {x, Tensor::scalar<float>(0.0f), train}, {}, 1, 13)[0], x));
  // training_mode=true with ratio 0.5: dropped values are 0, kept ones doubled.
  auto tr = run_node("Dropout", {x, Tensor::scalar<float>(0.5f), train}, {}, 2, 13);
  int64_t kept = 0;
  bool consistent = true;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool k = tr[1].data<bool>()[i];
    kept += k;
    const float want = k ? x.data<float>()[i] * 2.0f : 0.0f;
    consistent = consistent && std::fabs(tr[0].data<float>()[i] - want) < 1e-6f;
  }
  CHECK(consistent);
  CHECK(kept > 50);
  CHECK(kept < 160);
}

namespace {

Tensor concat_ref(const std::vector<Tensor>& ins, int axis) {
  Shape out = ins[0].shape();
  out[static_cast<size_t>(axis)] = 0;
  for (const Tensor& t : ins) out[static_cast<size_t>(axis)] += t.shape()[static_cast<size_t>(axis)];
  Tensor y(ins[0].dtype(), out);
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, out);
    int64_t a = idx[static_cast<size_t>(axis)];
    size_t k = 0;
    while (a >= ins[k].shape()[static_cast<size_t>(axis)]) a -= ins[k++].shape()[static_cast<size_t>(axis)];
    idx[static_cast<size_t>(axis)] = a;
    y.data<float>()[i] = ins[k].data<float>()[ravel(idx, ins[k].shape())];
  }
  return y;
}

}  // namespace

TEST_CASE("Concat matches the naive reference on every axis", "[shape_ops]") {
  for (int axis = -3; axis < 3; ++axis) {
    const int a = axis < 0 ? axis + 3 : axis;
    std::vector<Tensor> ins;
    for (int k = 0; k < 3; ++k) {
      Shape s{3, 5, 7};
      s[static_cast<size_t>(a)] = k + 1 + (k == 1 ? 4 : 0);
      ins.push_back(test::random_tensor(s, 20 + static_cast<uint32_t>(k)));
    }
    Tensor y = run1("Concat", ins, {ir::Attribute::make_int("axis", axis)});
    INFO("axis " << axis);
    CHECK(bytes_equal(y, concat_ref(ins, a)));
  }
  // An empty input contributes nothing.
  Tensor a = test::random_tensor({2, 3}, 30), e(DType::Float32, {2, 0}), b = test::random_tensor({2, 4}, 31);
  CHECK(bytes_equal(run1("Concat", {a, e, b}, {ir::Attribute::make_int("axis", 1)}), concat_ref({a, e, b}, 1)));
  // Strings.
  Tensor s1 = Tensor::from_strings({2}, {"a", "b"}), s2 = Tensor::from_strings({1}, {"c"});
  CHECK(run1("Concat", {s1, s2}, {ir::Attribute::make_int("axis", 0)}).strings() == std::vector<std::string>{"a", "b", "c"});
  // Mismatched shapes and types are errors.
  CHECK_THROWS_WITH(run1("Concat", {a, test::random_tensor({3, 3}, 1)}, {ir::Attribute::make_int("axis", 1)}),
                    Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run1("Concat", {a, ints({1, 2})}, {ir::Attribute::make_int("axis", 0)}), Error);
}

TEST_CASE("Split by sizes, evenly, by num_outputs and by attribute", "[shape_ops]") {
  Tensor x = iota_f({4, 7});
  auto parts = run_node("Split", {x, ints({2, 0, 5})}, {ir::Attribute::make_int("axis", 1)}, 3, 13);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{4, 2});
  CHECK(parts[1].shape() == Shape{4, 0});
  CHECK(parts[2].shape() == Shape{4, 5});
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 7; ++c) {
      float got = c < 2 ? parts[0].data<float>()[r * 2 + c] : parts[2].data<float>()[r * 5 + c - 2];
      CHECK(got == static_cast<float>(r * 7 + c));
    }
  auto even = run_node("Split", {x}, {}, 2, 13);
  CHECK(even[1].shape() == Shape{2, 7});
  CHECK(even[1].data<float>()[0] == 14.0f);
  // num_outputs (opset 18): the last part is smaller.
  auto uneven = run_node("Split", {x}, {ir::Attribute::make_int("axis", 1), ir::Attribute::make_int("num_outputs", 3)}, 3, 18);
  CHECK(uneven[0].shape() == Shape{4, 3});
  CHECK(uneven[2].shape() == Shape{4, 1});
  CHECK(uneven[2].data<float>()[3] == 27.0f);
  // Opset 11: sizes as an attribute.
  auto attr = run_node("Split", {x}, {ir::Attribute::make_ints("split", {1, 3})}, 2, 11);
  CHECK(attr[1].shape() == Shape{3, 7});
  CHECK(attr[1].data<float>()[0] == 7.0f);
  CHECK_THROWS_WITH(run_node("Split", {x, ints({2, 3})}, {}, 2, 13), Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run_node("Split", {x}, {ir::Attribute::make_int("axis", 1)}, 2, 13), Error);  // 7 is odd
}

namespace {

// Python-style slicing, one axis at a time, written directly from the ONNX definition.
Tensor slice_ref(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                 const std::vector<int64_t>& axes, const std::vector<int64_t>& steps) {
  const size_t r = x.shape().size();
  std::vector<std::vector<int64_t>> pick(r);
  for (size_t d = 0; d < r; ++d)
    for (int64_t i = 0; i < x.shape()[d]; ++i) pick[d].push_back(i);
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t d = static_cast<size_t>(axes[k] < 0 ? axes[k] + static_cast<int64_t>(r) : axes[k]);
    const int64_t n = x.shape()[d];
    int64_t s = starts[k] < 0 ? starts[k] + n : starts[k];
    int64_t e = ends[k] < 0 ? ends[k] + n : ends[k];
    const int64_t st = steps[k];
    pick[d].clear();
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, n);
      e = std::clamp<int64_t>(e, 0, n);
      for (int64_t i = s; i < e; i += st) pick[d].push_back(i);
    } else {
      s = std::clamp<int64_t>(s, 0, n - 1);
      e = std::clamp<int64_t>(e, -1, n - 1);
      for (int64_t i = s; i > e; i += st) pick[d].push_back(i);
    }
  }
  Shape out;
  for (auto& p : pick) out.push_back(static_cast<int64_t>(p.size()));
  Tensor y(x.dtype(), out);
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, out);
    for (size_t d = 0; d < r; ++d) idx[d] = pick[d][static_cast<size_t>(idx[d])];
    y.data<float>()[i] = x.data<float>()[ravel(idx, x.shape())];
  }
  return y;
}

}  // namespace

TEST_CASE("Slice matches python slicing: steps, negative steps, clamping, axes", "[shape_ops]") {
  Tensor x = test::random_tensor({5, 7, 9}, 40);
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  std::vector<Case> cases = {
      {{1, 2}, {4, -1}, {0, 2}, {1, 2}},
      {{-1}, {small}, {1}, {-1}},           // full reverse
      {{8, 1}, {0, big}, {-1, 0}, {-3, 2}},  // negative step, end clamped
      {{0, 0, 0}, {big, big, big}, {0, 1, 2}, {1, 1, 1}},
      {{10}, {20}, {2}, {1}},  // start past the end: empty
      {{-100}, {3}, {1}, {1}},
      {{4, 6}, {-100, -100}, {0, 1}, {-2, -4}},
  };
  for (const Case& c : cases) {
    Tensor y = run1("Slice", {x, ints(c.starts), ints(c.ends), ints(c.axes), ints(c.steps)});
    INFO("starts " << shape_str(c.starts) << " ends " << shape_str(c.ends) << " steps " << shape_str(c.steps));
    CHECK(bytes_equal(y, slice_ref(x, c.starts, c.ends, c.axes, c.steps)));
  }
  // Default axes and steps; opset 9 attributes.
  CHECK(bytes_equal(run1("Slice", {x, ints({1, 1}), ints({3, 6})}), slice_ref(x, {1, 1}, {3, 6}, {0, 1}, {1, 1})));
  CHECK(bytes_equal(run1("Slice", {x},
                         {ir::Attribute::make_ints("starts", {2}), ir::Attribute::make_ints("ends", {-1}),
                          ir::Attribute::make_ints("axes", {2})},
                         9),
                    slice_ref(x, {2}, {-1}, {2}, {1})));
  CHECK_THROWS_WITH(run1("Slice", {x, ints({0}), ints({2}), ints({0}), ints({0})}), Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run1("Slice", {x, ints({0}), ints({2}), ints({3})}), Error);
}

TEST_CASE("Expand and Tile match naive broadcasting / repetition", "[shape_ops]") {
  Tensor x = test::random_tensor({3, 1, 5}, 50);
  Tensor y = run1("Expand", {x, ints({2, 1, 4, 1})});
  REQUIRE(y.shape() == Shape{2, 3, 4, 5});
  bool ok = true;
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, y.shape());
    ok = ok && y.data<float>()[i] == x.data<float>()[idx[1] * 5 + idx[3]];
  }
  CHECK(ok);
  CHECK_THROWS_WITH(run1("Expand", {x, ints({2, 3})}), Catch::Contains("node_under_test"));

  Tensor t = random_int8({2, 3, 5}, 51);
  Tensor tt = run1("Tile", {t, ints({3, 1, 2})});
  REQUIRE(tt.shape() == Shape{6, 3, 10});
  ok = true;
  for (int64_t i = 0; i < tt.numel(); ++i) {
    auto idx = unravel(i, tt.shape());
    ok = ok && tt.data<int8_t>()[i] == t.data<int8_t>()[(idx[0] % 2) * 15 + idx[1] * 5 + idx[2] % 5];
  }
  CHECK(ok);
  CHECK(run1("Tile", {t, ints({1, 0, 1})}).shape() == Shape{2, 0, 5});
  CHECK_THROWS_AS(run1("Tile", {t, ints({1, 2})}), Error);
}

namespace {

int64_t pad_src(int64_t s, int64_t n, const std::string& mode) {
  if (s >= 0 && s < n) return s;
  if (mode == "constant") return -1;
  if (mode == "edge") return s < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((s % n) + n) % n;
  // reflect, one bounce at a time
  while (s < 0 || s >= n) {
    if (n == 1) return 0;
    if (s < 0) s = -s;
    if (s >= n) s = 2 * (n - 1) - s;
  }
  return s;
}

// numpy.pad semantics after cropping negative pads.
Tensor pad_ref(const Tensor& x, const std::vector<int64_t>& pads, const std::string& mode, float value) {
  const size_t r = x.shape().size();
  Shape out(r);
  std::vector<int64_t> lo(r), len(r), pb(r);
  for (size_t d = 0; d < r; ++d) {
    lo[d] = std::max<int64_t>(0, -pads[d]);
    len[d] = x.shape()[d] - lo[d] - std::max<int64_t>(0, -pads[d + r]);
    pb[d] = std::max<int64_t>(0, pads[d]);
    out[d] = pb[d] + len[d] + std::max<int64_t>(0, pads[d + r]);
  }
  Tensor y(DType::Float32, out);
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, out);
    bool constant = false;
    for (size_t d = 0; d < r; ++d) {
      int64_t s = pad_src(idx[d] - pb[d], len[d], mode);
      if (s < 0) constant = true;
      idx[d] = s + lo[d];
    }
    y.data<float>()[i] = constant ? value : x.data<float>()[ravel(idx, x.shape())];
  }
  return y;
}

}  // namespace

TEST_CASE("Pad constant/reflect/edge/wrap match numpy semantics", "[shape_ops]") {
  Tensor x = test::random_tensor({3, 4, 5}, 60);
  const std::vector<std::vector<int64_t>> pad_sets = {
      {1, 0, 2, 0, 3, 1}, {0, 2, 0, 2, 0, 4}, {-1, 1, 2, 0, -2, 3}, {0, 0, 7, 0, 0, 9}};
  for (const std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    for (const auto& pads : pad_sets) {
      INFO(mode << " pads " << shape_str(pads));
      Tensor y = run1("Pad", {x, ints(pads), Tensor::scalar<float>(2.5f)}, {ir::Attribute::make_string("mode", mode)}, 19);
      CHECK(bytes_equal(y, pad_ref(x, pads, mode, 2.5f)));
    }
  }
  // Opset 2-10 attributes; opset 18 axes.
  Tensor y2 = run1("Pad", {x}, {ir::Attribute::make_ints("pads", {0, 1, 1, 0, 1, 1}), ir::Attribute::make_float("value", -1.0f)}, 9);
  CHECK(bytes_equal(y2, pad_ref(x, {0, 1, 1, 0, 1, 1}, "constant", -1.0f)));
  Tensor y3 = run1("Pad", {x, ints({2, 1}), Tensor(), ints({-1})}, {ir::Attribute::make_string("mode", "edge")}, 18);
  CHECK(bytes_equal(y3, pad_ref(x, {0, 0, 2, 0, 0, 1}, "edge", 0.0f)));
  // Integer data keeps its type.
  Tensor i8 = random_int8({2, 3}, 61);
  Tensor p8 = run1("Pad", {i8, ints({1, 1, 1, 1}), Tensor::scalar<int8_t>(7)});
  REQUIRE(p8.dtype() == DType::Int8);
  CHECK(p8.shape() == Shape{4, 5});
  CHECK(p8.data<int8_t>()[0] == 7);
  CHECK(p8.data<int8_t>()[6] == i8.data<int8_t>()[0]);
  CHECK_THROWS_WITH(run1("Pad", {x, ints({1, 1})}), Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run1("Pad", {x, ints({0, 0, 0, 0, 0, 0})}, {ir::Attribute::make_string("mode", "mirror")}), Error);
}

TEST_CASE("DepthToSpace (DCR, CRD) and SpaceToDepth follow their index formulas", "[shape_ops]") {
  const int64_t N = 2, C = 12, H = 3, W = 5, b = 2;
  Tensor x = iota_f({N, C, H, W});
  for (const std::string mode : {"DCR", "CRD"}) {
    Tensor y = run1("DepthToSpace", {x}, {ir::Attribute::make_int("blocksize", b), ir::Attribute::make_string("mode", mode)});
    REQUIRE(y.shape() == Shape{N, C / 4, H * b, W * b});
    bool ok = true;
    for (int64_t i = 0; i < y.numel(); ++i) {
      auto o = unravel(i, y.shape());
      const int64_t bh = o[2] % b, bw = o[3] % b;
      const int64_t c = mode == "DCR" ? (bh * b + bw) * (C / 4) + o[1] : o[1] * b * b + bh * b + bw;
      ok = ok && y.data<float>()[i] == x.data<float>()[((o[0] * C + c) * H + o[2] / b) * W + o[3] / b];
    }
    CHECK(ok);
  }
  // SpaceToDepth inverts DepthToSpace(DCR).
  Tensor s = test::random_tensor({2, 3, 4, 6}, 70);
  Tensor d = run1("SpaceToDepth", {s}, {ir::Attribute::make_int("blocksize", 2)});
  CHECK(d.shape() == Shape{2, 12, 2, 3});
  CHECK(bytes_equal(run1("DepthToSpace", {d}, {ir::Attribute::make_int("blocksize", 2)}), s));
  CHECK_THROWS_WITH(run1("SpaceToDepth", {test::random_tensor({1, 2, 3, 4}, 1)}, {ir::Attribute::make_int("blocksize", 2)}),
                    Catch::Contains("node_under_test"));
  CHECK_THROWS_AS(run1("DepthToSpace", {test::random_tensor({1, 6, 3, 4}, 1)}, {ir::Attribute::make_int("blocksize", 2)}), Error);
}

TEST_CASE("Data movement serves strings and float16 natively", "[shape_ops]") {
  Tensor s = Tensor::from_strings({2, 3}, {"a", "bb", "ccc", "d", "ee", "f"});
  Tensor st = run1("Transpose", {s});
  CHECK(st.strings() == std::vector<std::string>{"a", "d", "bb", "ee", "ccc", "f"});
  Tensor sl = run1("Slice", {s, ints({2}), ints({-100}), ints({1}), ints({-2})});
  CHECK(sl.strings() == std::vector<std::string>{"ccc", "a", "f", "d"});
  Tensor h(DType::Float16, {2, 3});
  for (int64_t i = 0; i < 6; ++i) h.data<Float16>()[i] = to_half(static_cast<float>(i) + 0.5f);
  Tensor hc = run1("Concat", {h, h}, {ir::Attribute::make_int("axis", 0)});
  REQUIRE(hc.dtype() == DType::Float16);
  CHECK(to_float(hc.data<Float16>()[7]) == 1.5f);
  Tensor hp = run1("Pad", {h, ints({0, 1, 0, 0})});
  REQUIRE(hp.dtype() == DType::Float16);
  CHECK(hp.shape() == Shape{2, 4});
  CHECK(to_float(hp.data<Float16>()[5]) == 3.5f);
}
