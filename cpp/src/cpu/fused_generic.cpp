// The fused kernels for generic (vector width 4); see fused_kernels.hpp.
#include "cpu/fused_kernels.hpp"

namespace rnncore::cpu {

FusedKernels fused_kernels_generic() {
  return {4, "generic", &Fused<4>::forward, &Fused<4>::workspace,
          &Fused<4>::pack_columns, &Fused<4>::matmul};
}

}  // namespace rnncore::cpu
