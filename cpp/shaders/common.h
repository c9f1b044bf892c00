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
#define THREADGROUP_BUFFER(type, name, index) threadgroup type* name [[threadgroup(index)]]
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
FUNCTION_CONSTANT(bool, has_dh_final, FC_HAS_DH_FINAL)
FUNCTION_CONSTANT(bool, has_dc_final, FC_HAS_DC_FINAL)
FUNCTION_CONSTANT(bool, has_dc_steps, FC_HAS_DC_STEPS)
FUNCTION_CONSTANT(bool, want_dh0, FC_WANT_DH0)
FUNCTION_CONSTANT(bool, want_dc0, FC_WANT_DC0)
FUNCTION_CONSTANT(bool, has_scale, FC_HAS_SCALE)
FUNCTION_CONSTANT(bool, has_hfwd, FC_HAS_HFWD)
FUNCTION_CONSTANT(bool, has_cfwd, FC_HAS_CFWD)
FUNCTION_CONSTANT(bool, has_rdelta, FC_HAS_RDELTA)
FUNCTION_CONSTANT(bool, has_u, FC_HAS_U)
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
#define STEP_KERNEL_PARAMS(T)                                                                    \
  device const T *xp [[buffer(SB_XP)]], device const T *R [[buffer(SB_R)]],                      \
      device const T *h0 [[buffer(SB_H0), function_constant(has_init_state)]],                   \
      device const T *c0 [[buffer(SB_C0), function_constant(has_init_cell)]],                    \
      device const T *mask [[buffer(SB_MASK), function_constant(has_mask)]],                     \
      device const T *peephole [[buffer(SB_PEEPHOLE), function_constant(has_peephole)]],         \
      device const T *b2 [[buffer(SB_B2), function_constant(has_secondary_bias)]],               \
      device T *y [[buffer(SB_Y)]], device T *c [[buffer(SB_C), function_constant(has_cell)]],   \
      device T *z [[buffer(SB_Z), function_constant(training)]],                                 \
      device T *ws [[buffer(SB_WS), function_constant(has_workspace)]],                          \
      constant StepParams &p [[buffer(SB_PARAMS)]], uint3 tgid [[threadgroup_position_in_grid]], \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]
#define STEP_KERNEL_ARGS xp, R, h0, c0, mask, peephole, b2, y, c, z, ws, p, tgid, sg, lane
// The same list without attributes, for the step implementations (plain functions).
#define STEP_IMPL_PARAMS(T)                                                                \
  device const T *xp, device const T *R, device const T *h0, device const T *c0,           \
      device const T *mask, device const T *peephole, device const T *b2, device T *y,     \
      device T *c, device T *z, device T *ws, constant StepParams &p, uint3 tgid, uint sg, \
      uint lane

// The contract's activation table (float32 math; the logistic without overflow).
inline float activate(int code, float x) {
  switch (code) {
    case ACT_RELU: return x > 0.0f ? x : (x <= 0.0f ? 0.0f : x);  // NaN passes
    case ACT_TANH: return tanh(x);
    case ACT_SIGMOID: {
      const float e = exp(-fabs(x));
      return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    }
    case ACT_HARD_SIGMOID: {
      // Not clamp(): its fmax/fmin would turn NaN into a bound.
      const float v = 0.2f * x + 0.5f;
      return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
    }
    default: return x;
  }
}

// f(x) and f'(x) from the pre-activation (the contract's table; hard_sigmoid's slope is
// 0.2 on the closed interval |x| <= 2.5).
inline float2 activate_grad(int code, float x) {
  switch (code) {
    case ACT_RELU:  // f(NaN) = NaN, f'(NaN) = 0
      return x > 0.0f ? float2(x, 1.0f) : float2(x <= 0.0f ? 0.0f : x, 0.0f);
    case ACT_TANH: {
      const float t = tanh(x);
      return float2(t, 1.0f - t * t);
    }
    case ACT_SIGMOID: {
      const float s = activate(ACT_SIGMOID, x);
      return float2(s, s * (1.0f - s));
    }
    case ACT_HARD_SIGMOID:
      return float2(activate(ACT_HARD_SIGMOID, x), fabs(x) <= 2.5f ? 0.2f : 0.0f);
    default: return float2(x, 1.0f);
  }
}

