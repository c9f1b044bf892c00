// The fused kernels of one instruction set (see fused_kernels.hpp), compiled once per set by
// CMakeLists.txt (rnncore_fused_isa) with RNNCORE_ISA (generic, avx2, avx512, avx512bf16,
// avx512amx), the float32 vector width RNNCORE_ISA_WIDTH and RNNCORE_ISA_F64 (whether it has
// float64 kernels of its own); fused.cpp picks one at load time.
#include "cpu/fused_kernels.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#include "cpu/few_rows.hpp"
#endif

#define RNNCORE_PASTE(a, b) a##b
#define RNNCORE_ENTRY(isa) RNNCORE_PASTE(fused_kernels_, isa)
#define RNNCORE_STRING(x) #x
#define RNNCORE_NAME(isa) RNNCORE_STRING(isa)

namespace rnncore::cpu {
namespace {

template <class T, int W>
FusedOps<T> ops() {
  using F = Fused<T, W>;
  FusedOps<T> o{W,
                &F::pack,
                &F::step,
                &F::phases,
                &F::project_block,
                &F::project_step,
                &F::project_rows,
                F::kProjectRows,
                &F::carry_rows,
                &F::carry_units,
                &F::carry_complete,
                &F::block,
                &F::workspace,
                &F::pack_columns,
                &F::matmul,
                F::kDotBf16 ? &F::pack_pairs_rows : nullptr,
                F::kDotBf16 ? &F::gemm_pairs : nullptr,
                F::kPairPanels * W,
                nullptr,
                nullptr,
                nullptr,
                nullptr,
                nullptr,
                nullptr,
                F::kHalfPanels};
#if RNNCORE_FUSED_DOT_BF16
  if constexpr (std::is_same_v<T, float>) {  // bfloat16 storage's gradients (bf16_gemm.hpp)
    o.tile_gemm = &Bf16Gemm::gemm;
    o.tile_gemm_pieces = &Bf16Gemm::gemm_pieces;
    o.narrow_rows_bf16 = &Bf16Gemm::narrow_rows;
  }
#endif
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    o.gemm_nt = &FewRows<FewRowsAvx512>::gemm_nt;
    o.gemm_nt_half = &FewRows<FewRowsAvx512, HalfBits>::gemm_nt_bits;
    o.gemm_nt_bfloat16 = &FewRows<FewRowsAvx512, BFloatBits>::gemm_nt_bits;
#if defined(__AVX512BF16__)
    o.gemm_nt_dot = &FewRows<FewRowsAvx512, BFloatBits, FewRowsMode::Dot>::gemm_nt_bits;
    o.gemm_nt_dot_split = &FewRows<FewRowsAvx512, BFloatBits, FewRowsMode::DotSplit>::gemm_nt_bits;
#endif
    o.gemm_nn = &RowBroadcast<FewRowsAvx512>::gemm_nn;
    o.gemm_nn_half = &RowBroadcast<FewRowsAvx512, HalfBits>::gemm_nn_bits;
    o.gemm_nn_bfloat16 = &RowBroadcast<FewRowsAvx512, BFloatBits>::gemm_nn_bits;
    o.gemm_tn = &RowBroadcast<FewRowsAvx512>::gemm_tn;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {
    o.gemm_nt = &FewRows<FewRowsAvx2>::gemm_nt;
    o.gemm_nt_half = &FewRows<FewRowsAvx2, HalfBits>::gemm_nt_bits;
    o.gemm_nt_bfloat16 = &FewRows<FewRowsAvx2, BFloatBits>::gemm_nt_bits;
    o.gemm_nn = &RowBroadcast<FewRowsAvx2>::gemm_nn;
    o.gemm_nn_half = &RowBroadcast<FewRowsAvx2, HalfBits>::gemm_nn_bits;
    o.gemm_nn_bfloat16 = &RowBroadcast<FewRowsAvx2, BFloatBits>::gemm_nn_bits;
    o.gemm_tn = &RowBroadcast<FewRowsAvx2>::gemm_tn;
  }
#endif
#if RNNCORE_FUSED_AMX
  if constexpr (std::is_same_v<T, float>) {
    o.pack_tiles = &Bf16Gemm::pack_tiles;
    o.matmul_tiles = &Bf16Gemm::matmul_tiles;
    o.project_tiles = &Bf16Gemm::project;
  }
#endif
  return o;
}

}  // namespace

FusedKernels RNNCORE_ENTRY(RNNCORE_ISA)() {
#if RNNCORE_ISA_F64
  return {RNNCORE_NAME(RNNCORE_ISA), ops<float, RNNCORE_ISA_WIDTH>(),
          ops<double, RNNCORE_ISA_WIDTH / 2>()};
#else
  // The float64 kernels are those of the variant without the bfloat16 instructions, which
  // they do not use (fused.cpp fills them in): one compile less per variant.
  return {RNNCORE_NAME(RNNCORE_ISA), ops<float, RNNCORE_ISA_WIDTH>(), {}};
#endif
}

}  // namespace rnncore::cpu
