// Tensor creation, casting and indexing kernels (tensor_ops.cpp, tensor_cast.cpp,
// tensor_gather.cpp, tensor_misc.cpp) against naive references and hand-computed values:
// Cast rounding/truncation/string rules, Gather family with negative and out-of-range indices,
// Scatter family with reductions, Range, EyeLike, OneHot, NonZero, TopK ties, Trilu, Compress,
// Unique, ReverseSequence, Constant, ConstantOfShape.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
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

std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_double(i));
  return v;
}

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

Attrs to(DType t) { return {ir::Attribute::make_int("to", static_cast<int64_t>(t))}; }

}  // namespace

TEST_CASE("Cast float to float16 rounds to nearest even and overflows to inf", "[tensor_ops]") {
  // 2049 lies halfway between 2048 and 2050: ties to even (2048); 2051 -> 2052.
  Tensor x = Tensor::from<float>({7}, {2049.0f, 2051.0f, 65504.0f, 65520.0f, -70000.0f, 1e-8f, 6.0e-8f});
  Tensor h = run1("Cast", {x}, to(DType::Float16));
  REQUIRE(h.dtype() == DType::Float16);
  CHECK(to_float(h.data<Float16>()[0]) == 2048.0f);
  CHECK(to_float(h.data<Float16>()[1]) == 2052.0f);
  CHECK(to_float(h.data<Float16>()[2]) == 65504.0f);
  CHECK(std::isinf(to_float(h.data<Float16>()[3])));
  CHECK(to_float(h.data<Float16>()[4]) == -std::numeric_limits<float>::infinity());
  CHECK(to_float(h.data<Float16>()[5]) == 0.0f);
  CHECK(to_float(h.data<Float16>()[6]) == 5.9604644775390625e-08f);  // smallest subnormal
  // And back to float32 exactly (the executor must not narrow Cast's float32 output).
  Tensor back = run1("Cast", {h}, to(DType::Float32));
  REQUIRE(back.dtype() == DType::Float32);
  CHECK(back.data<float>()[1] == 2052.0f);
  // bfloat16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6.
  Tensor b = run1("Cast", {Tensor::from<float>({2}, {1.00390625f, 1.01171875f})}, to(DType::BFloat16));
  REQUIRE(b.dtype() == DType::BFloat16);
  CHECK(to_float(b.data<BFloat16>()[0]) == 1.0f);
  CHECK(to_float(b.data<BFloat16>()[1]) == 1.015625f);
  // double -> float16.
  Tensor d = run1("Cast", {Tensor::from<double>({2}, {0.5, -3.25})}, to(DType::Float16));
  CHECK(values(d) == std::vector<double>{0.5, -3.25});
}

TEST_CASE("Cast float16 <-> float32 vector path is bit-exact on special values", "[tensor_ops]") {
  // 24 values so the 8-wide path handles all but none of the tail: NaNs, infinities, overflow,
  // ties, subnormals, signed zeros.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,     -0.0f,    1.0f,      -2.5f,     65504.0f, 65519.0f, 65520.0f, 1e10f,
                          -1e10f,   inf,      -inf,      std::nanf(""), 2049.0f, 2051.0f, 6.0e-8f,  2.9e-8f,
                          3.0e-8f,  -1e-5f,   6.1e-5f,   1e-45f,    0.1f,     -0.3333f, 1234.567f, 3.0e-5f};
  Tensor x = Tensor::from<float>({static_cast<int64_t>(v.size())}, v);
  Tensor h = run1("Cast", {x}, to(DType::Float16));
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("value " << v[i]);
    CHECK(h.data<Float16>()[i].bits == float_to_half_bits(v[i]));
  }
  Tensor back = run1("Cast", {h}, to(DType::Float32));
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = half_bits_to_float(h.data<Float16>()[i].bits);
    const float got = back.data<float>()[i];
    INFO("value " << v[i]);
    CHECK(std::memcmp(&want, &got, 4) == 0);
  }
}

