// Included by every .metal file: the Metal standard library (or, in the host emulator, the
// shim that stands in for it), the function constants, the step kernels' common argument
// list and the gate activations.
#pragma once

#include "kernel_params.h"

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
#define FUNCTION_CONSTANT(type, name, index) constant type name [[function_constant(index)]];
// The metallib's function table is the registry on the GPU; the emulator registers here.
#define REGISTER_KERNEL(adapter, name)
// A threadgroup-memory argument (the emulator gives all threads of a group one block).
#define THREADGROUP_BUFFER(type, name, index) threadgroup type *name [[threadgroup(index)]]
#endif

using namespace rnncore::kernels;

FUNCTION_CONSTANT(bool, has_weight, FC_HAS_WEIGHT)
FUNCTION_CONSTANT(bool, has_bias, FC_HAS_BIAS)
FUNCTION_CONSTANT(bool, has_init_state, FC_HAS_INIT_STATE)
FUNCTION_CONSTANT(bool, has_init_cell, FC_HAS_INIT_CELL)
FUNCTION_CONSTANT(bool, has_mask, FC_HAS_MASK)
FUNCTION_CONSTANT(bool, has_peephole, FC_HAS_PEEPHOLE)
FUNCTION_CONSTANT(bool, has_secondary_bias, FC_HAS_SECONDARY_BIAS)
FUNCTION_CONSTANT(bool, training, FC_TRAINING)
FUNCTION_CONSTANT(bool, flip_z, FC_FLIP_Z)
FUNCTION_CONSTANT(bool, has_cell, FC_HAS_CELL)
FUNCTION_CONSTANT(bool, has_workspace, FC_HAS_WORKSPACE)
FUNCTION_CONSTANT(int, act_0, FC_ACT_0)
FUNCTION_CONSTANT(int, act_1, FC_ACT_1)
FUNCTION_CONSTANT(int, act_2, FC_ACT_2)
FUNCTION_CONSTANT(int, act_3, FC_ACT_3)
FUNCTION_CONSTANT(int, cell_act, FC_CELL_ACT)
FUNCTION_CONSTANT(int, gate_a, FC_GATE_A)
FUNCTION_CONSTANT(int, gate_b, FC_GATE_B)
FUNCTION_CONSTANT(int, gate_c, FC_GATE_C)
FUNCTION_CONSTANT(int, gate_d, FC_GATE_D)

// Every step kernel takes the same arguments (StepBuffer order); buffers an op does not use
// are absent through their function constant.
#define STEP_KERNEL_PARAMS(T)                                                              \
  device const T *xp [[buffer(SB_XP)]], device const T *R [[buffer(SB_R)]],                \
      device const T *h0 [[buffer(SB_H0), function_constant(has_init_state)]],            \
      device const T *c0 [[buffer(SB_C0), function_constant(has_init_cell)]],             \
      device const T *mask [[buffer(SB_MASK), function_constant(has_mask)]],              \
      device const T *peephole [[buffer(SB_PEEPHOLE), function_constant(has_peephole)]],  \
      device const T *b2 [[buffer(SB_B2), function_constant(has_secondary_bias)]],        \
      device T *y [[buffer(SB_Y)]], device T *c [[buffer(SB_C), function_constant(has_cell)]], \
      device T *z [[buffer(SB_Z), function_constant(training)]],                          \
      device T *ws [[buffer(SB_WS), function_constant(has_workspace)]],                   \
      constant StepParams &p [[buffer(SB_PARAMS)]],                                        \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]
#define STEP_KERNEL_ARGS xp, R, h0, c0, mask, peephole, b2, y, c, z, ws, p, tgid, sg, lane
// The same list without attributes, for the step implementations (plain functions).
#define STEP_IMPL_PARAMS(T)                                                                  \
  device const T *xp, device const T *R, device const T *h0, device const T *c0,            \
      device const T *mask, device const T *peephole, device const T *b2, device T *y,      \
      device T *c, device T *z, device T *ws, constant StepParams &p, uint3 tgid, uint sg,  \
      uint lane

// The contract's activation table (float32 math; the logistic without overflow).
inline float activate(int code, float x) {
  switch (code) {
    case ACT_RELU: return x > 0.0f ? x : 0.0f;
    case ACT_TANH: return tanh(x);
    case ACT_SIGMOID: {
      const float e = exp(-fabs(x));
      return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    }
    case ACT_HARD_SIGMOID: return clamp(0.2f * x + 0.5f, 0.0f, 1.0f);
    default: return x;
  }
}

