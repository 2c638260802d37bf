// Quantization kernels against the scalar ground truth in lib/calib/quant_ref: QuantizeLinear and
// DequantizeLinear (bit for bit on millions of values, per tensor / per axis / blocked), fake
// quantization, DynamicQuantizeLinear, QLinearMatMul, MatMulInteger, QLinearConv, ConvInteger.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "calib/quant_ref.h"
#include "core/half.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;
namespace cq = mpq::calib;

namespace {

// Runs one node whose inputs are all graph inputs (an undefined Tensor omits that input).
std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, size_t num_outputs,
                             std::vector<ir::Attribute> attrs = {}, int opset = 21) {
  return test::run_node(op, inputs, attrs, num_outputs, opset, /*threads=*/0);
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Inputs that stress rounding: uniform values, exact .5 ties (k + 0.5) * scale with a power-of-two
// scale so the division is exact, values far outside the range, zeros, infinities.
Tensor stress_values(int64_t n, uint32_t seed, float scale, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-range, range);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int> tie(-70000, 70000);
  Tensor t(DType::Float32, {n});
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    switch (kind(rng)) {
      case 0:
      case 1:
      case 2: p[i] = (static_cast<float>(tie(rng)) + 0.5f) * scale; break;  // exact ties
      case 3: p[i] = uni(rng) * 1000.0f; break;                              // far outside
      case 4: p[i] = static_cast<float>(tie(rng)) * scale; break;            // exact integers
      default: p[i] = uni(rng); break;
    }
  }
  p[0] = std::numeric_limits<float>::infinity();
  p[1] = -std::numeric_limits<float>::infinity();
  p[2] = 0.0f;
  p[3] = -0.0f;
  return t;
}

Tensor zp_tensor(DType t, const std::vector<int32_t>& v, const Shape& shape) {
  Tensor z(t, shape);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::Int8: z.data<int8_t>()[i] = static_cast<int8_t>(v[i]); break;
      case DType::UInt8: z.data<uint8_t>()[i] = static_cast<uint8_t>(v[i]); break;
      case DType::Int16: z.data<int16_t>()[i] = static_cast<int16_t>(v[i]); break;
      case DType::UInt16: z.data<uint16_t>()[i] = static_cast<uint16_t>(v[i]); break;
      case DType::Int32: z.data<int32_t>()[i] = v[i]; break;
      default: FAIL("zp_tensor: unsupported type");
    }
  }
  return z;
}

int32_t elem_int(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::Int4 || t.dtype() == DType::UInt4) {
    int v = (static_cast<const uint8_t*>(t.raw_data())[i >> 1] >> ((i & 1) * 4)) & 0xF;
    if (t.dtype() == DType::Int4 && v >= 8) v -= 16;
    return v;
  }
  return static_cast<int32_t>(t.get_int64(i));
}

Tensor pack4(DType t, const std::vector<int32_t>& v, const Shape& shape) {
  Tensor out(t, shape);
  auto* p = static_cast<uint8_t*>(out.raw_data());
  std::memset(p, 0, out.nbytes());
  for (size_t i = 0; i < v.size(); ++i) p[i >> 1] |= static_cast<uint8_t>((v[i] & 0xF) << ((i & 1) * 4));
  return out;
}

