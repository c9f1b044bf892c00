// Shared by the host (plan layer, executors) and the kernels: the params structs, the
// buffer indices and the function-constant indices, so host and kernels cannot drift apart.
// Plain C++14 that is also valid Metal Shading Language: int32_t fields only (no padding
// differences between the two compilers), enums for every constant.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#else
#include <cstdint>
#endif

namespace rnncore {
namespace kernels {

// The function constants, one line each: type, the kernels' name, the host's enumerator and
// the index. Booleans switch features on, ints select activations and gate positions; every
// pipeline sets all of those its kernel reads. The enum below and the kernels' declarations
// (common.h) both expand this table.
#define RNNCORE_FUNCTION_CONSTANTS(X)                                                              \
  X(bool, has_weight, FC_HAS_WEIGHT, 0) /* projection: x * W^T; else x is copied */                \
  X(bool, has_bias, FC_HAS_BIAS, 1)                                                                \
  X(bool, has_init_state, FC_HAS_INIT_STATE, 10)                                                   \
  X(bool, has_init_cell, FC_HAS_INIT_CELL, 11)                                                     \
  X(bool, has_mask, FC_HAS_MASK, 12)                                                               \
  X(bool, has_peephole, FC_HAS_PEEPHOLE, 13)                                                       \
  X(bool, has_secondary_bias, FC_HAS_SECONDARY_BIAS, 14)                                           \
  X(bool, training, FC_TRAINING, 15) /* write the training state */                                \
  X(bool, flip_z, FC_FLIP_Z, 16)                                                                   \
  X(bool, has_cell, FC_HAS_CELL, 17)           /* LSTM: the cell buffer is bound */                \
  X(bool, has_workspace, FC_HAS_WORKSPACE, 18) /* GRU reset-before: step workspace */              \
  X(int, act_0, FC_ACT_0, 20)                  /* activation of the gate block at position 0..3 */ \
  X(int, act_1, FC_ACT_1, 21)                                                                      \
  X(int, act_2, FC_ACT_2, 22)                                                                      \
  X(int, act_3, FC_ACT_3, 23)                                                                      \
  X(int, cell_act, FC_CELL_ACT, 24)          /* LSTM phi */                                        \
  X(int, gate_a, FC_GATE_A, 30)              /* block position of LSTM i, GRU z */                 \
  X(int, gate_b, FC_GATE_B, 31)              /* LSTM f, GRU r */                                   \
  X(int, gate_c, FC_GATE_C, 32)              /* LSTM z (the cell input) */                         \
  X(int, gate_d, FC_GATE_D, 33)              /* LSTM o */                                          \
  X(bool, has_dh_final, FC_HAS_DH_FINAL, 40) /* gradients: state_gradient given */                 \
  X(bool, has_dc_final, FC_HAS_DC_FINAL, 41) /* LSTM cell_gradient [N, D*H] */                     \
  X(bool, has_dc_steps, FC_HAS_DC_STEPS, 42) /* LSTM cell_gradient [T, N, D*H] */                  \
  X(bool, want_dh0, FC_WANT_DH0, 43)         /* write the init_state gradient */                   \
  X(bool, want_dc0, FC_WANT_DC0, 44)         /* write the init_cell gradient */                    \
  X(bool, has_scale, FC_HAS_SCALE, 45)       /* column sums: times a second array */               \
  X(bool, has_hfwd, FC_HAS_HFWD, 46)         /* GRU gradients: forward state bound */              \
  X(bool, has_cfwd, FC_HAS_CFWD, 47)         /* LSTM gradients: forward cell bound */              \
  X(bool, has_rdelta, FC_HAS_RDELTA, 48)     /* GRU reset-after: R's deltas differ */              \
  X(bool, has_u, FC_HAS_U, 49)               /* GRU reset-before: r * h~ kept for dR */

#define RNNCORE_FC_ENUMERATOR(type, name, enumerator, index) enumerator = index,
enum FunctionConstantIndex : int32_t { RNNCORE_FUNCTION_CONSTANTS(RNNCORE_FC_ENUMERATOR) };
#undef RNNCORE_FC_ENUMERATOR

// Tile and threadgroup sizes: compile-time in the kernels, read by the plan. SIMD_WIDTH is
// Apple silicon's SIMD-group width, which the step kernels' lane strides and simd_sum
// reductions assume: the metal-cpp executor refuses a GPU that is not Apple silicon
// (MTLGPUFamilyApple7) and any pipeline whose threadExecutionWidth differs
// (cpp/src/metal/apple_rules.hpp), since other widths would silently skip hidden units.
enum KernelSizes : int32_t {
  SIMD_WIDTH = 32,
  GEMM_TILE_M = 64,  // output rows per threadgroup
  GEMM_TILE_N = 64,  // output columns per threadgroup
  GEMM_TILE_K = 16,
  GEMM_THREADS = 256,        // 8 simdgroups, each a 32 x 16 block of 8 x 8 simdgroup matrices
  STEP_SIMDGROUPS = 8,       // hidden units per step threadgroup (one per simdgroup)
  STEP_MAX_BATCH_TILE = 16,  // R is read once per batch tile per step
  // The step kernels stage the batch tile's state (gradients: deltas) rows in threadgroup
  // memory this many columns at a time, read once per threadgroup instead of once per unit.
  STEP_CHUNK = 256,
};

// ---- GEMM: C[z][m, n] = sum_k A[z](m, k) B[z](k, n) (+ bias[n]) ----------------------------
// Element (m, k) of A is A[z * a_zs + m * a_rs + k * a_cs]; likewise B and C, so one kernel
// serves x W^T (the input projection), dX' W, dX'^T x and delta^T h (the weight gradients).
// Without B (has_weight false) C = A + bias, with K = N.
enum GemmBuffer : int32_t { GB_A, GB_B, GB_BIAS, GB_C, GB_PARAMS };

struct GemmParams {
  int32_t M, N, K;
  int32_t a_rs, a_cs, b_rs, b_cs, ldc;
  int32_t a_zs, b_zs, c_zs;  // per batch (direction) offsets
  // Split K (0 or 1: not split): grid z is batches x splits; split s sums k in
  // [s * k_per, (s + 1) * k_per) into its own C at offset s * c_ss (partials that a column
  // sum adds up), so a long K with few output tiles still fills the GPU.
  int32_t splits, k_per, c_ss;
};

// ---- column sums: out[z][c] = sum_r A[z*a_zs + r*lda + c] (* S[z*s_zs + r*lds + c % s_mod]) --
// Grid y splits the rows into blocks of row_block (0: one block), each summed into its own
// output row at y * out_ys: partials that a second column sum adds up.
enum ColumnSumBuffer : int32_t { CB_A, CB_S, CB_OUT, CB_PARAMS };

struct ColumnSumParams {
  int32_t rows, cols;
  int32_t lda, lds, s_mod;
  int32_t a_zs, s_zs, out_zs;
  int32_t row_block, out_ys;
};

// ---- transpose: out[z][c][r] = in[z][r][c] ------------------------------------------------
enum TransposeBuffer : int32_t { TB_IN, TB_OUT, TB_PARAMS };

struct TransposeParams {
  int32_t rows, cols;
  int32_t zs;  // elements per matrix
};

// ---- recurrent steps ----------------------------------------------------------------------
// Every step kernel has the same buffer table; absent inputs are unbound (their function
// constant is false). Layouts are the contract's: x' [T, N, D*G*H], R [D, G*H, H], state
// and cell [T, N, D*H], training state [T, N, D*ZG*H].
enum StepBuffer : int32_t {
  SB_XP = 0,
  SB_R = 1,
  SB_H0 = 2,
  SB_C0 = 3,
  SB_MASK = 4,
  SB_PEEPHOLE = 5,
  SB_B2 = 6,
  SB_Y = 7,
  SB_C = 8,    // LSTM cell: the cell output, or workspace of the same shape
  SB_Z = 9,    // training state
  SB_WS = 10,  // GRU reset-before: [N, D*H] z gate, then [N, D*H] r * h~
  SB_PARAMS = 11,
};

// The setBytes params of every step kernel, forward (StepBuffer) and gradient
// (BackwardBuffer).
struct StepParams {
  int32_t T, N, H;
  int32_t step;     // processing step s of this dispatch; gradients: -1 for the initial state
  int32_t steps;    // persistent kernels: how many steps from `step` (gradients: downwards)
  int32_t reverse;  // unidirectional reverse: direction 0 reads its input flipped
  int32_t xp_ld;    // D*G*H: x' (gradients: dX' and R's deltas) rows
  int32_t y_ld;     // D*H (state, cell, workspace rows)
  int32_t z_ld;     // D*ZG*H
  int32_t mask_rs;  // element strides of the mask broadcast to [N, D*H]
  int32_t mask_cs;
};

// ---- gradient steps ----------------------------------------------------------------------
// Every backward step kernel has this buffer table. Step s reads the deltas of step s + 1
// (the recurrent carry, through R^T) and writes its own; step -1 writes the initial-state
// gradients. dX' [T, N, D*G*H] at input time; RT [D, H, G*H] is R transposed per call.
enum BackwardBuffer : int32_t {
  BB_RT = 0,
  BB_Z = 1,     // training state of the forward run
  BB_HFWD = 2,  // GRU forward state output
  BB_CFWD = 3,  // LSTM forward cell output
  BB_H0 = 4,
  BB_C0 = 5,
  BB_MASK = 6,
  BB_PEEPHOLE = 7,
  BB_DY = 8,  // source_gradient [T, N, D*H]
  BB_DH_FINAL = 9,
  BB_DC_FINAL = 10,
  BB_DC_STEPS = 11,
  BB_DXP = 12,     // out: dX'
  BB_RDELTA = 13,  // GRU reset-after: the deltas R sees ([dz, dr, dq] per direction)
  BB_HTILDE = 14,  // out: masked previous state per step, at input time
  BB_U = 15,       // GRU reset-before: r * h~ per step, at input time
  BB_CARRY = 16,   // [3, N, D*H]: the direct path, du, and the cell carry between steps
  BB_CPREV = 17,   // LSTM with peepholes: previous cell per step, at input time
  BB_DH0 = 18,
  BB_DC0 = 19,
  BB_PARAMS = 20,
};

}  // namespace kernels
}  // namespace rnncore
