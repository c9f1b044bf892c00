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

// The params in thread memory, field by field (a copy across address spaces that every MSL
// front end takes), so that a persistent kernel can step them and the bodies read one type.
inline StepParams load_params(constant StepParams& c) {
  StepParams p;
  p.T = c.T, p.N = c.N, p.H = c.H, p.step = c.step, p.steps = c.steps, p.reverse = c.reverse;
  p.xp_ld = c.xp_ld, p.y_ld = c.y_ld, p.z_ld = c.z_ld, p.mask_rs = c.mask_rs, p.mask_cs = c.mask_cs;
  return p;
}

// The buffers of the step kernels, forward (StepBuffer indices) and gradient (BackwardBuffer),
// as X-macros: U(type, name, index) for a buffer every dispatch binds, C(type, name, index,
// constant) for one absent through its function constant. The kernels' signatures, the step
// bodies' parameters and the calls from kernel to body all expand the same list.
#define FORWARD_BUFFERS(T, U, C)                          \
  U(device const T*, xp, SB_XP)                           \
  U(device const T*, R, SB_R)                             \
  C(device const T*, h0, SB_H0, has_init_state)           \
  C(device const T*, c0, SB_C0, has_init_cell)            \
  C(device const T*, mask, SB_MASK, has_mask)             \
  C(device const T*, peephole, SB_PEEPHOLE, has_peephole) \
  C(device const T*, b2, SB_B2, has_secondary_bias)       \
  U(device T*, y, SB_Y)                                   \
  C(device T*, c, SB_C, has_cell)                         \
  C(device T*, z, SB_Z, training)                         \
  C(device T*, ws, SB_WS, has_workspace)

// Inputs and outputs are in the storage type T; what the gradient steps keep for each other
// and for the weight-gradient GEMMs (dX', R's deltas, h~, the carries) is float32, so that
// float16 storage does not round the sums that cancel (contract tolerance 1e-2 for float16).
#define BACKWARD_BUFFERS(T, U, C)                         \
  U(device const T*, rt, BB_RT)                           \
  U(device const T*, z, BB_Z)                             \
  C(device const T*, h_fwd, BB_HFWD, has_hfwd)            \
  C(device const T*, c_fwd, BB_CFWD, has_cfwd)            \
  C(device const T*, h0, BB_H0, has_init_state)           \
  C(device const T*, c0, BB_C0, has_init_cell)            \
  C(device const T*, mask, BB_MASK, has_mask)             \
  C(device const T*, peephole, BB_PEEPHOLE, has_peephole) \
  U(device const T*, dy, BB_DY)                           \
  C(device const T*, dh_final, BB_DH_FINAL, has_dh_final) \
  C(device const T*, dc_final, BB_DC_FINAL, has_dc_final) \
  C(device const T*, dc_steps, BB_DC_STEPS, has_dc_steps) \
  U(device float*, dxp, BB_DXP)                           \
  C(device float*, rdelta, BB_RDELTA, has_rdelta)         \
  U(device float*, htilde, BB_HTILDE)                     \
  C(device float*, u_in, BB_U, has_u)                     \
  U(device float*, carry, BB_CARRY)                       \
  C(device float*, cprev, BB_CPREV, has_peephole)         \
  C(device T*, dh0, BB_DH0, want_dh0)                     \
  C(device T*, dc0, BB_DC0, want_dc0)

#define KERNEL_BUFFER(type, name, index) type name [[buffer(index)]],
#define KERNEL_BUFFER_IF(type, name, index, fc) type name [[buffer(index), function_constant(fc)]],
#define BODY_BUFFER(type, name, index) type name,
#define BODY_BUFFER_IF(type, name, index, fc) type name,
#define PASS_BUFFER(type, name, index) name,
#define PASS_BUFFER_IF(type, name, index, fc) name,

// A step body: template <typename T, int NB> inline void <op>_at(STEP_BODY_PARAMS(B, T)),
// where B is FORWARD_BUFFERS or BACKWARD_BUFFERS. It computes what one threadgroup of the
// per-step grid computes (threadgroup tgid; sgs simdgroups, each owning one hidden unit) for
// the step p.step: the per-step kernels call it once, the persistent ones for every step and
// every position of the grid in turn.
#define STEP_BODY_PARAMS(B, T)                                                                    \
  B(T, BODY_BUFFER, BODY_BUFFER_IF)                                                               \
  thread const StepParams &p, threadgroup float *stage, uint3 tgid, uint tid, uint sg, uint lane, \
      int sgs

