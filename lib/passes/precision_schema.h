#pragma once
// What ONNX's operator schemas (libonnx) allow for each input and output of an op: the type
// constraint parameter it belongs to ("T", "T1", ...) and whether float32/float16/bfloat16 are
// allowed. convert_precision uses it to know which inputs must share the node's precision, which
// stay as they are (Shape's input, Cast's input), and whether the low type is legal for the op at
// the model's opset, so the converted model always passes ONNX's type checks.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"

namespace mpq::passes::precision {

struct TypeParam {
  std::string name;  // constraint name ("T"), or a fixed type string ("tensor(float)")
  bool f32 = false, f16 = false, bf16 = false;
  bool variadic = false;
  std::vector<DType> allowed;  // tensor element types allowed (sequences and maps left out)
  bool allows(DType t) const;
};

struct OpSignature {
  bool known = false;         // false: no schema for this op/domain/opset in libonnx
  int64_t since_version = 0;  // version of the schema used
  std::vector<TypeParam> inputs, outputs;
  // Parameter of input/output i (a trailing variadic parameter repeats); nullptr past the end.
  const TypeParam* input(size_t i) const;
  const TypeParam* output(size_t i) const;
};

// Signature of `op` in `domain` for a model importing `opset` of that domain. For opsets newer than
// libonnx knows, the newest schema it has is used (type constraints only widen over versions).
const OpSignature& op_signature(const std::string& domain, const std::string& op, int64_t opset);

// Element types of every value of `graph` that can be told without running it: declared types,
// initializers, then per node (topological order) Cast/Constant/ConstantOfShape rules, schema type
// constraints shared with typed inputs, single-type constraints, and If/Loop/Scan body outputs.
// `outer` gives the types of enclosing graphs' values by name. Unknown values are absent.
using TypeMap = std::unordered_map<const ir::Value*, DType>;
using NameTypes = std::unordered_map<std::string, DType>;
TypeMap infer_elem_types(const ir::Model& model, const ir::Graph& graph, const NameTypes& outer);

}  // namespace mpq::passes::precision
