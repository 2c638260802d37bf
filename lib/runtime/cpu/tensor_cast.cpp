// Cast and CastLike between every numeric type, bool and string.
//   float -> integer truncates toward zero (values outside the target range behave as on x86:
//   through a 32/64-bit conversion that saturates to the minimum, then wrap-around);
//   float -> float16/bfloat16 rounds to nearest even, overflow gives inf;
//   numbers -> string print the shortest text that reads back to the same value ("0.9767611");
//   string -> numbers parse with strtod/strtoll ("NaN", "INF", "-INF" included).
// Float8 and 4-bit types are not supported.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MPQ_CAST_F16C 1
#endif

#include "runtime/cpu/register_all.h"
#include "runtime/cpu/shape_internal.h"
#include "runtime/low_precision.h"

namespace mpq::rt::cpu {

namespace {

#if defined(MPQ_CAST_F16C)
// Hardware float <-> half (F16C): IEEE round-to-nearest-even, overflow to inf, NaN quieted with
// its top payload bits kept, i.e. bit-identical to float_to_half_bits / half_bits_to_float.
bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return ok;
}
__attribute__((target("avx,f16c"))) void float_to_half_f16c(const float* src, Float16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i].bits = float_to_half_bits(src[i]);
}
__attribute__((target("avx,f16c"))) void half_to_float_f16c(const Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}
#endif

void float_to_half_fast(const float* src, Float16* dst, int64_t n) {
#if defined(MPQ_CAST_F16C)
  if (have_f16c()) return float_to_half_f16c(src, dst, n);
#endif
  float_to_half(src, dst, n);
}

void half_to_float_fast(const Float16* src, float* dst, int64_t n) {
#if defined(MPQ_CAST_F16C)
  if (have_f16c()) return half_to_float_f16c(src, dst, n);
#endif
  half_to_float(src, dst, n);
}

template <typename F>
decltype(auto) visit_castable(const KernelContext& ctx, DType t, F&& f) {
  switch (t) {
    case DType::Float16: return f(TypeTag<Float16>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    case DType::Bool: return f(TypeTag<bool>{});
    case DType::Float32:
    case DType::Float64:
    case DType::Int8:
    case DType::UInt8:
    case DType::Int16:
    case DType::UInt16:
    case DType::Int32:
    case DType::UInt32:
    case DType::Int64:
    case DType::UInt64: return visit_arith(t, std::forward<F>(f));
    default: ctx.fail_unsupported("Cast from or to {} is not supported", dtype_name(t));
  }
}

template <typename To>
To float_to_int(double v) {
  if constexpr (std::is_same_v<To, uint64_t>) {
    if (std::isnan(v)) return 0x8000000000000000ull;
    if (v >= 9223372036854775808.0) {
      if (v >= 18446744073709551616.0) return 0x8000000000000000ull;
      return static_cast<uint64_t>(v - 9223372036854775808.0) + 0x8000000000000000ull;
    }
    if (v <= -9223372036854775808.0) return 0x8000000000000000ull;
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else if constexpr (sizeof(To) == 8 || std::is_same_v<To, uint32_t>) {
    if (std::isnan(v) || v >= 9223372036854775808.0 || v < -9223372036854775808.0)
      return static_cast<To>(std::numeric_limits<int64_t>::min());
    return static_cast<To>(static_cast<int64_t>(v));
  } else {
    if (std::isnan(v) || v >= 2147483648.0 || v < -2147483648.0) return static_cast<To>(std::numeric_limits<int32_t>::min());
    return static_cast<To>(static_cast<int32_t>(v));
  }
}

template <typename To, typename From>
To cast_value(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Float16> || std::is_same_v<From, BFloat16>) {
    return cast_value<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<From, bool>) {
    return cast_value<To>(static_cast<uint8_t>(v ? 1 : 0));
  } else if constexpr (std::is_same_v<To, Float16>) {
    return to_half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return to_bf16(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return float_to_int<To>(static_cast<double>(v));
  } else {
    return static_cast<To>(v);
  }
}

template <typename From>
std::string to_text(From v) {
  if constexpr (std::is_same_v<From, Float16> || std::is_same_v<From, BFloat16>) {
    return fmt::format("{}", to_float(v));
  } else if constexpr (std::is_same_v<From, bool>) {
    return v ? "1" : "0";
  } else if constexpr (std::is_same_v<From, int8_t> || std::is_same_v<From, uint8_t>) {
    return fmt::format("{}", static_cast<int>(v));
  } else {
    return fmt::format("{}", v);
  }
}

template <typename To>
To from_text(const KernelContext& ctx, const std::string& s) {
  const char* b = s.c_str();
  char* end = nullptr;
  if constexpr (std::is_same_v<To, bool>) {
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    double v = std::strtod(b, &end);
    if (end == b) ctx.fail("cannot parse '{}' as bool", s);
    return v != 0.0;
  } else if constexpr (std::is_same_v<To, float> || std::is_same_v<To, Float16> || std::is_same_v<To, BFloat16>) {
    float v = std::strtof(b, &end);
    if (end == b) ctx.fail("cannot parse '{}' as a number", s);
    return cast_value<To>(v);
  } else if constexpr (std::is_same_v<To, double>) {
    double v = std::strtod(b, &end);
    if (end == b) ctx.fail("cannot parse '{}' as a number", s);
    return v;
  } else if constexpr (std::is_signed_v<To>) {
    long long v = std::strtoll(b, &end, 10);
    if (end == b) ctx.fail("cannot parse '{}' as an integer", s);
    if (*end == '.' || *end == 'e' || *end == 'E') return cast_value<To>(std::strtod(b, nullptr));
    return static_cast<To>(v);
  } else {
    unsigned long long v = std::strtoull(b, &end, 10);
    if (end == b) ctx.fail("cannot parse '{}' as an integer", s);
    if (*end == '.' || *end == 'e' || *end == 'E') return cast_value<To>(std::strtod(b, nullptr));
    return static_cast<To>(v);
  }
}

Tensor cast_tensor(KernelContext& ctx, const Tensor& x, DType to) {
  if (x.dtype() == to) return x;
  const int64_t n = x.numel();
  ThreadPool& pool = ctx.pool();
  constexpr int64_t kGrain = 32768;
  if (to == DType::String) {
    Tensor out(DType::String, x.shape());
    auto& dst = out.strings();
    visit_castable(ctx, x.dtype(), [&](auto tag) {
      using From = typename decltype(tag)::type;
      const From* src = x.data<From>();
      for (int64_t i = 0; i < n; ++i) dst[static_cast<size_t>(i)] = to_text(src[i]);
    });
    return out;
  }
  Tensor out(to, x.shape());
  if (x.dtype() == DType::String) {
    const auto& src = x.strings();
    visit_castable(ctx, to, [&](auto tag) {
      using To = typename decltype(tag)::type;
      To* dst = out.data<To>();
      for (int64_t i = 0; i < n; ++i) dst[i] = from_text<To>(ctx, src[static_cast<size_t>(i)]);
    });
    return out;
  }
  // Bulk paths for the conversions the FP16/BF16 pipeline inserts.
  if (x.dtype() == DType::Float32 && to == DType::Float16) {
    pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { float_to_half_fast(x.data<float>() + lo, out.data<Float16>() + lo, hi - lo); });
    return out;
  }
  if (x.dtype() == DType::Float16 && to == DType::Float32) {
    pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { half_to_float_fast(x.data<Float16>() + lo, out.data<float>() + lo, hi - lo); });
    return out;
  }
  if (x.dtype() == DType::Float32 && to == DType::BFloat16) {
    pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { float_to_bf16(x.data<float>() + lo, out.data<BFloat16>() + lo, hi - lo); });
    return out;
  }
  if (x.dtype() == DType::BFloat16 && to == DType::Float32) {
    pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) { bf16_to_float(x.data<BFloat16>() + lo, out.data<float>() + lo, hi - lo); });
    return out;
  }
  visit_castable(ctx, x.dtype(), [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    const From* src = x.data<From>();
    visit_castable(ctx, to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* dst = out.data<To>();
      pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) dst[i] = cast_value<To>(src[i]);
      });
    });
  });
  return out;
}