// The kernels' own parameters after their buffers (BT: SB or BB, the buffer table).
#define STEP_KERNEL_TAIL(BT)                                                                 \
  constant StepParams &params [[buffer(BT##_PARAMS)]], THREADGROUP_BUFFER(float, stage, 0),  \
      uint3 tgid [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]], \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]
#define PERSISTENT_KERNEL_TAIL(BT)                                                            \
  constant StepParams &params [[buffer(BT##_PARAMS)]], THREADGROUP_BUFFER(float, stage, 0),   \
      uint3 tg_threads [[threads_per_threadgroup]], uint tid [[thread_index_in_threadgroup]], \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

// The per-step kernel <op> of a body <op>_at: grid (ceil(N / NB), ceil(H / STEP_SIMDGROUPS),
// D), batch tiles along x so that the threadgroups sharing R's rows run together.
#define DEFINE_STEP_KERNEL(op, B, BT)                                               \
  template <typename T, int NB>                                                     \
  kernel void op(B(T, KERNEL_BUFFER, KERNEL_BUFFER_IF) STEP_KERNEL_TAIL(BT)) {      \
    const StepParams p = load_params(params);                                       \
    op##_at<T, NB>(B(T, PASS_BUFFER, PASS_BUFFER_IF) p, stage, tgid, tid, sg, lane, \
                   int(STEP_SIMDGROUPS));                                           \
  }                                                                                 \
  INSTANTIATE_STEP_KERNELS(op)

// Every position of the per-step grid for one step, in turn, by the one threadgroup of a
// persistent kernel (sgs simdgroups); then a barrier, after which the step's stores to device
// memory are visible to the whole threadgroup (the next pass reads them).
#define PERSISTENT_PASS(op, B)                                                                 \
  for (uint gz = 0; gz < grid.z; ++gz)                                                         \
    for (uint gy = 0; gy < grid.y; ++gy)                                                       \
      for (uint gx = 0; gx < grid.x; ++gx)                                                     \
        op##_at<T, NB>(B(T, PASS_BUFFER, PASS_BUFFER_IF) p, stage, uint3(gx, gy, gz), tid, sg, \
                       lane, sgs);                                                             \
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)

// A persistent kernel: one threadgroup runs params.steps steps from params.step (forward:
// upwards; gradients: downwards, to -1), each as the per-step kernel `first` (then `second`,
// for ops of two dispatches a step, but not at gradient step -1) over the whole grid, so a
// long sequence of a small problem costs one dispatch instead of one a step. The plan picks
// it for problems of a few threadgroups a step; it adapts to the threadgroup size it is given.
#define PERSISTENT_KERNEL_OPEN(name, B, BT, direction)                                     \
  template <typename T, int NB>                                                            \
  kernel void name(B(T, KERNEL_BUFFER, KERNEL_BUFFER_IF) PERSISTENT_KERNEL_TAIL(BT)) {     \
    StepParams p = load_params(params);                                                    \
    const int sgs = int(tg_threads.x) / int(SIMD_WIDTH);                                   \
    const uint3 grid =                                                                     \
        uint3(uint((p.N + NB - 1) / NB), uint((p.H + sgs - 1) / sgs), uint(p.y_ld / p.H)); \
    for (int i = 0; i < params.steps; ++i) {                                               \
      p.step = params.step + (direction)*i;
#define DEFINE_PERSISTENT_KERNEL(name, B, BT, direction, first) \
  PERSISTENT_KERNEL_OPEN(name, B, BT, direction)                \
  PERSISTENT_PASS(first, B);                                    \
  }                                                             \
  }                                                             \
  INSTANTIATE_PERSISTENT_KERNELS(name)
#define DEFINE_PERSISTENT_KERNEL2(name, B, BT, direction, first, second) \
  PERSISTENT_KERNEL_OPEN(name, B, BT, direction)                         \
  PERSISTENT_PASS(first, B);                                             \
  if (p.step >= 0) {                                                     \
    PERSISTENT_PASS(second, B);                                          \
  }                                                                      \
  }                                                                      \
  }                                                                      \
  INSTANTIATE_PERSISTENT_KERNELS(name)

// Opens every step body: simdgroup sg owns hidden unit u of direction d for batch rows
// n0 .. n0 + NB - 1. A simdgroup past H (unit false) still stages its share of the rows and
// reaches every barrier of the product, then returns whole, so no simd operation is left
// half-done.
#define STEP_PROLOGUE                        \
  const int d = int(tgid.z);                 \
  const int u = int(tgid.y) * sgs + int(sg); \
  const int n0 = int(tgid.x) * NB;           \
  const bool unit = u < p.H

// After the simdgroup's sums: lane j < NB finishes batch row n = n0 + j; the other lanes
// (and the simdgroups past H) return.
#define STEP_LANE_ROW           \
  if (!unit) return;            \
  const int n = n0 + int(lane); \
  if (int(lane) >= NB || n >= p.N) return

// bfloat16 storage needs MSL 3.1's bfloat (macOS 14): its instances exist only where the
// compiler has the type (-std=metal3.1, the emulator), in the library the host loads there.
#if defined(__HAVE_BFLOAT__)
#define INSTANTIATE_BFLOAT_KERNEL(name, ...) INSTANTIATE_KERNEL(name, __VA_ARGS__)
#else
#define INSTANTIATE_BFLOAT_KERNEL(name, ...)
#endif