cq::QRange range_of(DType t) {
  switch (t) {
    case DType::Int8: return cq::kInt8Range;
    case DType::UInt8: return cq::kUInt8Range;
    case DType::Int16: return cq::kInt16Range;
    case DType::UInt16: return cq::kUInt16Range;
    case DType::Int4: return cq::kInt4Range;
    case DType::UInt4: return cq::kUInt4Range;
    default: return {0, 0};
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Reference primitives

TEST_CASE("round_half_to_even", "[quant][ref]") {
  CHECK(cq::round_half_to_even(0.5f) == 0.0f);
  CHECK(cq::round_half_to_even(1.5f) == 2.0f);
  CHECK(cq::round_half_to_even(2.5f) == 2.0f);
  CHECK(cq::round_half_to_even(-2.5f) == -2.0f);
  CHECK(cq::round_half_to_even(-3.5f) == -4.0f);
  CHECK(cq::round_half_to_even(2.4999998f) == 2.0f);
  CHECK(cq::round_half_to_even(2.5000002f) == 3.0f);
  CHECK(cq::round_half_to_even(8388607.5f) == 8388608.0f);
  CHECK(cq::round_half_to_even(16777216.0f) == 16777216.0f);
  CHECK(std::isinf(cq::round_half_to_even(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(cq::round_half_to_even(std::nanf(""))));
  // Against nearbyint in the default rounding mode over many values.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1000.0f, 1000.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = i % 2 ? d(rng) : std::floor(d(rng)) + 0.5f;
    REQUIRE(cq::round_half_to_even(x) == std::nearbyint(x));
  }
}

TEST_CASE("quantize_ref / dequantize_ref / fake_quantize_ref", "[quant][ref]") {
  CHECK(cq::quantize_ref(0.25f, 0.5f, 0, -128, 127) == 0);   // 0.5 -> 0 (even)
  CHECK(cq::quantize_ref(0.75f, 0.5f, 0, -128, 127) == 2);   // 1.5 -> 2
  CHECK(cq::quantize_ref(1.25f, 0.5f, 10, -128, 127) == 12);  // 2.5 -> 2, + 10
  CHECK(cq::quantize_ref(-1.25f, 0.5f, 0, -128, 127) == -2);
  CHECK(cq::quantize_ref(1e9f, 0.5f, 0, -128, 127) == 127);
  CHECK(cq::quantize_ref(-1e9f, 0.5f, 0, -128, 127) == -128);
  CHECK(cq::quantize_ref(-1.0f, 0.1f, 128, 0, 255) == 118);
  CHECK(cq::quantize_ref(std::nanf(""), 0.1f, 128, 0, 255) == 128);
  CHECK(cq::quantize_ref(std::numeric_limits<float>::infinity(), 0.1f, 3, 0, 255) == 255);
  // Division, not multiplication by the reciprocal: here x / s and x * (1 / s) round differently.
  const float s = 0.003f;
  const float x = -176.5f * s;
  CHECK(cq::quantize_ref(x, s, 0, -32768, 32767) == -176);
  CHECK(std::nearbyint(x * (1.0f / s)) == -177.0f);
  CHECK(cq::dequantize_ref(130, 0.5f, 128) == 1.0f);
  CHECK(cq::dequantize_ref(-128, 0.25f, 127) == -63.75f);
  CHECK(cq::dequantize_ref(std::numeric_limits<int32_t>::min(), 1.0f, 0) == -2147483648.0f);
  CHECK(cq::fake_quantize_ref(0.26f, 0.1f, 0, -128, 127) == 0.3f);
  CHECK(cq::fake_quantize_ref(100.0f, 0.1f, 0, -128, 127) == 12.7f);
  CHECK(cq::requantize_ref(1000, 0.0025f, 5, -128, 127) == 7);  // 2.5 -> 2, + 5
  CHECK(cq::requantize_ref(-100000, 0.01f, 0, -128, 127) == -128);

  std::vector<float> xs = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  std::vector<float> sc = {0.1f, 0.2f, 0.05f};
  std::vector<int32_t> zp = {1, -2, 3};
  std::vector<int32_t> q(6);
  cq::quantize_per_axis_ref(xs.data(), 2, 3, 1, sc.data(), zp.data(), -128, 127, q.data());
  CHECK(q == std::vector<int32_t>{2, -1, 9, 5, 0, 15});
  std::vector<float> y(6);
  cq::dequantize_per_axis_ref(q.data(), 2, 3, 1, sc.data(), zp.data(), y.data());
  CHECK(y[2] == cq::dequantize_ref(9, 0.05f, 3));
  std::vector<float> fq(6);
  cq::fake_quantize_per_axis_ref(xs.data(), 2, 3, 1, sc.data(), zp.data(), -128, 127, fq.data());
  for (int i = 0; i < 6; ++i) CHECK(fq[static_cast<size_t>(i)] == y[static_cast<size_t>(i)]);
  // Blocked: 5 channels in blocks of 2 -> 3 parameter rows.
  std::vector<float> xb = {1, 2, 3, 4, 5};
  std::vector<float> sb = {1.0f, 2.0f, 4.0f};
  std::vector<int32_t> qb(5);
  cq::quantize_blocked_ref(xb.data(), 1, 5, 1, 2, sb.data(), nullptr, -128, 127, qb.data());
  CHECK(qb == std::vector<int32_t>{1, 2, 2, 2, 1});  // 1, 2, 1.5->2, 2, 1.25->1
  std::vector<float> yb(5);
  cq::dequantize_blocked_ref(qb.data(), 1, 5, 1, 2, sb.data(), nullptr, yb.data());
  CHECK(yb == std::vector<float>{1, 2, 4, 4, 4});
}

// ------------------------------------------------------------------------------------------------
// QuantizeLinear / DequantizeLinear: fast kernels bit for bit with the reference

TEST_CASE("QuantizeLinear per tensor matches quantize_ref bit for bit on millions of values", "[quant]") {
  const int64_t n = 1 << 21;
  struct Case {
    DType type;
    int32_t zp;
    float scale;
  };
  const Case cases[] = {{DType::UInt8, 128, 0.0078125f}, {DType::Int8, -3, 0.015625f}, {DType::UInt8, 0, 0.1f},
                        {DType::Int8, 0, 0.0375f},        {DType::Int16, 17, 0.001953125f}, {DType::UInt16, 30000, 0.01f}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    INFO(dtype_name(c.type) << " scale " << c.scale << " zp " << c.zp);
    const cq::QRange r = range_of(c.type);
    const float span = static_cast<float>(r.qmax - r.qmin) * c.scale;
    Tensor x = stress_values(n, seed++, c.scale, span);
    Tensor y = run_node("QuantizeLinear", {x, Tensor::scalar<float>(c.scale), zp_tensor(c.type, {c.zp}, {})}, 1)[0];
    REQUIRE(y.dtype() == c.type);
    REQUIRE(y.shape() == x.shape());
    const float* px = x.data<float>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i)
      if (elem_int(y, i) != cq::quantize_ref(px[i], c.scale, c.zp, r.qmin, r.qmax)) ++mismatches;
    CHECK(mismatches == 0);
  }
}

TEST_CASE("QuantizeLinear handles NaN and default zero point", "[quant]") {
  Tensor x = Tensor::from<float>({5}, {std::nanf(""), 1.0f, -1.0f, 300.0f, 2.5f});
  Tensor y = run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f)}, 1)[0];
  REQUIRE(y.dtype() == DType::UInt8);
  CHECK(values_of<uint8_t>(y) == std::vector<uint8_t>{0, 1, 0, 255, 2});
  Tensor y2 = run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f), Tensor::scalar<int8_t>(5)}, 1)[0];
  CHECK(values_of<int8_t>(y2) == std::vector<int8_t>{5, 6, 4, 127, 7});
}

