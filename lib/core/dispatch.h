#pragma once
// Run a generic lambda with the C++ type of a runtime dtype:
//   visit_numeric(t.dtype(), [&](auto tag) { using T = typename decltype(tag)::type; ... });
#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace mpq {

template <typename T>
struct TypeTag {
  using type = T;
};

// Plain C++ arithmetic types (no half types, no bool).
template <typename F>
decltype(auto) visit_arith(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Int8: return f(TypeTag<int8_t>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
    case DType::Int16: return f(TypeTag<int16_t>{});
    case DType::UInt16: return f(TypeTag<uint16_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::UInt32: return f(TypeTag<uint32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::UInt64: return f(TypeTag<uint64_t>{});
    default: fail_unsupported("element type {} is not supported here", dtype_name(t));
  }
}

// Arithmetic types plus bool.
template <typename F>
decltype(auto) visit_arith_bool(DType t, F&& f) {
  if (t == DType::Bool) return f(TypeTag<bool>{});
  return visit_arith(t, std::forward<F>(f));
}

// Every fixed-size type whose bytes can be moved around without interpretation, keyed by width.
// Data-movement kernels (Transpose, Gather, Slice, Concat...) use this so they serve all types.
template <typename F>
decltype(auto) visit_by_width(DType t, F&& f) {
  switch (dtype_bits(t)) {
    case 8: return f(TypeTag<uint8_t>{});
    case 16: return f(TypeTag<uint16_t>{});
    case 32: return f(TypeTag<uint32_t>{});
    case 64: return f(TypeTag<uint64_t>{});
    default: fail_unsupported("element type {} is not supported by this operation", dtype_name(t));
  }
}

// Value conversions used by generic code (half types go through float).
template <typename To, typename From>
inline To convert_value(From v) {
  if constexpr (std::is_same_v<From, Float16> || std::is_same_v<From, BFloat16>) {
    return convert_value<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, Float16>) {
    return to_half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return to_bf16(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace mpq
