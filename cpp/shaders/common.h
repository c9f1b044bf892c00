// Included by every .metal file: the Metal standard library (or, in the host emulator, the
// shim that stands in for it), the function constants, the step kernels' argument lists and
// prologue, the gate activations and the helpers the step kernels share.
#pragma once

#include "kernel_params.h"

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
#include "metal_macros.h"
#endif

using namespace rnncore::kernels;

// Every function constant of kernel_params.h's table, declared at program scope.
#define RNNCORE_DECLARE_CONSTANT(type, name, enumerator, index) \
  FUNCTION_CONSTANT(type, name, enumerator)
RNNCORE_FUNCTION_CONSTANTS(RNNCORE_DECLARE_CONSTANT)
#undef RNNCORE_DECLARE_CONSTANT

// What both step signatures take, at the indices of their buffer table B (SB or BB): the
// initial state and cell, the mask and the peepholes; then the params and thread positions.
#define STEP_STATE_INPUTS(T, B)                                                \
  device const T *h0 [[buffer(B##_H0), function_constant(has_init_state)]],    \
      device const T *c0 [[buffer(B##_C0), function_constant(has_init_cell)]], \
      device const T *mask [[buffer(B##_MASK), function_constant(has_mask)]],  \
      device const T *peephole [[buffer(B##_PEEPHOLE), function_constant(has_peephole)]]
#define STEP_THREAD_PARAMS(B)                                                                \
  constant StepParams &p [[buffer(B##_PARAMS)]], THREADGROUP_BUFFER(float, stage, 0),        \
      uint3 tgid [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]], \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

// Every step kernel takes the same arguments (StepBuffer order); buffers an op does not use
// are absent through their function constant.
#define STEP_KERNEL_PARAMS(T)                                                                  \
  device const T *xp [[buffer(SB_XP)]], device const T *R [[buffer(SB_R)]],                    \
      STEP_STATE_INPUTS(T, SB),                                                                \
      device const T *b2 [[buffer(SB_B2), function_constant(has_secondary_bias)]],             \
      device T *y [[buffer(SB_Y)]], device T *c [[buffer(SB_C), function_constant(has_cell)]], \
      device T *z [[buffer(SB_Z), function_constant(training)]],                               \
      device T *ws [[buffer(SB_WS), function_constant(has_workspace)]], STEP_THREAD_PARAMS(SB)

// Every gradient step kernel takes the same arguments (BackwardBuffer order). Inputs and
// outputs are in the storage type T; what the steps keep for each other and for the
// weight-gradient GEMMs (dX', R's deltas, h~, the carries) is float32, so that float16
// storage does not round the sums that cancel (contract tolerance 1e-2 for float16).
#define BACKWARD_KERNEL_PARAMS(T)                                                        \
  device const T *rt [[buffer(BB_RT)]], device const T *z [[buffer(BB_Z)]],              \
      device const T *h_fwd [[buffer(BB_HFWD), function_constant(has_hfwd)]],            \
      device const T *c_fwd [[buffer(BB_CFWD), function_constant(has_cfwd)]],            \
      STEP_STATE_INPUTS(T, BB), device const T *dy [[buffer(BB_DY)]],                    \
      device const T *dh_final [[buffer(BB_DH_FINAL), function_constant(has_dh_final)]], \
      device const T *dc_final [[buffer(BB_DC_FINAL), function_constant(has_dc_final)]], \
      device const T *dc_steps [[buffer(BB_DC_STEPS), function_constant(has_dc_steps)]], \
      device float *dxp [[buffer(BB_DXP)]],                                              \
      device float *rdelta [[buffer(BB_RDELTA), function_constant(has_rdelta)]],         \
      device float *htilde [[buffer(BB_HTILDE)]],                                        \
      device float *u_in [[buffer(BB_U), function_constant(has_u)]],                     \
      device float *carry [[buffer(BB_CARRY)]],                                          \
      device float *cprev [[buffer(BB_CPREV), function_constant(has_peephole)]],         \
      device T *dh0 [[buffer(BB_DH0), function_constant(want_dh0)]],                     \
      device T *dc0 [[buffer(BB_DC0), function_constant(want_dc0)]], STEP_THREAD_PARAMS(BB)

// Opens every (forward or gradient) step kernel template <typename T, int NB>: simdgroup sg
// owns hidden unit u of direction d for batch rows n0 .. n0 + NB - 1. A simdgroup past H
// (unit false) still stages its share of the rows and reaches every barrier of the product,
// then returns whole, so no simd operation is left half-done.
#define STEP_PROLOGUE                                    \
  const int d = int(tgid.z);                             \
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg); \
  const int n0 = int(tgid.y) * NB;                       \
  const bool unit = u < p.H

// After the simdgroup's sums: lane j < NB finishes batch row n = n0 + j; the other lanes
// (and the simdgroups past H) return.
#define STEP_LANE_ROW           \
  if (!unit) return;            \
  const int n = n0 + int(lane); \
  if (int(lane) >= NB || n >= p.N) return

// The step kernels of an op for the five batch tiles and both storage types (float32, and
// float16 with float32 arithmetic): <op>_b<NB>_<f32|f16>, the names the plan dispatches.
#define INSTANTIATE_STEP_KERNELS(op)              \
  INSTANTIATE_KERNEL(op##_b1_f32, op<float, 1>)   \
  INSTANTIATE_KERNEL(op##_b1_f16, op<half, 1>)    \
  INSTANTIATE_KERNEL(op##_b2_f32, op<float, 2>)   \
  INSTANTIATE_KERNEL(op##_b2_f16, op<half, 2>)    \
  INSTANTIATE_KERNEL(op##_b4_f32, op<float, 4>)   \
  INSTANTIATE_KERNEL(op##_b4_f16, op<half, 4>)    \
  INSTANTIATE_KERNEL(op##_b8_f32, op<float, 8>)   \
  INSTANTIATE_KERNEL(op##_b8_f16, op<half, 8>)    \
  INSTANTIATE_KERNEL(op##_b16_f32, op<float, 16>) \
  INSTANTIATE_KERNEL(op##_b16_f16, op<half, 16>)

// Activation codes: rnncore::Activation's values, which the plan passes through act_0..act_3
// and cell_act unchanged.
enum ActivationCode : int32_t { ACT_NONE, ACT_RELU, ACT_TANH, ACT_SIGMOID, ACT_HARD_SIGMOID };

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

// Time indices of processing step s (the contract's flips): at input time (x', dX') and at
// output time (state, cell, training state).
inline int time_in(constant StepParams& p, int d, int s) {
  return d == 1 || p.reverse != 0 ? p.T - 1 - s : s;
}
inline int time_out(constant StepParams& p, int d, int s) { return d == 1 ? p.T - 1 - s : s; }

inline StepTimes step_times(constant StepParams& p, int d) {
  StepTimes st;
  st.t_in = time_in(p, d, p.step);
  st.t_out = time_out(p, d, p.step);
  st.t_prev = p.step == 0 ? -1 : time_out(p, d, p.step - 1);
  return st;
}

// The mask element of batch row n, state column col (broadcast through zero strides).
template <typename T>
inline float mask_at(device const T* mask, constant StepParams& p, int n, int col) {
  return has_mask ? float(mask[n * p.mask_rs + col * p.mask_cs]) : 1.0f;
}

// Stages rows n0 .. n0 + NB - 1 of v (stride v_ld, from column col; masked: times the
// mask), columns [k0, k0 + len), into stage[j * STEP_CHUNK + i] (zeros past N): every
// thread of the threadgroup takes a share, so each element is read from device memory once
// per threadgroup. The caller brackets it with barriers.
template <typename T, typename V, int NB>
inline void stage_rows(V v, int v_ld, int col, int k0, int len, bool masked, device const T* mask,
                       constant StepParams& p, int n0, threadgroup float* stage, uint tid) {
  for (int e = int(tid); e < NB * len; e += STEP_SIMDGROUPS * SIMD_WIDTH) {
    const int j = e / len, i = e % len, n = n0 + j;
    float h = 0.0f;
    if (n < p.N) {
      h = float(v[n * v_ld + col + k0 + i]);
      if (masked) h *= mask_at(mask, p, n, col + k0 + i);
    }
    stage[j * STEP_CHUNK + i] = h;
  }
}

// acc[g][j] = sum_k v[n0 + j, k] * R[row_g, k] over one simdgroup: the threadgroup stages
// the batch tile's rows of v STEP_CHUNK columns at a time (stage_rows), then lanes stride
// over k through the G rows of R (contiguous in k, so loads coalesce), then simd_sum.
// v has rows of stride v_ld starting at column v_col; null means zeros; masked rows are
// multiplied by the mask (h~ = h * m). Every lane returns the sums (zeros where !unit).
template <typename T, int NB, int NG>
inline void recurrent_dot(device const T* v, int v_ld, int v_col, bool masked, device const T* mask,
                          device const T* R, int rows0, int rows1, int rows2, int rows3,
                          constant StepParams& p, int n0, uint lane, threadgroup float* stage,
                          uint tid, bool unit, thread float (&acc)[NG][NB]) {
  const int rows[4] = {rows0, rows1, rows2, rows3};
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NB; ++j) acc[g][j] = 0.0f;
  if (v) {
    for (int k0 = 0; k0 < p.H; k0 += STEP_CHUNK) {
      const int len = min(int(STEP_CHUNK), p.H - k0);
      stage_rows<T, device const T*, NB>(v, v_ld, v_col, k0, len, masked, mask, p, n0, stage, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (unit) {
        for (int i = int(lane); i < len; i += SIMD_WIDTH) {
          float hv[NB];
          for (int j = 0; j < NB; ++j) hv[j] = stage[j * STEP_CHUNK + i];
          for (int g = 0; g < NG; ++g) {
            const float r = float(R[rows[g] * p.H + k0 + i]);
            for (int j = 0; j < NB; ++j) acc[g][j] = fma(r, hv[j], acc[g][j]);
          }
        }
      }
      // The next chunk overwrites what other simdgroups may still read.
      threadgroup_barrier(mem_flags::mem_threadgroup);
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
// acc[j] = sum_{i < len} delta[(n0 + j) * ld + col0 + i] * rt_row[i] over one simdgroup (the
// product of a step's gate deltas with R, through a row of R^T: both reads contiguous). The
// threadgroup stages the batch tile's delta rows STEP_CHUNK columns at a time.
template <typename T, int NB>
inline void transposed_dot(device const float* delta, int ld, int col0, device const T* rt_row,
                           int len, constant StepParams& p, int n0, uint lane,
                           threadgroup float* stage, uint tid, bool unit, thread float (&acc)[NB]) {
  for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
  for (int k0 = 0; k0 < len; k0 += STEP_CHUNK) {
    const int chunk = min(int(STEP_CHUNK), len - k0);
    stage_rows<T, device const float*, NB>(delta, ld, col0, k0, chunk, false, nullptr, p, n0, stage,
                                           tid);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (unit) {
      for (int i = int(lane); i < chunk; i += SIMD_WIDTH) {
        const float r = float(rt_row[k0 + i]);
        for (int j = 0; j < NB; ++j) acc[j] = fma(stage[j * STEP_CHUNK + i], r, acc[j]);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int j = 0; j < NB; ++j) acc[j] = simd_sum(acc[j]);
}

// The carry's product into gradient step p.step: the deltas of step p.step + 1 (rows of
// `deltas` at input time, stride xp_ld, from column col0) times a row of R^T; zeros at the
// last step, which nothing follows.
template <typename T, int NB>
inline void carried_dot(device const float* deltas, int col0, device const T* rt_row, int len,
                        constant StepParams& p, int d, int n0, uint lane, threadgroup float* stage,
                        uint tid, bool unit, thread float (&acc)[NB]) {
  if (p.step + 1 < p.T) {
    transposed_dot<T, NB>(deltas + time_in(p, d, p.step + 1) * p.N * p.xp_ld, p.xp_ld, col0, rt_row,
                          len, p, n0, lane, stage, tid, unit, acc);
  } else {
    for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
  }
}

template <int NB>
inline float lane_value(thread const float (&acc)[NB], uint lane) {
  float v = 0.0f;
  for (int j = 0; j < NB; ++j) v = uint(j) == lane ? acc[j] : v;
  return v;
}