TEST_CASE("QuantizeLinear / DequantizeLinear per axis on odd shapes", "[quant]") {
  // axis 1 with a long inner run, axis -1 with inner 1 (expanded parameters), axis 0.
  struct Case {
    Shape shape;
    int64_t axis;
    DType type;
  };
  const Case cases[] = {{{3, 5, 7, 11}, 1, DType::Int8},
                        {{4, 3, 37}, -1, DType::UInt8},
                        {{9, 2, 3}, 0, DType::Int16},
                        {{2, 6, 40}, 1, DType::UInt8},
                        {{5, 13}, 1, DType::Int8}};
  uint32_t seed = 7;
  for (const Case& c : cases) {
    INFO(shape_str(c.shape) << " axis " << c.axis);
    const int rank = static_cast<int>(c.shape.size());
    const int axis = static_cast<int>(c.axis < 0 ? c.axis + rank : c.axis);
    const int64_t C = c.shape[static_cast<size_t>(axis)];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= c.shape[static_cast<size_t>(d)];
    for (int d = axis + 1; d < rank; ++d) inner *= c.shape[static_cast<size_t>(d)];
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> sd(0.01f, 0.2f);
    const cq::QRange r = range_of(c.type);
    std::uniform_int_distribution<int32_t> zd(r.qmin, r.qmax);
    std::vector<float> sc(static_cast<size_t>(C));
    std::vector<int32_t> zp(static_cast<size_t>(C));
    for (int64_t k = 0; k < C; ++k) {
      sc[static_cast<size_t>(k)] = sd(rng);
      zp[static_cast<size_t>(k)] = zd(rng);
    }
    Tensor x = test::random_tensor(c.shape, seed++, -30.0f, 30.0f);
    Tensor st = Tensor::from<float>({C}, sc);
    Tensor zt = zp_tensor(c.type, zp, {C});
    Tensor q = run_node("QuantizeLinear", {x, st, zt}, 1, {ir::Attribute::make_int("axis", c.axis)})[0];
    std::vector<int32_t> want(static_cast<size_t>(x.numel()));
    cq::quantize_per_axis_ref(x.data<float>(), outer, C, inner, sc.data(), zp.data(), r.qmin, r.qmax, want.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (elem_int(q, i) != want[static_cast<size_t>(i)]) ++bad;
    CHECK(bad == 0);

    Tensor y = run_node("DequantizeLinear", {q, st, zt}, 1, {ir::Attribute::make_int("axis", c.axis)})[0];
    REQUIRE(y.dtype() == DType::Float32);
    std::vector<float> dq(static_cast<size_t>(x.numel()));
    cq::dequantize_per_axis_ref(want.data(), outer, C, inner, sc.data(), zp.data(), dq.data());
    bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (!same_bits(y.data<float>()[i], dq[static_cast<size_t>(i)])) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("Quantize then Dequantize equals fake_quantize_ref", "[quant]") {
  Tensor x = stress_values(300001, 42, 0.03125f, 8.0f);
  const float s = 0.03125f;
  const int32_t z = 7;
  Tensor q = run_node("QuantizeLinear", {x, Tensor::scalar<float>(s), Tensor::scalar<int8_t>(7)}, 1)[0];
  Tensor y = run_node("DequantizeLinear", {q, Tensor::scalar<float>(s), Tensor::scalar<int8_t>(7)}, 1)[0];
  int64_t bad = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!same_bits(y.data<float>()[i], cq::fake_quantize_ref(x.data<float>()[i], s, z, -128, 127))) ++bad;
  CHECK(bad == 0);
}

TEST_CASE("DequantizeLinear int32 and uint16 inputs", "[quant]") {
  Tensor q = Tensor::from<int32_t>({4}, {std::numeric_limits<int32_t>::min(), -5, 0, 123456789});
  Tensor y = run_node("DequantizeLinear", {q, Tensor::scalar<float>(0.5f)}, 1)[0];
  for (int64_t i = 0; i < 4; ++i) CHECK(same_bits(y.data<float>()[i], cq::dequantize_ref(q.data<int32_t>()[i], 0.5f, 0)));
  Tensor q16 = Tensor::from<uint16_t>({3}, {0, 32768, 65535});
  Tensor y16 = run_node("DequantizeLinear", {q16, Tensor::scalar<float>(0.25f), Tensor::scalar<uint16_t>(32768)}, 1)[0];
  CHECK(values_of<float>(y16) == std::vector<float>{-8192.0f, 0.0f, 8191.75f});
}

TEST_CASE("QuantizeLinear / DequantizeLinear blocked (opset 21)", "[quant]") {
  // x [3, 10, 4], axis 1, block 3 -> scale [3, 4, 4]; and x [5, 11] axis 1 block 4 (inner 1).
  struct Case {
    Shape shape;
    int64_t axis, block;
  };
  const Case cases[] = {{{3, 10, 4}, 1, 3}, {{5, 11}, 1, 4}, {{7, 5}, 0, 2}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    INFO(shape_str(c.shape) << " axis " << c.axis << " block " << c.block);
    const int axis = static_cast<int>(c.axis);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= c.shape[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis) + 1; d < c.shape.size(); ++d) inner *= c.shape[d];
    const int64_t C = c.shape[static_cast<size_t>(axis)];
    Shape ps = c.shape;
    ps[static_cast<size_t>(axis)] = (C + c.block - 1) / c.block;
    Tensor st = test::random_tensor(ps, seed++, 0.02f, 0.3f);
    std::vector<int32_t> zp(static_cast<size_t>(shape_numel(ps)));
    for (size_t i = 0; i < zp.size(); ++i) zp[i] = static_cast<int32_t>(i * 7 % 11) - 5;
    Tensor x = test::random_tensor(c.shape, seed++, -20.0f, 20.0f);
    std::vector<ir::Attribute> attrs = {ir::Attribute::make_int("axis", c.axis), ir::Attribute::make_int("block_size", c.block)};
    Tensor zt = zp_tensor(DType::Int8, zp, ps);
    Tensor q = run_node("QuantizeLinear", {x, st, zt}, 1, attrs)[0];
    std::vector<int32_t> want(static_cast<size_t>(x.numel()));
    cq::quantize_blocked_ref(x.data<float>(), outer, C, inner, c.block, st.data<float>(), zp.data(), -128, 127, want.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (elem_int(q, i) != want[static_cast<size_t>(i)]) ++bad;
    CHECK(bad == 0);
    Tensor y = run_node("DequantizeLinear", {q, st, zt}, 1, attrs)[0];
    std::vector<float> dq(static_cast<size_t>(x.numel()));
    cq::dequantize_blocked_ref(want.data(), outer, C, inner, c.block, st.data<float>(), zp.data(), dq.data());
    bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (!same_bits(y.data<float>()[i], dq[static_cast<size_t>(i)])) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("QuantizeLinear / DequantizeLinear int4 and uint4", "[quant]") {
  Tensor x = Tensor::from<float>({7}, {-9.0f, -1.5f, -0.5f, 0.5f, 2.5f, 7.0f, 100.0f});
  Tensor q = run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f), pack4(DType::Int4, {0}, {})}, 1)[0];
  REQUIRE(q.dtype() == DType::Int4);
  std::vector<int32_t> got;
  for (int64_t i = 0; i < 7; ++i) got.push_back(elem_int(q, i));
  CHECK(got == std::vector<int32_t>{-8, -2, 0, 0, 2, 7, 7});
  Tensor y = run_node("DequantizeLinear", {q, Tensor::scalar<float>(0.5f), pack4(DType::Int4, {1}, {})}, 1)[0];
  CHECK(values_of<float>(y) == std::vector<float>{-4.5f, -1.5f, -0.5f, -0.5f, 0.5f, 3.0f, 3.0f});
  Tensor qu = run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f), pack4(DType::UInt4, {3}, {})}, 1)[0];
  REQUIRE(qu.dtype() == DType::UInt4);
  got.clear();
  for (int64_t i = 0; i < 7; ++i) got.push_back(elem_int(qu, i));
  CHECK(got == std::vector<int32_t>{0, 1, 3, 3, 5, 10, 15});
  // output_dtype without a zero point.
  Tensor qo = run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f)}, 1,
                       {ir::Attribute::make_int("output_dtype", static_cast<int64_t>(DType::Int8))})[0];
  CHECK(qo.dtype() == DType::Int8);
  CHECK(values_of<int8_t>(qo) == std::vector<int8_t>{-9, -2, 0, 0, 2, 7, 100});
}