// The step kernels of an op for the five batch tiles and the storage types (float32, and
// float16 and bfloat16 with float32 arithmetic): <op>_b<NB>_<f32|f16|bf16>, the names the
// plan dispatches.
#define INSTANTIATE_STEP_KERNELS(op)              \
  INSTANTIATE_PERSISTENT_KERNELS(op)              \
  INSTANTIATE_KERNEL(op##_b16_f32, op<float, 16>) \
  INSTANTIATE_KERNEL(op##_b16_f16, op<half, 16>)  \
  INSTANTIATE_BFLOAT_KERNEL(op##_b16_bf16, op<bfloat, 16>)

// The persistent kernels for batch tiles up to 8 (they loop over the tiles).
#define INSTANTIATE_PERSISTENT_KERNELS(op)               \
  INSTANTIATE_KERNEL(op##_b1_f32, op<float, 1>)          \
  INSTANTIATE_KERNEL(op##_b1_f16, op<half, 1>)           \
  INSTANTIATE_BFLOAT_KERNEL(op##_b1_bf16, op<bfloat, 1>) \
  INSTANTIATE_KERNEL(op##_b2_f32, op<float, 2>)          \
  INSTANTIATE_KERNEL(op##_b2_f16, op<half, 2>)           \
  INSTANTIATE_BFLOAT_KERNEL(op##_b2_bf16, op<bfloat, 2>) \
  INSTANTIATE_KERNEL(op##_b4_f32, op<float, 4>)          \
  INSTANTIATE_KERNEL(op##_b4_f16, op<half, 4>)           \
  INSTANTIATE_BFLOAT_KERNEL(op##_b4_bf16, op<bfloat, 4>) \
  INSTANTIATE_KERNEL(op##_b8_f32, op<float, 8>)          \
  INSTANTIATE_KERNEL(op##_b8_f16, op<half, 8>)           \
  INSTANTIATE_BFLOAT_KERNEL(op##_b8_bf16, op<bfloat, 8>)

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
inline int time_in(thread const StepParams& p, int d, int s) {
  return d == 1 || p.reverse != 0 ? p.T - 1 - s : s;
}
inline int time_out(thread const StepParams& p, int d, int s) { return d == 1 ? p.T - 1 - s : s; }

inline StepTimes step_times(thread const StepParams& p, int d) {
  StepTimes st;
  st.t_in = time_in(p, d, p.step);
  st.t_out = time_out(p, d, p.step);
  st.t_prev = p.step == 0 ? -1 : time_out(p, d, p.step - 1);
  return st;
}

// The mask element of batch row n, state column col (broadcast through zero strides).
template <typename T>
inline float mask_at(device const T* mask, thread const StepParams& p, int n, int col) {
  return has_mask ? float(mask[n * p.mask_rs + col * p.mask_cs]) : 1.0f;
}

// Stages rows n0 .. n0 + NB - 1 of v (stride v_ld, from column col; masked: times the
// mask), columns [k0, k0 + len), into stage[j * STEP_CHUNK + i] (zeros past N): every
// thread of the threadgroup takes a share, so each element is read from device memory once
// per threadgroup. The caller brackets it with barriers.
template <typename T, typename V, int NB>
inline void stage_rows(V v, int v_ld, int col, int k0, int len, bool masked, device const T* mask,
                       thread const StepParams& p, int n0, threadgroup float* stage, uint tid,
                       int sgs) {
  for (int e = int(tid); e < NB * len; e += sgs * int(SIMD_WIDTH)) {
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
                          thread const StepParams& p, int n0, uint lane, threadgroup float* stage,
                          uint tid, int sgs, bool unit, thread float (&acc)[NG][NB]) {
  const int rows[4] = {rows0, rows1, rows2, rows3};
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NB; ++j) acc[g][j] = 0.0f;
  if (v) {
    for (int k0 = 0; k0 < p.H; k0 += STEP_CHUNK) {
      const int len = min(int(STEP_CHUNK), p.H - k0);
      stage_rows<T, device const T*, NB>(v, v_ld, v_col, k0, len, masked, mask, p, n0, stage, tid,
                                         sgs);
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
                           int len, thread const StepParams& p, int n0, uint lane,
                           threadgroup float* stage, uint tid, int sgs, bool unit,
                           thread float (&acc)[NB]) {
  for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
  for (int k0 = 0; k0 < len; k0 += STEP_CHUNK) {
    const int chunk = min(int(STEP_CHUNK), len - k0);
    stage_rows<T, device const float*, NB>(delta, ld, col0, k0, chunk, false, nullptr, p, n0, stage,
                                           tid, sgs);
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
                        thread const StepParams& p, int d, int n0, uint lane,
                        threadgroup float* stage, uint tid, int sgs, bool unit,
                        thread float (&acc)[NB]) {
  if (p.step + 1 < p.T) {
    transposed_dot<T, NB>(deltas + time_in(p, d, p.step + 1) * p.N * p.xp_ld, p.xp_ld, col0, rt_row,
                          len, p, n0, lane, stage, tid, sgs, unit, acc);
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