TEST_CASE("Cast float to integers truncates, bools are 0/1, large batches are parallel", "[tensor_ops]") {
  Tensor x = Tensor::from<float>({6}, {-1.7f, -0.5f, 0.0f, 0.99f, 2.5f, 126.9f});
  CHECK(values(run1("Cast", {x}, to(DType::Int32))) == std::vector<double>{-1, 0, 0, 0, 2, 126});
  CHECK(values(run1("Cast", {x}, to(DType::Int8))) == std::vector<double>{-1, 0, 0, 0, 2, 126});
  CHECK(values(run1("Cast", {x}, to(DType::Bool))) == std::vector<double>{1, 1, 0, 1, 1, 1});
  Tensor bools = Tensor::from<bool>({3}, {true, false, true});
  Tensor bf = run1("Cast", {bools}, to(DType::Float32));
  CHECK(values(bf) == std::vector<double>{1, 0, 1});
  Tensor i = Tensor::from<int64_t>({3}, {-5, 300, 1LL << 40});
  CHECK(values(run1("Cast", {i}, to(DType::Float64))) == std::vector<double>{-5, 300, 1099511627776.0});
  CHECK(values(run1("Cast", {i}, to(DType::UInt8))) == std::vector<double>{251, 44, 0});  // wraps like C
  // A large tensor (parallel path) equals the element-wise conversion.
  Tensor big = test::random_tensor({1000, 77}, 5, -1000.0f, 1000.0f);
  Tensor bi = run1("Cast", {big}, to(DType::Int16));
  bool ok = true;
  for (int64_t k = 0; k < big.numel(); ++k) ok = ok && bi.data<int16_t>()[k] == static_cast<int16_t>(std::trunc(big.data<float>()[k]));
  CHECK(ok);
  Tensor bh = run1("Cast", {big}, to(DType::Float16));
  ok = true;
  for (int64_t k = 0; k < big.numel(); ++k) ok = ok && bh.data<Float16>()[k].bits == float_to_half_bits(big.data<float>()[k]);
  CHECK(ok);
}

TEST_CASE("Cast to and from strings; Cast-1 names; CastLike", "[tensor_ops]") {
  Tensor x = Tensor::from<float>({4}, {0.9767611f, 0.039187793f, -2.0f, 1e20f});
  Tensor s = run1("Cast", {x}, to(DType::String));
  REQUIRE(s.dtype() == DType::String);
  CHECK(s.strings()[0] == "0.9767611");
  CHECK(s.strings()[1] == "0.039187793");
  CHECK(s.strings()[2] == "-2");
  CHECK(run1("Cast", {Tensor::from<int32_t>({2}, {-7, 42})}, to(DType::String)).strings() ==
        std::vector<std::string>{"-7", "42"});
  Tensor txt = Tensor::from_strings({5}, {"0.47892547", "NaN", "INF", "+INF", "-INF"});
  Tensor f = run1("Cast", {txt}, to(DType::Float32));
  CHECK(f.data<float>()[0] == 0.47892547f);
  CHECK(std::isnan(f.data<float>()[1]));
  CHECK(f.data<float>()[2] == std::numeric_limits<float>::infinity());
  CHECK(f.data<float>()[3] == std::numeric_limits<float>::infinity());
  CHECK(f.data<float>()[4] == -std::numeric_limits<float>::infinity());
  CHECK(values(run1("Cast", {Tensor::from_strings({2}, {"17", "-3"})}, to(DType::Int64))) == std::vector<double>{17, -3});
  CHECK_THROWS_WITH(run1("Cast", {Tensor::from_strings({1}, {"abc"})}, to(DType::Float32)), Catch::Contains("node_under_test"));
  // Cast-1 takes the type by name.
  Tensor c1 = run1("Cast", {x}, {ir::Attribute::make_string("to", "INT64")}, 1);
  CHECK(c1.dtype() == DType::Int64);
  CHECK_THROWS_AS(run1("Cast", {x}, {ir::Attribute::make_string("to", "REAL")}, 1), Error);
  CHECK_THROWS_AS(run1("Cast", {x}, {ir::Attribute::make_int("to", 99)}), Error);
  Tensor like = run1("CastLike", {x, Tensor::from<double>({1}, {0.0})});
  CHECK(like.dtype() == DType::Float64);
  CHECK(like.get_double(2) == -2.0);
}

