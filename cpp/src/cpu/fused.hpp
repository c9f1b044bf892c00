// Fused recurrences: the recurrent weight packed once per call in the order the step
// kernel reads it, a register-blocked product whose epilogue does the gate math in L1,
// and chunks of hidden units that the pool's threads claim step after step.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "cpu/directions.hpp"

namespace rnncore::cpu {

// Rows of A that matmul (the backward steps' product) takes per register tile, on every
// instruction set. A row's arithmetic depends only on where it sits in its tile, so
// splitting the rows at multiples of this leaves every row's bits unchanged.
constexpr int kProductRows = 8;

// One of the products C [M, n] = op(A) B of FusedOps::tile_gemm_pieces: B [K, n] ldb apart,
// C ldc apart.
template <class T>
struct GemmPiece {
  const T* B;
  int64_t ldb, n;
  T* C;
  int64_t ldc;
};

// A part of a block of x' (Problem::lazy_projection) that one panel's product of a step
// carries (FusedOps::carry_rows): units of k [k0, k1) (FusedOps::carry_units) of the block's
// rows [t0, t0 + rows) for panel b's units, summed into acc (rows · G · width elements, each
// gate's from zero at its first unit). None when k1 == k0.
template <class T>
struct CarrySlice {
  int64_t t0, b, k0, k1;
  T* acc;
};

// The entry points of one scalar type (fused_kernels.hpp compiled per instruction set).
template <class T>
struct FusedOps {
  int width;  // elements per vector
  // One direction's forward, by panels of `width` hidden units: pack() packs the panels
  // [b0, b1) of R into the direction's workspace `ws` and sets up their units; step() runs
  // phase `phase` (of phases(p)) of step s for them, with `blk` (block(p) elements) as
  // scratch. A phase may start once that before it is done for every panel.
  void (*pack)(const detail::Problem& p, const DirectionForward& a, T* ws, int64_t b0, int64_t b1);
  // xpre: project_step's output for the panels, or null. carry: one slice per panel of
  // [b0, b1), or null (FusedOps::carry_rows).
  void (*step)(const detail::Problem& p, const DirectionForward& a, T* ws, int64_t s, int phase,
               int64_t b0, int64_t b1, T* blk, T* xpre, const CarrySlice<T>* carry);
  int (*phases)(const detail::Problem& p);
  // The part of step s's products that does not depend on the step before (an LSTM or a
  // reset-after GRU that projects its steps' rows), for panels [b0, b1), into xpre:
  // project_block(p) elements a panel, 0 when the op has no such part. A thread that would
  // wait for step s - 1 runs it (fused.cpp).
  int64_t (*project_block)(const detail::Problem& p);
  void (*project_step)(const detail::Problem& p, const DirectionForward& a, T* ws, int64_t s,
                       int64_t b0, int64_t b1, T* xpre);
  // With Problem::lazy_projection: x' rows [t0, t0 + m) (m <= project_rows_max) of the units
  // of panels [b0, b1), written into the direction's x'.
  void (*project_rows)(const detail::Problem& p, const DirectionForward& a, T* ws, int64_t t0,
                       int64_t m, int64_t b0, int64_t b1);
  int64_t project_rows_max;
  // Batch 1 in one row of pairs (an LSTM's inference on vdpbf16ps): a step's product streams
  // R from L2 with the dot-product unit half idle, and can carry the arithmetic of x' blocks
  // of this many rows (project_rows's sums, in blocks of these rows), units of k at a time
  // (CarrySlice: units of k, carry_units of them a block, each a pair of k for some of the
  // gates); 0 where it cannot. carry_complete sums a block's units from k0 on into acc and
  // writes its rows of x' (plus the bias).
  int64_t (*carry_rows)(const detail::Problem& p, const DirectionForward& a);
  int64_t (*carry_units)(const detail::Problem& p);
  void (*carry_complete)(const detail::Problem& p, const DirectionForward& a, T* ws, int64_t t0,
                         int64_t b, int64_t k0, T* acc);
  int64_t (*block)(const detail::Problem& p);
  // Elements of workspace one direction needs (packed weights and per-step buffers).
  int64_t (*workspace)(const detail::Problem& p);
  // Packs B [K, n] (row-major) into column panels of `width` for matmul: ceil(n/width)
  // panels of K*width elements.
  void (*pack_columns)(const T* B, int64_t K, int64_t n, T* out);
  // C[M, n] = A[M, K] B (or += when accumulate), B packed by pack_columns.
  void (*matmul)(const T* A, int64_t lda, int64_t M, int64_t K, const T* packed, int64_t n, T* C,
                 int64_t ldc, bool accumulate);
  // The input projection of bfloat16 storage by vdpbf16ps (null without AVX-512 BF16), in
  // groups of pair_columns columns: pack_pairs_rows packs groups [q0, q1) of B [n, K]
  // (bfloat16 bits) as pairs of k; gemm_pairs computes C[r, j] = A[r, :] · B[j, :] (+ bias[j])
  // for rows [0, M) and the columns of groups [q0, q1), A's rows being K2 = ceil(K/2)
  // bfloat16 pairs, lda2 pairs apart (scratch: M * pair_columns elements).
  void (*pack_pairs_rows)(const uint16_t* B, int64_t n, int64_t K, uint16_t* out, int64_t q0,
                          int64_t q1);
  void (*gemm_pairs)(const void* A, int64_t lda2, int64_t M, int64_t K2, const uint16_t* packed,
                     int64_t n, int64_t q0, int64_t q1, const T* bias, T* C, int64_t ldc,
                     T* scratch);
  int pair_columns;
  // C[M, n] = op(A) B (op(A) = Aᵀ, A [K, M], with trans_a), all row-major float32, with both
  // operands rounded to bfloat16 (bf16_gemm.hpp: AMX tiles or vdpbf16ps; null without AVX-512
  // BF16): the gradient GEMMs of bfloat16 storage. A_bits: A as bfloat16 bits (narrow_rows_bf16's),
  // read in A's place (A unused).
  void (*tile_gemm)(bool trans_a, int64_t M, int64_t n, int64_t K, const T* A, int64_t lda,
                    const T* B, int64_t ldb, T* C, int64_t ldc, const uint16_t* A_bits);
  // The products op(A) B_q of up to two pieces, op(A) packed once for them (the same bits as
  // tile_gemm's of each piece).
  void (*tile_gemm_pieces)(bool trans_a, int64_t M, int64_t K, const T* A, int64_t lda,
                           const GemmPiece<T>* pieces, int count, const uint16_t* A_bits);
  // dst [rows, n] (ldd apart) = src [rows, n] (lds apart) rounded to bfloat16 as tile_gemm
  // rounds its operands (null where tile_gemm is): tile_gemm on the bits then gives the bits
  // of tile_gemm on src.
  void (*narrow_rows_bf16)(const T* src, int64_t lds, int64_t rows, int64_t n, uint16_t* dst,
                           int64_t ldd);
  // The backward steps' product for bfloat16 storage on AMX (null without): pack_tiles packs
  // B [K, n], whose values are bfloat16 (R of bfloat16 storage), into tiles_size(K, n)
  // elements; matmul_tiles is matmul on them with A split into bfloat16 hi + lo.
  void (*pack_tiles)(const T* B, int64_t K, int64_t n, uint16_t* out);
  void (*matmul_tiles)(const T* A, int64_t lda, int64_t M, int64_t K, const uint16_t* packed,
                       int64_t n, T* C, int64_t ldc, bool accumulate);
  // The input projection of bfloat16 storage on AMX (null without): C [M, n] = x [M, K] ·
  // w [n, K]ᵀ (+ bias), x and w bfloat16 bits, row-major.
  void (*project_tiles)(int64_t M, int64_t n, int64_t K, const uint16_t* x, const uint16_t* w,
                        const T* bias, T* C);
  // Whether the fused forward reads float16 / bfloat16 storage's R in 16 bits (then it
  // needs no float32 copy of R).
  bool narrow_panels;
  // C[M, n] = alpha A[M, K] · B[n, K]ᵀ + beta C (row-major; C not read when beta is 0) for a
  // few rows of A, B read as stored (few_rows.hpp; null where there is none: the BLAS).
  // Each element's bits depend on K alone, not on M, n or a split of C.
  void (*gemm_nt)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  // gemm_nt with B float16 or bfloat16 storage's bits, widened as read: the bits gemm_nt
  // gives on B widened first, for every M from 1 (null without gemm_nt).
  void (*gemm_nt_half)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                       const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  void (*gemm_nt_bfloat16)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                           const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  // gemm_nt_bfloat16 by vdpbf16ps (AVX-512 BF16; null without): A rounded to bfloat16, or
  // split into bfloat16 hi + lo (_split), as the fused kernels' pairs.
  void (*gemm_nt_dot)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                      const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  void (*gemm_nt_dot_split)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                            const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  // C[M, n] = alpha op(A) · B + beta C, B [K, n] read as stored, op(A) = A [M, K] (gemm_nn:
  // a few rows) or A [K, M]ᵀ (gemm_tn: a short K); each element one chain of FMAs in k order,
  // the same bits for any split of C (few_rows.hpp's RowBroadcast; null: the BLAS).
  void (*gemm_nn)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  void (*gemm_tn)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  // gemm_nn with B float16 or bfloat16 storage's bits, widened as read: the bits gemm_nn
  // gives on B widened first (null without gemm_nn).
  void (*gemm_nn_half)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                       const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
  void (*gemm_nn_bfloat16)(int64_t M, int64_t n, int64_t K, T alpha, const T* A, int64_t lda,
                           const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) = nullptr;
};

struct FusedKernels {
  const char* isa;
  FusedOps<float> f32;
  FusedOps<double> f64;
  template <class T>
  const FusedOps<T>& ops() const {
    if constexpr (sizeof(T) == 4)
      return f32;
    else
      return f64;
  }
};

// The best kernels this CPU runs.
const FusedKernels& fused_kernels();

// Whether the 512-bit kernels widen float16 panels at batch 1 by two 256-bit conversions
// rather than one 512-bit: on AMD Zen 4 a 512-bit vcvtph2ps issues every other cycle and a
// 256-bit one twice a cycle (measured: 8.6 against 14.9 weights widened and multiplied a
// cycle), on Intel's AVX-512 cores both once a cycle. RNNCORE_F16_WIDEN=halves|whole
// forces it (for tests: the bits are the same either way).
bool widen_f16_by_halves();

// Whether the AVX-512 tiles take A's element from memory in each FMA or vdpbf16ps
// (m32{1to16}) rather than broadcasting it into a register first: on AMD Zen 4, whose one
// 512-bit FMA a cycle leaves load slots to spare, the separate broadcasts held the 6 x 4 tile
// at 95% of its rate (one core: 105-108 against 110-113 GFLOP/s). Not on Intel's cores, whose
// two FMAs a cycle need more loads a cycle so (Xeon with AMX, the float32 LSTM at N=32: a
// paired ratio of 1.007 over 16 alternating rounds, memory form / register form).
// RNNCORE_FMA_BROADCAST=memory|register forces it (for tests: the bits are the same).
bool fma_broadcast_from_memory();

// Whether the steps' products carry the blocks of x' that FusedOps::carry_rows allows
// (fused.cpp; the same bits either way): RNNCORE_CARRY=0 leaves them to the blocks made
// beside the steps (for tests).
bool carry_blocks();

// Whether vcvtph2ps of 256 bits costs the step kernels more than streaming twice the bytes
// of float32 from L2: AMD Zen to Zen 2 (family 0x17), which split it over 128-bit units.
// Elsewhere a float16 panel is the cheaper (Zen 3, T=100 N=1 H=256 float16, 2 threads,
// alternating runs: GRU 0.74-0.76 ms against 0.98-1.19 widened once, LSTM 1.00-1.03 against
// 1.31-1.40; and at H = 128 and 192, where both fit L2).
bool slow_f16_conversion();

// Elements pack_columns writes for B [K, n].
template <class T>
int64_t packed_columns_size(int64_t K, int64_t n) {
  const int64_t w = fused_kernels().ops<T>().width;
  return (n + w - 1) / w * w * K;
}

// Elements pack_tiles writes for B [K, n]: tiles of 16 columns × 16 pairs of k.
inline int64_t tiles_size(int64_t K, int64_t n) { return (n + 15) / 16 * ((K + 31) / 32) * 512; }
// Columns per tile of matmul_tiles' packed operand (its chunks start at multiples of it).
constexpr int64_t kTileColumns = 16;

// Runs the forward recurrence of every direction on the pool.
void fused_forward(const detail::Problem& p, const DirectionForward* dirs);

}  // namespace rnncore::cpu