DType cast_target(const KernelContext& ctx) {
  const ir::Attribute* a = ctx.node().attr("to");
  if (!a) ctx.fail("attribute 'to' is required");
  if (a->type == ir::AttrType::String) {
    // Cast-1 names the type ("FLOAT", "INT64", ...).
    static const std::pair<const char*, DType> names[] = {
        {"FLOAT", DType::Float32}, {"UINT8", DType::UInt8},     {"INT8", DType::Int8},     {"UINT16", DType::UInt16},
        {"INT16", DType::Int16},   {"INT32", DType::Int32},     {"INT64", DType::Int64},   {"STRING", DType::String},
        {"BOOL", DType::Bool},     {"FLOAT16", DType::Float16}, {"DOUBLE", DType::Float64}, {"UINT32", DType::UInt32},
        {"UINT64", DType::UInt64}, {"BFLOAT16", DType::BFloat16}};
    for (const auto& [name, t] : names)
      if (a->s == name) return t;
    ctx.fail("unknown type name '{}' in attribute 'to'", a->s);
  }
  if (a->i == 0 || !dtype_is_valid(static_cast<int32_t>(a->i))) ctx.fail("attribute 'to' = {} is not a valid element type", a->i);
  return static_cast<DType>(a->i);
}

void cast_kernel(KernelContext& ctx) { ctx.set_output(0, cast_tensor(ctx, ctx.input(0), cast_target(ctx))); }

void cast_like_kernel(KernelContext& ctx) { ctx.set_output(0, cast_tensor(ctx, ctx.input(0), ctx.input(1).dtype())); }

}  // namespace

void register_tensor_cast(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  // Cast reads and writes float16/bfloat16 itself (the executor must not round its float32 output).
  r.add_fn("", "Cast", 1, kMaxOpset, cpu, cast_kernel, true);
  r.add_fn("", "CastLike", 15, kMaxOpset, cpu, cast_like_kernel, true);
}

}  // namespace mpq::rt::cpu
