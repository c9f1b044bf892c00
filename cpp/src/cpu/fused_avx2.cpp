// The fused kernels for avx2 (8 floats or 4 doubles a vector); see fused_kernels.hpp.
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

FusedKernels fused_kernels_avx2() { return {"avx2", ops<float, 8>(), ops<double, 4>()}; }

}  // namespace rnncore::cpu
