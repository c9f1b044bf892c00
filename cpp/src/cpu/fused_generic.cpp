// The fused kernels for generic (4 floats or 2 doubles a vector); see fused_kernels.hpp.
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

FusedKernels fused_kernels_generic() { return {"generic", ops<float, 4>(), ops<double, 2>()}; }

}  // namespace rnncore::cpu
