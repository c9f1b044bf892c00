// The fused kernels for avx2 (vector width 8); see fused_kernels.hpp.
#include "cpu/fused_kernels.hpp"

namespace rnncore::cpu {

FusedKernels fused_kernels_avx2() {
  return {8, "avx2", &Fused<8>::forward, &Fused<8>::workspace,
          &Fused<8>::pack_columns, &Fused<8>::matmul};
}

}  // namespace rnncore::cpu
