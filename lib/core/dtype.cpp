#include "core/dtype.h"

namespace mpq {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  int bits;
};
constexpr DTypeInfo kTypes[] = {
    {DType::Undefined, "undefined", 0},   {DType::Float32, "float32", 32},
    {DType::UInt8, "uint8", 8},           {DType::Int8, "int8", 8},
    {DType::UInt16, "uint16", 16},        {DType::Int16, "int16", 16},
    {DType::Int32, "int32", 32},          {DType::Int64, "int64", 64},
    {DType::String, "string", 0},         {DType::Bool, "bool", 8},
    {DType::Float16, "float16", 16},      {DType::Float64, "float64", 64},
    {DType::UInt32, "uint32", 32},        {DType::UInt64, "uint64", 64},
    {DType::Complex64, "complex64", 64},  {DType::Complex128, "complex128", 128},
    {DType::BFloat16, "bfloat16", 16},    {DType::Float8E4M3FN, "float8e4m3fn", 8},
    {DType::Float8E4M3FNUZ, "float8e4m3fnuz", 8}, {DType::Float8E5M2, "float8e5m2", 8},
    {DType::Float8E5M2FNUZ, "float8e5m2fnuz", 8}, {DType::UInt4, "uint4", 4},
    {DType::Int4, "int4", 4},
};
const DTypeInfo* find(DType t) {
  for (const auto& info : kTypes)
    if (info.type == t) return &info;
  return nullptr;
}
}  // namespace

int dtype_bits(DType t) {
  const DTypeInfo* info = find(t);
  return info ? info->bits : 0;
}

size_t dtype_storage_bytes(DType t, int64_t n) {
  if (n <= 0) return 0;
  int bits = dtype_bits(t);
  return (static_cast<size_t>(n) * bits + 7) / 8;
}

const char* dtype_name(DType t) {
  const DTypeInfo* info = find(t);
  return info ? info->name : "invalid";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kTypes)
    if (name == info.name) return info.type;
  if (name == "float" || name == "fp32") return DType::Float32;
  if (name == "half" || name == "fp16") return DType::Float16;
  if (name == "double") return DType::Float64;
  if (name == "bf16") return DType::BFloat16;
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}

bool dtype_is_integer(DType t) {
  switch (t) {
    case DType::UInt8: case DType::Int8: case DType::UInt16: case DType::Int16:
    case DType::Int32: case DType::Int64: case DType::UInt32: case DType::UInt64:
    case DType::UInt4: case DType::Int4:
      return true;
    default:
      return false;
  }
}

bool dtype_is_valid(int32_t onnx_value) { return onnx_value >= 0 && onnx_value <= 22; }

}  // namespace mpq