TEST_CASE("DequantizeLinear with a float16 scale gives float16 (opset 19)", "[quant]") {
  Tensor q = Tensor::from<int8_t>({3}, {-4, 0, 6});
  Tensor s(DType::Float16, {});
  s.data<Float16>()[0] = to_half(0.5f);
  Tensor y = run_node("DequantizeLinear", {q, s}, 1, {}, 19)[0];
  REQUIRE(y.dtype() == DType::Float16);
  CHECK(y.get_double(0) == -2.0);
  CHECK(y.get_double(2) == 3.0);
}

TEST_CASE("QuantizeLinear / DequantizeLinear reject bad parameters", "[quant][negative]") {
  Tensor x = test::random_tensor({2, 3}, 1);
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::scalar<float>(0.0f)}, 1), Error);
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::scalar<float>(-0.5f)}, 1), Error);
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::scalar<float>(std::nanf(""))}, 1), Error);
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({3}, {0.1f, 0.0f, 0.2f}), Tensor::from<uint8_t>({3}, {0, 0, 0})},
                           1, {ir::Attribute::make_int("axis", 1)}),
                  Error);
  CHECK_THROWS_AS(run_node("DequantizeLinear", {Tensor::from<int8_t>({2}, {1, 2}), Tensor::scalar<float>(0.0f)}, 1), Error);
  // Zero point type differs from the quantized input.
  CHECK_THROWS_AS(run_node("DequantizeLinear", {Tensor::from<int8_t>({2}, {1, 2}), Tensor::scalar<float>(1.0f), Tensor::scalar<uint8_t>(3)}, 1),
                  Error);
  // output_dtype disagrees with the zero point.
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::scalar<float>(1.0f), Tensor::scalar<uint8_t>(3)}, 1,
                           {ir::Attribute::make_int("output_dtype", static_cast<int64_t>(DType::Int8))}),
                  Error);
  // Per-axis scale of the wrong length, and zero point shape different from the scale's.
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({2}, {0.1f, 0.2f})}, 1, {ir::Attribute::make_int("axis", 1)}),
                  Error);
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f}), Tensor::scalar<uint8_t>(1)}, 1,
                           {ir::Attribute::make_int("axis", 1)}),
                  Error);
  // Per-axis scales before opset 13.
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f})}, 1, {}, 10), Error);
  // Blocked scale with the wrong block count.
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({2, 1}, {0.1f, 0.2f})}, 1,
                           {ir::Attribute::make_int("axis", 1), ir::Attribute::make_int("block_size", 2)}),
                  Error);
  // Axis out of range.
  CHECK_THROWS_AS(run_node("QuantizeLinear", {x, Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f})}, 1, {ir::Attribute::make_int("axis", 2)}),
                  Error);
}

