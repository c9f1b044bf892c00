// The fused kernels for avx512 (vector width 16); see fused_kernels.hpp.
#include "cpu/fused_kernels.hpp"

namespace rnncore::cpu {

FusedKernels fused_kernels_avx512() {
  return {16, "avx512", &Fused<16>::forward, &Fused<16>::workspace,
          &Fused<16>::pack_columns, &Fused<16>::matmul};
}

}  // namespace rnncore::cpu
