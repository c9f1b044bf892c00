// The fused kernels for avx512 (16 floats or 8 doubles a vector); see fused_kernels.hpp.
#include "cpu/fused_kernels.hpp"

namespace rnncore::cpu {
namespace {

template <class T, int W>
FusedOps<T> ops() {
  using F = Fused<T, W>;
  return {W,         &F::pack,      &F::step,         &F::phases,
          &F::block, &F::workspace, &F::pack_columns, &F::matmul};
}

}  // namespace

FusedKernels fused_kernels_avx512() { return {"avx512", ops<float, 16>(), ops<double, 8>()}; }

}  // namespace rnncore::cpu