namespace {

Tensor gather_ref(const Tensor& data, const std::vector<int64_t>& idx, const Shape& idx_shape, int axis) {
  Shape out(data.shape().begin(), data.shape().begin() + axis);
  out.insert(out.end(), idx_shape.begin(), idx_shape.end());
  out.insert(out.end(), data.shape().begin() + axis + 1, data.shape().end());
  Tensor y(DType::Float32, out);
  const size_t q = idx_shape.size();
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto o = unravel(i, out);
    std::vector<int64_t> ii(o.begin(), o.begin() + axis);
    std::vector<int64_t> qi(o.begin() + axis, o.begin() + axis + static_cast<int64_t>(q));
    int64_t k = idx[static_cast<size_t>(ravel(qi, idx_shape))];
    if (k < 0) k += data.shape()[static_cast<size_t>(axis)];
    ii.push_back(k);
    ii.insert(ii.end(), o.begin() + axis + static_cast<int64_t>(q), o.end());
    y.data<float>()[i] = data.data<float>()[ravel(ii, data.shape())];
  }
  return y;
}

}  // namespace

TEST_CASE("Gather matches the naive reference, negative indices included", "[tensor_ops]") {
  Tensor data = test::random_tensor({4, 5, 3}, 11);
  std::vector<int64_t> idx = {3, -1, 0, 2, -5, 4};
  for (int axis = 0; axis < 3; ++axis) {
    std::vector<int64_t> id = idx;
    const int64_t dim = data.shape()[static_cast<size_t>(axis)];
    for (auto& v : id) v = ((v % dim) + dim) % dim - (v < 0 ? dim : 0);  // keep negatives in range
    Tensor it = Tensor::from<int64_t>({2, 3}, id);
    Tensor y = run1("Gather", {data, it}, {ir::Attribute::make_int("axis", axis)});
    INFO("axis " << axis);
    CHECK(test::max_abs_diff(y, gather_ref(data, id, {2, 3}, axis)) == 0.0);
  }
  // int32 indices and a scalar index.
  Tensor y = run1("Gather", {data, Tensor::scalar<int32_t>(-2)}, {ir::Attribute::make_int("axis", 1)});
  CHECK(y.shape() == Shape{4, 3});
  CHECK(y.data<float>()[4] == data.data<float>()[1 * 15 + 3 * 3 + 1]);
  // Strings.
  Tensor s = Tensor::from_strings({3}, {"x", "y", "z"});
  CHECK(run1("Gather", {s, ints({2, 0})}).strings() == std::vector<std::string>{"z", "x"});
}

TEST_CASE("Gather with an index out of range is an error naming the node", "[tensor_ops]") {
  Tensor data = test::random_tensor({4, 5}, 12);
  CHECK_THROWS_WITH(run1("Gather", {data, ints({0, 4})}), Catch::Contains("node_under_test") && Catch::Contains("out of range"));
  CHECK_THROWS_AS(run1("Gather", {data, ints({-5})}), Error);
  CHECK_THROWS_AS(run1("Gather", {data, ints({5})}, {ir::Attribute::make_int("axis", 1)}), Error);
  CHECK_THROWS_AS(run1("GatherElements", {data, Tensor::from<int64_t>({1, 1}, {9})}), Error);
  CHECK_THROWS_AS(run1("GatherND", {data, Tensor::from<int64_t>({1, 2}, {3, 5})}), Error);
  CHECK_THROWS_AS(run1("ScatterND", {data, Tensor::from<int64_t>({1, 1}, {4}), test::random_tensor({1, 5}, 1)}), Error);
}

