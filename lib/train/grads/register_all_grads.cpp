#include "train/grads/register_all_grads.h"

namespace mpq::train {

void register_all_grads(GradRegistry& r) {
  grads::register_binary_grads(r);
  grads::register_unary_grads(r);
  grads::register_softmax_grads(r);
  grads::register_conv_grads(r);
  grads::register_matmul_grads(r);
  grads::register_pool_grads(r);
  grads::register_norm_grads(r);
  grads::register_reduce_grads(r);
  grads::register_shape_grads(r);
  grads::register_tensor_grads(r);
  grads::register_resize_grads(r);
  grads::register_fake_quant_grads(r);
}

}  // namespace mpq::train
