// The fused kernels of one instruction set (see fused_kernels.hpp), compiled once per set by
// CMakeLists.txt (rnncore_fused_isa) with RNNCORE_ISA (generic, avx2, avx512) and the
// float32 vector width RNNCORE_ISA_WIDTH; fused.cpp picks one at load time.
#include "cpu/fused_kernels.hpp"

#define RNNCORE_PASTE(a, b) a##b
#define RNNCORE_ENTRY(isa) RNNCORE_PASTE(fused_kernels_, isa)
#define RNNCORE_STRING(x) #x
#define RNNCORE_NAME(isa) RNNCORE_STRING(isa)

namespace rnncore::cpu {
namespace {

template <class T, int W>
FusedOps<T> ops() {
  using F = Fused<T, W>;
  return {W,
          &F::pack,
          &F::step,
          &F::phases,
          &F::block,
          &F::workspace,
          &F::pack_columns,
          &F::matmul,
          F::kDotBf16 ? &F::pack_pairs_rows : nullptr,
          F::kDotBf16 ? &F::gemm_pairs : nullptr,
          F::kPairPanels * W,
          F::kHalfPanels};
}

}  // namespace

FusedKernels RNNCORE_ENTRY(RNNCORE_ISA)() {
  return {RNNCORE_NAME(RNNCORE_ISA), ops<float, RNNCORE_ISA_WIDTH>(),
          ops<double, RNNCORE_ISA_WIDTH / 2>()};
}

}  // namespace rnncore::cpu
