// Backward kernels: to be written.
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

void register_norm_grads(GradRegistry&) {}

}  // namespace mpq::train::grads