TEST_CASE("GatherElements and ScatterElements with reductions match naive loops", "[tensor_ops]") {
  Tensor data = test::random_tensor({3, 4, 5}, 13);
  std::mt19937 rng(14);
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t dim = data.shape()[static_cast<size_t>(axis)];
    Shape is{2, 3, 4};
    Tensor ind(DType::Int64, is);
    for (int64_t i = 0; i < ind.numel(); ++i) ind.data<int64_t>()[i] = static_cast<int64_t>(rng() % (2 * dim)) - dim;
    Tensor y = run1("GatherElements", {data, ind}, {ir::Attribute::make_int("axis", axis)});
    bool ok = y.shape() == is;
    for (int64_t i = 0; ok && i < y.numel(); ++i) {
      auto o = unravel(i, is);
      int64_t k = ind.data<int64_t>()[i];
      o[static_cast<size_t>(axis)] = k < 0 ? k + dim : k;
      ok = y.data<float>()[i] == data.data<float>()[ravel(o, data.shape())];
    }
    INFO("axis " << axis);
    CHECK(ok);
    Tensor upd = test::random_tensor(is, 15 + static_cast<uint32_t>(axis));
    for (const std::string red : {"none", "add", "mul", "max", "min"}) {
      Tensor s = run1("ScatterElements", {data, ind, upd},
                      {ir::Attribute::make_int("axis", axis), ir::Attribute::make_string("reduction", red)}, 18);
      Tensor want = data.clone();
      for (int64_t i = 0; i < ind.numel(); ++i) {
        auto o = unravel(i, is);
        int64_t k = ind.data<int64_t>()[i];
        o[static_cast<size_t>(axis)] = k < 0 ? k + dim : k;
        float& d = want.data<float>()[ravel(o, data.shape())];
        const float u = upd.data<float>()[i];
        if (red == "none") d = u;
        else if (red == "add") d += u;
        else if (red == "mul") d *= u;
        else if (red == "max") d = std::max(d, u);
        else d = std::min(d, u);
      }
      INFO("reduction " << red);
      CHECK(test::max_abs_diff(s, want) < 1e-6);
    }
  }
  CHECK_THROWS_WITH(run1("ScatterElements", {data, Tensor::from<int64_t>({1, 1, 1}, {0}), test::random_tensor({1, 1, 1}, 1)},
                         {ir::Attribute::make_string("reduction", "avg")}, 18),
                    Catch::Contains("node_under_test"));
}

TEST_CASE("GatherND with batch_dims and ScatterND with reductions", "[tensor_ops]") {
  // data [2, 3, 4], batch_dims=1, indices [2, 2, 1] pick rows of each batch.
  Tensor data(DType::Float32, {2, 3, 4});
  for (int64_t i = 0; i < 24; ++i) data.data<float>()[i] = static_cast<float>(i);
  Tensor ind = Tensor::from<int64_t>({2, 2, 1}, {2, 0, -1, 1});
  Tensor y = run1("GatherND", {data, ind}, {ir::Attribute::make_int("batch_dims", 1)});
  REQUIRE(y.shape() == Shape{2, 2, 4});
  CHECK(y.data<float>()[0] == 8.0f);    // batch 0 row 2
  CHECK(y.data<float>()[4] == 0.0f);    // batch 0 row 0
  CHECK(y.data<float>()[8] == 20.0f);   // batch 1 row 2 (-1)
  CHECK(y.data<float>()[12] == 16.0f);  // batch 1 row 1
  // Full tuples pick scalars.
  Tensor y2 = run1("GatherND", {data, Tensor::from<int64_t>({2, 3}, {1, 2, 3, 0, 1, 1})});
  CHECK(values(y2) == std::vector<double>{23, 5});
  // ScatterND with duplicate indices accumulates under add/mul.
  Tensor base = Tensor::from<float>({4, 2}, {1, 1, 2, 2, 3, 3, 4, 4});
  Tensor si = Tensor::from<int64_t>({3, 1}, {1, -1, 1});
  Tensor su = Tensor::from<float>({3, 2}, {10, 20, 30, 40, 5, 6});
  CHECK(values(run1("ScatterND", {base, si, su}, {ir::Attribute::make_string("reduction", "add")}, 18)) ==
        std::vector<double>{1, 1, 17, 28, 3, 3, 34, 44});
  CHECK(values(run1("ScatterND", {base, si, su}, {ir::Attribute::make_string("reduction", "mul")}, 18)) ==
        std::vector<double>{1, 1, 100, 240, 3, 3, 120, 160});
  CHECK(values(run1("ScatterND", {base, Tensor::from<int64_t>({1, 1}, {2}), Tensor::from<float>({1, 2}, {9, 8})})) ==
        std::vector<double>{1, 1, 2, 2, 9, 8, 4, 4});
  CHECK(values(run1("ScatterND", {base, si, su}, {ir::Attribute::make_string("reduction", "max")}, 18)) ==
        std::vector<double>{1, 1, 10, 20, 3, 3, 30, 40});
  CHECK_THROWS_AS(run1("ScatterND", {base, si, Tensor::from<float>({3, 1}, {1, 2, 3})}), Error);
}

