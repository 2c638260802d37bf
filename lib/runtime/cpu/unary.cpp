#include "runtime/cpu/common.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

void register_unary(OpRegistry&) {}

}  // namespace mpq::rt::cpu
