// gpu_ops_table(): the launchers of kernels/gpu_*.cu as an OpsTable (only their addresses are
// taken here, so g++ compiles it).
#include "kernels/ops_table.h"

namespace mpq::cuda {
const OpsTable& gpu_ops_table() {
  static const OpsTable table = [] {
    using namespace gpu;
#include "kernels/ops_table.inc"
  }();
  return table;
}
}  // namespace mpq::cuda