TEST_CASE("Range, EyeLike, OneHot, Trilu, ConstantOfShape, Constant", "[tensor_ops]") {
  CHECK(values(run1("Range", {Tensor::scalar<int32_t>(10), Tensor::scalar<int32_t>(1), Tensor::scalar<int32_t>(-3)})) ==
        std::vector<double>{10, 7, 4});
  Tensor rf = run1("Range", {Tensor::scalar<float>(1.0f), Tensor::scalar<float>(2.0f), Tensor::scalar<float>(0.25f)});
  CHECK(values(rf) == std::vector<double>{1.0, 1.25, 1.5, 1.75});
  CHECK(run1("Range", {Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(1), Tensor::scalar<int64_t>(2)}).numel() == 0);
  CHECK_THROWS_AS(run1("Range", {Tensor::scalar<int64_t>(0), Tensor::scalar<int64_t>(1), Tensor::scalar<int64_t>(0)}), Error);

  Tensor eye = run1("EyeLike", {Tensor(DType::Int32, {3, 4})}, {ir::Attribute::make_int("k", 1), ir::Attribute::make_int("dtype", 1)});
  REQUIRE(eye.dtype() == DType::Float32);
  CHECK(values(eye) == std::vector<double>{0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});

  Tensor oh = run1("OneHot", {Tensor::from<int64_t>({3}, {0, -1, 7}), Tensor::scalar<float>(3.0f), Tensor::from<float>({2}, {-1, 5})},
                   {ir::Attribute::make_int("axis", 0)});
  REQUIRE(oh.shape() == Shape{3, 3});
  // Column j is the one-hot of index j (7 is out of range: all off).
  CHECK(values(oh) == std::vector<double>{5, -1, -1, -1, -1, -1, -1, 5, -1});

  Tensor m(DType::Float32, {2, 3, 4});
  for (int64_t i = 0; i < 24; ++i) m.data<float>()[i] = static_cast<float>(i + 1);
  for (int64_t k = -3; k <= 4; ++k)
    for (int upper = 0; upper < 2; ++upper) {
      Tensor t = run1("Trilu", {m, Tensor::scalar<int64_t>(k)}, {ir::Attribute::make_int("upper", upper)});
      bool ok = true;
      for (int64_t i = 0; i < 24; ++i) {
        const int64_t r = (i / 4) % 3, c = i % 4;
        const bool keep = upper ? c - r >= k : c - r <= k;
        ok = ok && t.data<float>()[i] == (keep ? m.data<float>()[i] : 0.0f);
      }
      INFO("k " << k << " upper " << upper);
      CHECK(ok);
    }

  Tensor cs = run1("ConstantOfShape", {ints({2, 3})}, {ir::Attribute::make_tensor("value", Tensor::from<int32_t>({1}, {7}))});
  CHECK(cs.dtype() == DType::Int32);
  CHECK(values(cs) == std::vector<double>(6, 7.0));
  Tensor cz = run1("ConstantOfShape", {ints({0})});
  CHECK(cz.dtype() == DType::Float32);
  CHECK(cz.shape() == Shape{0});

  Tensor c = run_node("Constant", {}, {ir::Attribute::make_floats("value_floats", {1.5f, 2.5f})}).at(0);
  CHECK(values(c) == std::vector<double>{1.5, 2.5});
  Tensor ci = run_node("Constant", {}, {ir::Attribute::make_int("value_int", 9)}).at(0);
  CHECK(ci.dtype() == DType::Int64);
  CHECK(ci.rank() == 0);
  CHECK_THROWS_WITH(run_node("Constant", {}, {}), Catch::Contains("node_under_test"));
}