TEST_CASE("DynamicQuantizeLinear follows the ONNX formula", "[quant]") {
  auto check = [](const Tensor& x) {
    auto outs = run_node("DynamicQuantizeLinear", {x}, 3, {}, 11);
    float mn = 0.0f, mx = 0.0f;
    for (int64_t i = 0; i < x.numel(); ++i) {
      mn = std::min(mn, x.data<float>()[i]);
      mx = std::max(mx, x.data<float>()[i]);
    }
    const float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
    const int32_t zp = static_cast<int32_t>(cq::round_half_to_even(std::clamp(0.0f - mn / scale, 0.0f, 255.0f)));
    REQUIRE(outs[1].data<float>()[0] == scale);
    REQUIRE(outs[2].data<uint8_t>()[0] == zp);
    REQUIRE(outs[0].dtype() == DType::UInt8);
    int64_t bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (outs[0].data<uint8_t>()[i] != cq::quantize_ref(x.data<float>()[i], scale, zp, 0, 255)) ++bad;
    CHECK(bad == 0);
  };
  check(test::random_tensor({3, 77, 5}, 11, -2.0f, 5.0f));
  check(test::random_tensor({100003}, 12, 0.5f, 3.0f));    // all positive: min is 0
  check(test::random_tensor({31}, 13, -4.0f, -1.0f));       // all negative: max is 0
  check(Tensor::zeros(DType::Float32, {4}));                // zero range: scale 1
}

// ------------------------------------------------------------------------------------------------
// Integer matrix products

namespace {

template <typename T>
Tensor random_int(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  Tensor t(dtype_of<T>, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(d(rng));
  return t;
}

// Naive 2-D (batched, same batch shape) integer matmul with per-row a / per-column b zero points.
std::vector<int32_t> naive_matmul(const Tensor& a, const std::vector<int32_t>& azp, const Tensor& b,
                                  const std::vector<int32_t>& bzp, int64_t batch, int64_t M, int64_t K, int64_t N,
                                  bool b_broadcast) {
  std::vector<int32_t> out(static_cast<size_t>(batch * M * N));
  for (int64_t bt = 0; bt < batch; ++bt)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t av = a.get_int64((bt * M + m) * K + k) - azp[azp.size() == 1 ? 0 : static_cast<size_t>(m)];
          const int64_t bv = b.get_int64(((b_broadcast ? 0 : bt) * K + k) * N + n) - bzp[bzp.size() == 1 ? 0 : static_cast<size_t>(n)];
          acc += av * bv;
        }
        out[static_cast<size_t>((bt * M + m) * N + n)] = static_cast<int32_t>(acc);
      }
  return out;
}

}  // namespace

TEST_CASE("MatMulInteger matches a naive integer reference", "[quant][gemm]") {
  SECTION("uint8 x int8, per-row and per-column zero points, batched with broadcast B") {
    Tensor a = random_int<uint8_t>({3, 5, 37}, 1);
    Tensor b = random_int<int8_t>({37, 9}, 2);
    std::vector<int32_t> azp = {3, 200, 128, 0, 255}, bzp(9);
    for (int i = 0; i < 9; ++i) bzp[static_cast<size_t>(i)] = i * 13 - 60;
    Tensor y = run_node("MatMulInteger", {a, b, zp_tensor(DType::UInt8, azp, {5}), zp_tensor(DType::Int8, bzp, {9})}, 1, {}, 10)[0];
    REQUIRE(y.dtype() == DType::Int32);
    REQUIRE(y.shape() == Shape{3, 5, 9});
    CHECK(values_of<int32_t>(y) == naive_matmul(a, azp, b, bzp, 3, 5, 37, 9, true));
  }
  SECTION("int8 x uint8 without zero points, 1-D A") {
    Tensor a = random_int<int8_t>({11}, 3);
    Tensor b = random_int<uint8_t>({11, 4}, 4);
    Tensor y = run_node("MatMulInteger", {a, b}, 1, {}, 10)[0];
    REQUIRE(y.shape() == Shape{4});
    CHECK(values_of<int32_t>(y) == naive_matmul(a.reshaped({1, 11}), {0}, b, {0}, 1, 1, 11, 4, false));
  }
  SECTION("long, extreme sums beyond float32's exact integer range stay exact") {
    // |acc| up to 2000 * 255 * 128 > 2^24: a single float32 GEMM would round.
    Tensor a(DType::UInt8, {3, 2000});
    Tensor b(DType::Int8, {2000, 2});
    std::mt19937 rng(9);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 2 ? 255 : 254);
    for (int64_t i = 0; i < b.numel(); ++i) b.data<int8_t>()[i] = static_cast<int8_t>(rng() % 3 ? -128 : -127);
    Tensor y = run_node("MatMulInteger", {a, b}, 1, {}, 10)[0];
    std::vector<int32_t> want = naive_matmul(a, {0}, b, {0}, 1, 3, 2000, 2, false);
    CHECK(std::abs(want[0]) > (1 << 24));
    CHECK(values_of<int32_t>(y) == want);
  }
  SECTION("zero point type mismatch is an error") {
    Tensor a = random_int<uint8_t>({2, 3}, 5);
    Tensor b = random_int<uint8_t>({3, 2}, 6);
    CHECK_THROWS_AS(run_node("MatMulInteger", {a, b, Tensor::scalar<int8_t>(1)}, 1, {}, 10), Error);
  }
}

