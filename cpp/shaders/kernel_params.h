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

// Function-constant indices. Booleans switch features on, ints select activations and
// gate positions; every pipeline fixes all of the ones its kernel reads.
enum FunctionConstantIndex : int32_t {
  FC_HAS_WEIGHT = 0,  // projection: x * W^T; without it x is copied
  FC_HAS_BIAS = 1,
  FC_HAS_INIT_STATE = 10,
  FC_HAS_INIT_CELL = 11,
  FC_HAS_MASK = 12,
  FC_HAS_PEEPHOLE = 13,
  FC_HAS_SECONDARY_BIAS = 14,
  FC_TRAINING = 15,  // write the training state
  FC_FLIP_Z = 16,
  FC_HAS_CELL = 17,       // LSTM: the cell buffer is bound
  FC_HAS_WORKSPACE = 18,  // GRU reset-before: the per-step workspace is bound
  FC_ACT_0 = 20,  // activation of the gate block at position 0..3 (ActivationCode)
  FC_ACT_1 = 21,
  FC_ACT_2 = 22,
  FC_ACT_3 = 23,
  FC_CELL_ACT = 24,  // LSTM phi
  FC_GATE_A = 30,    // LSTM block position of i; GRU block position of z
  FC_GATE_B = 31,    // LSTM f; GRU r
  FC_GATE_C = 32,    // LSTM z (the cell input)
  FC_GATE_D = 33,    // LSTM o
};

// The contract's activation table; values equal rnncore::Activation's.
enum ActivationCode : int32_t {
  ACT_NONE = 0,
  ACT_RELU = 1,
  ACT_TANH = 2,
  ACT_SIGMOID = 3,
  ACT_HARD_SIGMOID = 4,
};

// Tile and threadgroup sizes: compile-time in the kernels, read by the plan.
enum KernelSizes : int32_t {
  SIMD_WIDTH = 32,
  GEMM_TILE_M = 64,  // output rows per threadgroup
  GEMM_TILE_N = 64,  // output columns per threadgroup
  GEMM_TILE_K = 16,
  GEMM_THREADS = 256,  // 16 x 16 threads, 4 x 4 outputs each
  STEP_SIMDGROUPS = 4,  // hidden units per step threadgroup (one per simdgroup)
  STEP_MAX_BATCH_TILE = 8,
};

// ---- projection: y[M, Nc] = x[M, K] * W[Nc, K]^T + bias[Nc] ------------------------------
enum ProjectionBuffer : int32_t {
  PB_X = 0,
  PB_W = 1,
  PB_BIAS = 2,
  PB_Y = 3,
  PB_PARAMS = 4,
};

struct ProjectionParams {
  int32_t M, K, Nc;
  int32_t ldx, ldw, ldy;  // row strides in elements
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
  SB_C = 8,   // LSTM cell: the cell output, or workspace of the same shape
  SB_Z = 9,   // training state
  SB_WS = 10,  // GRU reset-before: [N, D*H] z gate, then [N, D*H] r * h~
  SB_PARAMS = 11,
};

struct StepParams {
  int32_t T, N, H;
  int32_t step;     // processing step s of this dispatch
  int32_t reverse;  // unidirectional reverse: direction 0 reads its input flipped
  int32_t xp_ld;    // D*G*H
  int32_t y_ld;     // D*H (state, cell, workspace rows)
  int32_t z_ld;     // D*ZG*H
  int32_t mask_rs;  // element strides of the mask broadcast to [N, D*H]
  int32_t mask_cs;
};

}  // namespace kernels
}  // namespace rnncore