TEST_CASE("TopK keeps the lower index on ties and follows largest/sorted", "[tensor_ops]") {
  Tensor x = Tensor::from<float>({2, 5}, {3, 1, 3, 2, 3, 0, 5, 5, -1, 5});
  auto out = run_node("TopK", {x, ints({3})}, {}, 2, 11);
  CHECK(values(out[0]) == std::vector<double>{3, 3, 3, 5, 5, 5});
  CHECK(out[1].to_int64_vector() == std::vector<int64_t>{0, 2, 4, 1, 2, 4});
  auto small = run_node("TopK", {x, ints({2})}, {ir::Attribute::make_int("largest", 0)}, 2, 11);
  CHECK(values(small[0]) == std::vector<double>{1, 2, -1, 0});
  CHECK(small[1].to_int64_vector() == std::vector<int64_t>{1, 3, 3, 0});
  // axis 0 and a random tensor against a full sort.
  Tensor r = test::random_tensor({37, 3}, 21);
  auto top = run_node("TopK", {r, ints({5})}, {ir::Attribute::make_int("axis", 0)}, 2, 11);
  bool ok = true;
  for (int64_t c = 0; c < 3; ++c) {
    std::vector<std::pair<float, int64_t>> col;
    for (int64_t i = 0; i < 37; ++i) col.push_back({-r.data<float>()[i * 3 + c], i});
    std::sort(col.begin(), col.end());
    for (int64_t j = 0; j < 5; ++j)
      ok = ok && top[1].data<int64_t>()[j * 3 + c] == col[static_cast<size_t>(j)].second &&
           top[0].data<float>()[j * 3 + c] == -col[static_cast<size_t>(j)].first;
  }
  CHECK(ok);
  // Opset 1 takes k as an attribute.
  CHECK(run_node("TopK", {x}, {ir::Attribute::make_int("k", 1)}, 2, 9)[0].shape() == Shape{2, 1});
  CHECK_THROWS_WITH(run_node("TopK", {x, ints({6})}, {}, 2, 11), Catch::Contains("node_under_test"));
}

TEST_CASE("NonZero, Compress, Unique, ReverseSequence", "[tensor_ops]") {
  Tensor x = Tensor::from<int32_t>({2, 3}, {0, 4, 0, 7, 0, 1});
  Tensor nz = run1("NonZero", {x});
  REQUIRE(nz.shape() == Shape{2, 3});
  CHECK(nz.to_int64_vector() == std::vector<int64_t>{0, 1, 1, 1, 0, 2});

  Tensor d = Tensor::from<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor cond = Tensor::from<bool>({2}, {false, true});
  CHECK(values(run1("Compress", {d, cond}, {ir::Attribute::make_int("axis", 1)})) == std::vector<double>{2, 4, 6});
  CHECK(values(run1("Compress", {d, Tensor::from<bool>({3}, {true, false, true})})) == std::vector<double>{1, 3});
  CHECK(values(run1("Compress", {d, Tensor::from<bool>({3}, {false, true, true})}, {ir::Attribute::make_int("axis", 0)})) ==
        std::vector<double>{3, 4, 5, 6});

  Tensor u = Tensor::from<float>({6}, {2, 1, 1, 3, 4, 3});
  auto sorted = run_node("Unique", {u}, {}, 4, 11);
  CHECK(values(sorted[0]) == std::vector<double>{1, 2, 3, 4});
  CHECK(sorted[1].to_int64_vector() == std::vector<int64_t>{1, 0, 3, 4});
  CHECK(sorted[2].to_int64_vector() == std::vector<int64_t>{1, 0, 0, 2, 3, 2});
  CHECK(sorted[3].to_int64_vector() == std::vector<int64_t>{2, 1, 2, 1});
  auto unsorted = run_node("Unique", {u}, {ir::Attribute::make_int("sorted", 0)}, 4, 11);
  CHECK(values(unsorted[0]) == std::vector<double>{2, 1, 3, 4});
  CHECK(unsorted[2].to_int64_vector() == std::vector<int64_t>{0, 1, 1, 2, 3, 2});
  Tensor rows = Tensor::from<int64_t>({3, 2}, {1, 0, 0, 1, 1, 0});
  auto ur = run_node("Unique", {rows}, {ir::Attribute::make_int("axis", 0)}, 4, 11);
  CHECK(ur[0].to_int64_vector() == std::vector<int64_t>{0, 1, 1, 0});
  CHECK(ur[3].to_int64_vector() == std::vector<int64_t>{1, 2});

  // ReverseSequence, time-major [T=4, B=2, 1].
  Tensor seq = Tensor::from<float>({4, 2, 1}, {0, 10, 1, 11, 2, 12, 3, 13});
  Tensor rs = run1("ReverseSequence", {seq, ints({3, 1})});
  CHECK(values(rs) == std::vector<double>{2, 10, 1, 11, 0, 12, 3, 13});
  CHECK_THROWS_WITH(run1("ReverseSequence", {seq, ints({5, 1})}), Catch::Contains("node_under_test"));
}