TEST_CASE("QLinearMatMul matches integer accumulation + requantize_ref", "[quant][gemm]") {
  struct Case {
    DType at, bt, yt;
    Shape as, bs;
    bool per_col;
  };
  const Case cases[] = {{DType::UInt8, DType::UInt8, DType::UInt8, {7, 33}, {33, 5}, false},
                        {DType::Int8, DType::Int8, DType::Int8, {2, 3, 17, 29}, {2, 3, 29, 6}, true},
                        {DType::UInt8, DType::Int8, DType::Int8, {4, 64}, {64, 13}, true}};
  uint32_t seed = 50;
  for (const Case& c : cases) {
    INFO(shape_str(c.as) << " x " << shape_str(c.bs));
    Tensor a = c.at == DType::UInt8 ? random_int<uint8_t>(c.as, seed++) : random_int<int8_t>(c.as, seed++);
    Tensor b = c.bt == DType::UInt8 ? random_int<uint8_t>(c.bs, seed++) : random_int<int8_t>(c.bs, seed++);
    const int64_t M = c.as[c.as.size() - 2], K = c.as.back(), N = c.bs.back();
    const int64_t batch = shape_numel(c.as) / (M * K);
    const float a_s = 0.0173f, y_s = 0.91f;
    std::vector<float> b_s(c.per_col ? static_cast<size_t>(N) : 1);
    for (size_t i = 0; i < b_s.size(); ++i) b_s[i] = 0.004f + 0.0011f * static_cast<float>(i);
    const int32_t azp = c.at == DType::UInt8 ? 131 : -7;
    std::vector<int32_t> bzp(b_s.size());
    for (size_t i = 0; i < bzp.size(); ++i) bzp[i] = (c.bt == DType::UInt8 ? 120 : -3) + static_cast<int32_t>(i % 5);
    const int32_t yzp = c.yt == DType::UInt8 ? 128 : 3;
    const Shape ps = c.per_col ? Shape{N} : Shape{};
    Tensor y = run_node("QLinearMatMul",
                        {a, Tensor::scalar<float>(a_s), zp_tensor(c.at, {azp}, {}), b, Tensor::from<float>(ps, b_s),
                         zp_tensor(c.bt, bzp, ps), Tensor::scalar<float>(y_s), zp_tensor(c.yt, {yzp}, {})},
                        1, {}, 10)[0];
    REQUIRE(y.dtype() == c.yt);
    std::vector<int32_t> acc = naive_matmul(a, {azp}, b, bzp, batch, M, K, N, false);
    const cq::QRange r = range_of(c.yt);
    int64_t bad = 0;
    for (int64_t bt = 0; bt < batch; ++bt)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const int64_t i = (bt * M + m) * N + n;
          const float mult = cq::requant_multiplier_ref(a_s, b_s[b_s.size() == 1 ? 0 : static_cast<size_t>(n)], y_s);
          if (elem_int(y, i) != cq::requantize_ref(acc[static_cast<size_t>(i)], mult, yzp, r.qmin, r.qmax)) ++bad;
        }
    CHECK(bad == 0);
  }
}