// The activation of the gate block at position `pos` (a function constant: this folds).
inline int act_at(int pos) {
  return pos == 0 ? act_0 : pos == 1 ? act_1 : pos == 2 ? act_2 : act_3;
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

inline StepTimes step_times(constant StepParams& p, int d) {
  const bool flip_in = d == 1 || p.reverse != 0;
  const bool flip_out = d == 1;
  StepTimes st;
  st.t_in = flip_in ? p.T - 1 - p.step : p.step;
  st.t_out = flip_out ? p.T - 1 - p.step : p.step;
  st.t_prev = p.step == 0 ? -1 : (flip_out ? p.T - p.step : p.step - 1);
  return st;
}

// The mask element of batch row n, state column col (broadcast through zero strides).
template <typename T>
inline float mask_at(device const T* mask, constant StepParams& p, int n, int col) {
  return has_mask ? float(mask[n * p.mask_rs + col * p.mask_cs]) : 1.0f;
}

// acc[g][j] = sum_k v[n0 + j, k] * R[row_g, k] over one simdgroup: lanes stride over k (R's
// rows and the state rows are contiguous in k, so loads coalesce), then simd_sum.
// v has rows of stride v_ld starting at column v_col; null means zeros; masked rows are
// multiplied by the mask (h~ = h * m). Every lane returns the sums.
template <typename T, int NB, int NG>
inline void recurrent_dot(device const T* v, int v_ld, int v_col, bool masked, device const T* mask,
                          device const T* R, int rows0, int rows1, int rows2, int rows3,
                          constant StepParams& p, int n0, uint lane, thread float (&acc)[NG][NB]) {
  const int rows[4] = {rows0, rows1, rows2, rows3};
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NB; ++j) acc[g][j] = 0.0f;
  if (v) {
    for (int k = int(lane); k < p.H; k += SIMD_WIDTH) {
      float hv[NB];
      for (int j = 0; j < NB; ++j) {
        const int n = n0 + j;
        hv[j] = n < p.N ? float(v[n * v_ld + v_col + k]) : 0.0f;
        if (masked && n < p.N) hv[j] *= mask_at(mask, p, n, v_col + k);
      }
      for (int g = 0; g < NG; ++g) {
        const float r = float(R[rows[g] * p.H + k]);
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

// Rows of the [3, N, D*H] carry workspace of the gradient steps.
enum CarrySlot : int32_t { CARRY_DIRECT = 0, CARRY_DU = 1, CARRY_CELL = 2 };

// ---- gradient steps ----------------------------------------------------------------------
// Inputs and outputs are in the storage type T; what the steps keep for each other and for
// the weight-gradient GEMMs (dX', R's deltas, h~, the carries) is float32, so that float16
// storage does not round the sums that cancel (contract tolerance 1e-2 for float16).
#define BACKWARD_KERNEL_PARAMS(T)                                                              \
  device const T *rt [[buffer(BB_RT)]], device const T *z [[buffer(BB_Z)]],                    \
      device const T *h_fwd [[buffer(BB_HFWD), function_constant(has_hfwd)]],                  \
      device const T *c_fwd [[buffer(BB_CFWD), function_constant(has_cfwd)]],                  \
      device const T *h0 [[buffer(BB_H0), function_constant(has_init_state)]],                 \
      device const T *c0 [[buffer(BB_C0), function_constant(has_init_cell)]],                  \
      device const T *mask [[buffer(BB_MASK), function_constant(has_mask)]],                   \
      device const T *peephole [[buffer(BB_PEEPHOLE), function_constant(has_peephole)]],       \
      device const T *dy [[buffer(BB_DY)]],                                                    \
      device const T *dh_final [[buffer(BB_DH_FINAL), function_constant(has_dh_final)]],       \
      device const T *dc_final [[buffer(BB_DC_FINAL), function_constant(has_dc_final)]],       \
      device const T *dc_steps [[buffer(BB_DC_STEPS), function_constant(has_dc_steps)]],       \
      device float *dxp [[buffer(BB_DXP)]],                                                    \
      device float *rdelta [[buffer(BB_RDELTA), function_constant(has_rdelta)]],               \
      device float *htilde [[buffer(BB_HTILDE)]],                                              \
      device float *u_in [[buffer(BB_U), function_constant(has_u)]],                           \
      device float *carry [[buffer(BB_CARRY)]],                                                \
      device float *cprev [[buffer(BB_CPREV), function_constant(has_peephole)]],               \
      device T *dh0 [[buffer(BB_DH0), function_constant(want_dh0)]],                           \
      device T *dc0 [[buffer(BB_DC0), function_constant(want_dc0)]],                           \
      constant BackwardParams &p [[buffer(BB_PARAMS)]],                                        \
      uint3 tgid [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]], \
      uint lane [[thread_index_in_simdgroup]]
#define BACKWARD_KERNEL_ARGS                                                                  \
  rt, z, h_fwd, c_fwd, h0, c0, mask, peephole, dy, dh_final, dc_final, dc_steps, dxp, rdelta, \
      htilde, u_in, carry, cprev, dh0, dc0, p, tgid, sg, lane
#define BACKWARD_IMPL_PARAMS(T)                                                                   \
  device const T *rt, device const T *z, device const T *h_fwd, device const T *c_fwd,            \
      device const T *h0, device const T *c0, device const T *mask, device const T *peephole,     \
      device const T *dy, device const T *dh_final, device const T *dc_final,                     \
      device const T *dc_steps, device float *dxp, device float *rdelta, device float *htilde,    \
      device float *u_in, device float *carry, device float *cprev, device T *dh0, device T *dc0, \
      constant BackwardParams &p, uint3 tgid, uint sg, uint lane

// Time indices of processing step s (the contract's flips), for the gradient kernels.
inline int time_in(constant BackwardParams& p, int d, int s) {
  return d == 1 || p.reverse != 0 ? p.T - 1 - s : s;
}
inline int time_out(constant BackwardParams& p, int d, int s) { return d == 1 ? p.T - 1 - s : s; }

template <typename T>
inline float mask_at(device const T* mask, constant BackwardParams& p, int n, int col) {
  return has_mask ? float(mask[n * p.mask_rs + col * p.mask_cs]) : 1.0f;
}

// acc[j] = sum_{i < len} delta[(n0 + j) * ld + col0 + i] * rt_row[i] over one simdgroup (the
// product of a step's gate deltas with R, through a row of R^T: both reads contiguous).
template <typename T, int NB>
inline void transposed_dot(device const float* delta, int ld, int col0, device const T* rt_row,
                           int len, int N, int n0, uint lane, thread float (&acc)[NB]) {
  for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
  for (int i = int(lane); i < len; i += SIMD_WIDTH) {
    const float r = float(rt_row[i]);
    for (int j = 0; j < NB; ++j)
      if (n0 + j < N) acc[j] = fma(float(delta[(n0 + j) * ld + col0 + i]), r, acc[j]);
  }
  for (int j = 0; j < NB; ++j) acc[j] = simd_sum(acc[j]);
}

template <int NB>
inline float lane_value(thread const float (&acc)[NB], uint lane) {
  float v = 0.0f;
  for (int j = 0; j < NB; ++j) v = uint(j) == lane ? acc[j] : v;
  return v;
}

// Instantiates a gradient step kernel for the four batch tiles and both storage types.
#define INSTANTIATE_BACKWARD_KERNELS(op, impl)                                                     \
  kernel void op##_b1_f32(BACKWARD_KERNEL_PARAMS(float)) { impl<float, 1>(BACKWARD_KERNEL_ARGS); } \
  kernel void op##_b1_f16(BACKWARD_KERNEL_PARAMS(half)) { impl<half, 1>(BACKWARD_KERNEL_ARGS); }   \
  kernel void op##_b2_f32(BACKWARD_KERNEL_PARAMS(float)) { impl<float, 2>(BACKWARD_KERNEL_ARGS); } \
  kernel void op##_b2_f16(BACKWARD_KERNEL_PARAMS(half)) { impl<half, 2>(BACKWARD_KERNEL_ARGS); }   \
  kernel void op##_b4_f32(BACKWARD_KERNEL_PARAMS(float)) { impl<float, 4>(BACKWARD_KERNEL_ARGS); } \
  kernel void op##_b4_f16(BACKWARD_KERNEL_PARAMS(half)) { impl<half, 4>(BACKWARD_KERNEL_ARGS); }   \
  kernel void op##_b8_f32(BACKWARD_KERNEL_PARAMS(float)) { impl<float, 8>(BACKWARD_KERNEL_ARGS); } \
  kernel void op##_b8_f16(BACKWARD_KERNEL_PARAMS(half)) { impl<half, 8>(BACKWARD_KERNEL_ARGS); }   \
  REGISTER_KERNEL(backward_adapter<float>, op##_b1_f32)                                            \
  REGISTER_KERNEL(backward_adapter<half>, op##_b1_f16)                                             \
  REGISTER_KERNEL(backward_adapter<float>, op##_b2_f32)                                            \
  REGISTER_KERNEL(backward_adapter<half>, op##_b2_f16)                                             \
  REGISTER_KERNEL(backward_adapter<float>, op##_b4_f32)                                            \
  REGISTER_KERNEL(backward_adapter<half>, op##_b4_f16)                                             \
  REGISTER_KERNEL(backward_adapter<float>, op##_b8_f32)                                            \
  REGISTER_KERNEL(backward_adapter<half>, op##_b8_f16)

// Instantiates a step kernel for the four batch tiles and both storage types (float32,
// and float16 with float32 arithmetic).
#define INSTANTIATE_STEP_KERNELS(op, impl)                                                 \
  kernel void op##_b1_f32(STEP_KERNEL_PARAMS(float)) { impl<float, 1>(STEP_KERNEL_ARGS); } \
  kernel void op##_b1_f16(STEP_KERNEL_PARAMS(half)) { impl<half, 1>(STEP_KERNEL_ARGS); }   \
  kernel void op##_b2_f32(STEP_KERNEL_PARAMS(float)) { impl<float, 2>(STEP_KERNEL_ARGS); } \
  kernel void op##_b2_f16(STEP_KERNEL_PARAMS(half)) { impl<half, 2>(STEP_KERNEL_ARGS); }   \
  kernel void op##_b4_f32(STEP_KERNEL_PARAMS(float)) { impl<float, 4>(STEP_KERNEL_ARGS); } \
  kernel void op##_b4_f16(STEP_KERNEL_PARAMS(half)) { impl<half, 4>(STEP_KERNEL_ARGS); }   \
  kernel void op##_b8_f32(STEP_KERNEL_PARAMS(float)) { impl<float, 8>(STEP_KERNEL_ARGS); } \
  kernel void op##_b8_f16(STEP_KERNEL_PARAMS(half)) { impl<half, 8>(STEP_KERNEL_ARGS); }   \
  REGISTER_KERNEL(step_adapter<float>, op##_b1_f32)                                        \
  REGISTER_KERNEL(step_adapter<half>, op##_b1_f16)                                         \
  REGISTER_KERNEL(step_adapter<float>, op##_b2_f32)                                        \
  REGISTER_KERNEL(step_adapter<half>, op##_b2_f16)                                         \
  REGISTER_KERNEL(step_adapter<float>, op##_b4_f32)                                        \
  REGISTER_KERNEL(step_adapter<half>, op##_b4_f16)                                         \
  REGISTER_KERNEL(step_adapter<float>, op##_b8_f32)                                        \
  REGISTER_KERNEL(step_adapter<half>, op##_b8_f16)