// Element `index` of four values; the index is a function constant, so this folds.
inline float pick4(int index, float a0, float a1, float a2, float a3) {
  return index == 0 ? a0 : index == 1 ? a1 : index == 2 ? a2 : a3;
}

// Where one step of one direction reads and writes (the contract's flips): x' at time
// t_in, outputs at t_out, the previous state at t_prev (-1: the initial state).
struct StepTimes {
  int t_in, t_out, t_prev;
};

inline StepTimes step_times(constant StepParams &p, int d) {
  const bool flip_in = d == 1 || p.reverse != 0;
  const bool flip_out = d == 1;
  StepTimes st;
  st.t_in = flip_in ? p.T - 1 - p.step : p.step;
  st.t_out = flip_out ? p.T - 1 - p.step : p.step;
  st.t_prev = p.step == 0 ? -1 : (flip_out ? p.T - p.step : p.step - 1);
  return st;
}

// The mask element of batch row n, state column col (broadcast through zero strides).
inline float mask_at(device const float *mask, constant StepParams &p, int n, int col) {
  return has_mask ? mask[n * p.mask_rs + col * p.mask_cs] : 1.0f;
}

// acc[g][j] = sum_k v[n0 + j, k] * R[row_g, k] over one simdgroup: lanes stride over k (R's
// rows and the state rows are contiguous in k, so loads coalesce), then simd_sum.
// v has rows of stride v_ld starting at column v_col; null means zeros; masked rows are
// multiplied by the mask (h~ = h * m). Every lane returns the sums.
template <int NB, int NG>
inline void recurrent_dot(device const float *v, int v_ld, int v_col, bool masked,
                          device const float *mask, device const float *R, int rows0,
                          int rows1, int rows2, int rows3, constant StepParams &p, int n0,
                          uint lane, thread float (&acc)[NG][NB]) {
  const int rows[4] = {rows0, rows1, rows2, rows3};
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NB; ++j) acc[g][j] = 0.0f;
  if (v) {
    for (int k = int(lane); k < p.H; k += SIMD_WIDTH) {
      float hv[NB];
      for (int j = 0; j < NB; ++j) {
        const int n = n0 + j;
        hv[j] = n < p.N ? v[n * v_ld + v_col + k] : 0.0f;
        if (masked && n < p.N) hv[j] *= mask_at(mask, p, n, v_col + k);
      }
      for (int g = 0; g < NG; ++g) {
        const float r = R[rows[g] * p.H + k];
        for (int j = 0; j < NB; ++j) acc[g][j] = fma(r, hv[j], acc[g][j]);
      }
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NB; ++j) acc[g][j] = simd_sum(acc[g][j]);
}

// The sums of batch row n0 + lane (lane < NB), without indexing registers by lane.
template <int NB, int NG>
inline float row_value(thread const float (&acc)[NG][NB], int g, uint lane) {
  float v = 0.0f;
  for (int j = 0; j < NB; ++j) v = uint(j) == lane ? acc[g][j] : v;
  return v;
}

// Instantiates a step kernel for the four batch tiles the plan chooses from.
#define INSTANTIATE_STEP_KERNELS(op, impl)                                     \
  kernel void op##_b1_f32(STEP_KERNEL_PARAMS(float)) { impl<1>(STEP_KERNEL_ARGS); } \
  kernel void op##_b2_f32(STEP_KERNEL_PARAMS(float)) { impl<2>(STEP_KERNEL_ARGS); } \
  kernel void op##_b4_f32(STEP_KERNEL_PARAMS(float)) { impl<4>(STEP_KERNEL_ARGS); } \
  kernel void op##_b8_f32(STEP_KERNEL_PARAMS(float)) { impl<8>(STEP_KERNEL_ARGS); } \
  REGISTER_KERNEL(step_adapter<float>, op##_b1_f32)                                 \
  REGISTER_KERNEL(step_adapter<float>, op##_b2_f32)                                 \
  REGISTER_KERNEL(step_adapter<float>, op##_b4_f32)                                 \
  REGISTER_KERNEL(step_adapter<float>, op##_b8_f32)