namespace {

struct ConvCase {
  Shape x, w;
  std::vector<int64_t> strides, pads, dils;
  int64_t group;
};

// Naive direct integer convolution (any spatial rank up to 3) -> int32 accumulators [N, M, out...].
std::vector<int32_t> naive_conv(const Tensor& x, int32_t xzp, const Tensor& w, const std::vector<int32_t>& wzp,
                                const ConvCase& c, Shape& out_shape) {
  const int ns = static_cast<int>(c.x.size()) - 2;
  const int64_t N = c.x[0], C = c.x[1], M = c.w[0], G = c.group, Cg = C / G, Mg = M / G;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, o[3] = {1, 1, 1}, st[3] = {1, 1, 1}, dl[3] = {1, 1, 1}, pd[3] = {0, 0, 0};
  out_shape = {N, M};
  for (int d = 0; d < ns; ++d) {
    const int j = 3 - ns + d;
    in[j] = c.x[static_cast<size_t>(2 + d)];
    k[j] = c.w[static_cast<size_t>(2 + d)];
    st[j] = c.strides[static_cast<size_t>(d)];
    dl[j] = c.dils[static_cast<size_t>(d)];
    pd[j] = c.pads[static_cast<size_t>(d)];
    o[j] = (in[j] + c.pads[static_cast<size_t>(d)] + c.pads[static_cast<size_t>(d + ns)] - (k[j] - 1) * dl[j] - 1) / st[j] + 1;
    out_shape.push_back(o[j]);
  }
  std::vector<int32_t> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t a = 0; a < o[0]; ++a)
        for (int64_t b = 0; b < o[1]; ++b)
          for (int64_t cc = 0; cc < o[2]; ++cc) {
            int64_t acc = 0;
            const int64_t g = m / Mg;
            for (int64_t ci = 0; ci < Cg; ++ci)
              for (int64_t ka = 0; ka < k[0]; ++ka)
                for (int64_t kb = 0; kb < k[1]; ++kb)
                  for (int64_t kc = 0; kc < k[2]; ++kc) {
                    const int64_t ia = a * st[0] - pd[0] + ka * dl[0], ib = b * st[1] - pd[1] + kb * dl[1],
                                  ic = cc * st[2] - pd[2] + kc * dl[2];
                    if (ia < 0 || ia >= in[0] || ib < 0 || ib >= in[1] || ic < 0 || ic >= in[2]) continue;
                    const int64_t xi = (((n * C + g * Cg + ci) * in[0] + ia) * in[1] + ib) * in[2] + ic;
                    const int64_t wi = (((m * Cg + ci) * k[0] + ka) * k[1] + kb) * k[2] + kc;
                    acc += (x.get_int64(xi) - xzp) * (w.get_int64(wi) - wzp[wzp.size() == 1 ? 0 : static_cast<size_t>(m)]);
                  }
            out.push_back(static_cast<int32_t>(acc));
          }
  return out;
}

std::vector<ir::Attribute> conv_attrs(const ConvCase& c) {
  return {ir::Attribute::make_ints("strides", c.strides), ir::Attribute::make_ints("pads", c.pads),
          ir::Attribute::make_ints("dilations", c.dils), ir::Attribute::make_int("group", c.group)};
}

