#pragma once
// The op policy of convert_precision, in the spirit of PyTorch autocast: which ops run in the low
// precision type (FP16 or BF16), which stay in FP32, and which follow their inputs. The table is
// data: `mpq convert --list-policy` prints it, and --keep-fp32 / --force-low override it per op
// type or per node name.
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace mpq::passes::precision {

enum class OpClass {
  Low,     // runs in the low precision type (tensor-core ops)
  Fp32,    // stays in FP32
  Follow,  // takes the precision of its inputs; mixed inputs take the widest
};
const char* op_class_name(OpClass c);

struct PolicyEntry {
  const char* op;    // ONNX op type (default domain)
  OpClass fp16;      // class when converting to FP16
  OpClass bf16;      // class when converting to BF16
  const char* why;   // one line: the reason for the class
};

// The whole table, in a stable order (for --list-policy and the docs).
const std::vector<PolicyEntry>& policy_table();
// Entry for a default-domain op type, or nullptr when the op is not listed.
const PolicyEntry* policy_entry(std::string_view op);
// Class of a node's op in `low` (Float16 or BFloat16) mode. Unlisted default-domain ops follow
// their inputs; ops of other domains (custom ops) stay in FP32.
OpClass policy_class(std::string_view domain, std::string_view op, DType low);

// Inputs that must stay FP32 whatever the node's precision: Resize roi/scales, Upsample scales,
// RoiAlign rois, Dropout ratio (ONNX Runtime reads them as float; converting them is the classic
// float16-converter bug). Returns true when input `index` of `op` is one of them.
bool input_stays_fp32(std::string_view op, size_t index);

// Ops whose output element type comes from an attribute or from an input of another type
// constraint (RandomNormalLike, EyeLike, Bernoulli, ...): every float input of these stays FP32 so
// the declared output type stays right.
bool inputs_pinned_fp32(std::string_view op);

// Default for --max-magnitude in FP16 mode, justified in docs/fp16.md and the CLI help:
// 65504 / 16 = 4094 rounded to 4096 (2^12) leaves four binades of headroom.
inline constexpr double kDefaultMaxMagnitude = 4096.0;

// Largest finite value of the low precision type.
double low_max(DType low);
// Short name: "fp16" / "bf16".
const char* low_suffix(DType low);

}  // namespace mpq::passes::precision
