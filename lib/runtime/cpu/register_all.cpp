#include "runtime/cpu/register_all.h"

namespace mpq::rt {

void register_all(OpRegistry& r) {
  cpu::register_binary(r);
  cpu::register_unary(r);
  cpu::register_softmax(r);
  cpu::register_conv(r);
  cpu::register_matmul(r);
  cpu::register_mlp(r);
  cpu::register_pool(r);
  cpu::register_norm(r);
  cpu::register_reduce(r);
  cpu::register_shape_ops(r);
  cpu::register_tensor_ops(r);
  cpu::register_resize(r);
  cpu::register_quant(r);
  cpu::register_control_flow(r);
  cpu::register_rnn(r);
  cpu::register_fake_quant(r);
  cpu::register_layout_ops(r);
}

}  // namespace mpq::rt