const ConvCase kConvCases[] = {
    {{2, 3, 9, 11}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
    {{1, 6, 13, 7}, {6, 2, 3, 2}, {2, 1}, {1, 0, 2, 1}, {1, 2}, 3},
    {{1, 4, 17}, {5, 4, 4}, {3}, {2, 1}, {2}, 1},
    {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1, 1, 0, 0}, {2, 1, 1}, 1},
    {{3, 8, 6, 6}, {8, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 8},  // depthwise
    {{1, 5, 4, 3}, {7, 5, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},  // 1x1
};

}  // namespace

TEST_CASE("ConvInteger matches a naive integer convolution", "[quant][conv]") {
  uint32_t seed = 900;
  for (const ConvCase& c : kConvCases) {
    INFO(shape_str(c.x) << " * " << shape_str(c.w) << " group " << c.group);
    Tensor x = random_int<uint8_t>(c.x, seed++);
    Tensor w = random_int<uint8_t>(c.w, seed++);
    const int32_t xzp = 77;
    std::vector<int32_t> wzp(static_cast<size_t>(c.w[0]));
    for (size_t i = 0; i < wzp.size(); ++i) wzp[i] = 100 + static_cast<int32_t>(i) * 9;
    Tensor y = run_node("ConvInteger", {x, w, Tensor::scalar<uint8_t>(77), zp_tensor(DType::UInt8, wzp, {c.w[0]})}, 1,
                        conv_attrs(c), 10)[0];
    Shape out_shape;
    std::vector<int32_t> want = naive_conv(x, xzp, w, wzp, c, out_shape);
    REQUIRE(y.dtype() == DType::Int32);
    REQUIRE(y.shape() == out_shape);
    CHECK(values_of<int32_t>(y) == want);
  }
}

TEST_CASE("QLinearConv matches integer accumulation + requantize_ref", "[quant][conv]") {
  uint32_t seed = 1900;
  for (const ConvCase& c : kConvCases) {
    for (bool per_channel : {false, true}) {
      INFO(shape_str(c.x) << " * " << shape_str(c.w) << " group " << c.group << " per-channel " << per_channel);
      Tensor x = random_int<int8_t>(c.x, seed++);
      Tensor w = random_int<int8_t>(c.w, seed++);
      const int64_t M = c.w[0];
      const float xs = 0.021f, ys = 0.37f;
      std::vector<float> ws(per_channel ? static_cast<size_t>(M) : 1);
      for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.003f + 0.0007f * static_cast<float>(i);
      std::vector<int32_t> wzp(ws.size(), 0);
      std::vector<int32_t> bias(static_cast<size_t>(M));
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<int32_t>(i * 311) - 500;
      const Shape ps = per_channel ? Shape{M} : Shape{};
      Tensor y = run_node("QLinearConv",
                          {x, Tensor::scalar<float>(xs), Tensor::scalar<int8_t>(-5), w, Tensor::from<float>(ps, ws),
                           zp_tensor(DType::Int8, wzp, ps), Tensor::scalar<float>(ys), Tensor::scalar<int8_t>(9),
                           Tensor::from<int32_t>({M}, bias)},
                          1, conv_attrs(c), 10)[0];
      Shape out_shape;
      std::vector<int32_t> acc = naive_conv(x, -5, w, wzp, c, out_shape);
      REQUIRE(y.dtype() == DType::Int8);
      REQUIRE(y.shape() == out_shape);
      const int64_t P = shape_numel(out_shape) / (out_shape[0] * M);
      int64_t bad = 0;
      for (int64_t i = 0; i < y.numel(); ++i) {
        const int64_t m = (i / P) % M;
        const float mult = cq::requant_multiplier_ref(xs, ws[ws.size() == 1 ? 0 : static_cast<size_t>(m)], ys);
        if (elem_int(y, i) != cq::requantize_ref(acc[static_cast<size_t>(i)] + bias[static_cast<size_t>(m)], mult, 9, -128, 127))
          ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("QLinearConv auto_pad SAME_UPPER and SAME_LOWER", "[quant][conv]") {
  Tensor x = random_int<uint8_t>({1, 2, 7, 8}, 5);
  Tensor w = random_int<uint8_t>({3, 2, 4, 3}, 6);
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER"}) {
    INFO(mode);
    std::vector<ir::Attribute> attrs = {ir::Attribute::make_string("auto_pad", mode), ir::Attribute::make_ints("strides", {2, 2})};
    Tensor y = run_node("ConvInteger", {x, w, Tensor::scalar<uint8_t>(128), Tensor::scalar<uint8_t>(128)}, 1, attrs, 10)[0];
    REQUIRE(y.shape() == Shape{1, 3, 4, 4});
    // Height: out 4, total pad (4-1)*2+4-7 = 3; width: (4-1)*2+3-8 = 1.
    const bool upper = std::string(mode) == "SAME_UPPER";
    ConvCase c{{1, 2, 7, 8}, {3, 2, 4, 3}, {2, 2}, {upper ? 1 : 2, upper ? 0 : 1, upper ? 2 : 1, upper ? 1 : 0}, {1, 1}, 1};
    Shape out_shape;
    CHECK(values_of<int32_t>(y) == naive_conv(x, 128, w, {128}, c, out_shape));
    CHECK(out_shape == y.shape());
  }
}

TEST_CASE("Integer conv/matmul reject bad inputs", "[quant][negative]") {
  Tensor x = random_int<uint8_t>({1, 2, 5, 5}, 1);
  Tensor w = random_int<uint8_t>({3, 2, 3, 3}, 2);
  // x_zero_point type differs from x.
  CHECK_THROWS_AS(run_node("ConvInteger", {x, w, Tensor::scalar<int8_t>(1)}, 1, {}, 10), Error);
  // Channel mismatch.
  CHECK_THROWS_AS(run_node("ConvInteger", {x, random_int<uint8_t>({3, 4, 3, 3}, 3)}, 1, {}, 10), Error);
  // Zero and negative scales.
  auto qconv = [&](float xs, float ws, float ys, const Tensor& bias) {
    return run_node("QLinearConv",
                    {x, Tensor::scalar<float>(xs), Tensor::scalar<uint8_t>(0), w, Tensor::scalar<float>(ws),
                     Tensor::scalar<uint8_t>(0), Tensor::scalar<float>(ys), Tensor::scalar<uint8_t>(0), bias},
                    1, {}, 10);
  };
  CHECK_NOTHROW(qconv(0.1f, 0.1f, 0.1f, Tensor()));
  CHECK_THROWS_AS(qconv(0.0f, 0.1f, 0.1f, Tensor()), Error);
  CHECK_THROWS_AS(qconv(0.1f, -0.1f, 0.1f, Tensor()), Error);
  CHECK_THROWS_AS(qconv(0.1f, 0.1f, 0.0f, Tensor()), Error);
  // Bias must be int32 with one value per output channel.
  CHECK_THROWS_AS(qconv(0.1f, 0.1f, 0.1f, Tensor::from<float>({3}, {1, 2, 3})), Error);
  CHECK_THROWS_AS(qconv(0.1f, 0.1f, 0.1f, Tensor::from<int32_t>({2}, {1, 2})), Error);
  // QLinearMatMul: inner dimension mismatch, per-column scale of the wrong length.
  Tensor a = random_int<uint8_t>({2, 3}, 4), b = random_int<uint8_t>({4, 2}, 5);
  auto qmm = [&](const Tensor& bb, const Tensor& bs) {
    return run_node("QLinearMatMul", {a, Tensor::scalar<float>(0.1f), Tensor::scalar<uint8_t>(0), bb, bs,
                                      Tensor::scalar<uint8_t>(0), Tensor::scalar<float>(0.1f), Tensor::scalar<uint8_t>(0)},
                    1, {}, 10);
  };
  CHECK_THROWS_AS(qmm(b, Tensor::scalar<float>(0.1f)), Error);
  CHECK_THROWS_AS(qmm(random_int<uint8_t>({3, 2}, 6), Tensor::from<float>({3}, {0.1f, 0.1f, 0.1f})), Error);
  CHECK_NOTHROW(qmm(random_int<uint8_t>({3, 2}, 6), Tensor::from<float>({2}, {0.1f, 0.2f})));
}
