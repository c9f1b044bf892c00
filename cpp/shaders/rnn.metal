// Single-gate RNN, one time step of every direction and batch row per dispatch (contract:
// "Single-gate RNN"). Grid: (ceil(H / STEP_SIMDGROUPS), ceil(N / NB), D) threadgroups of
// STEP_SIMDGROUPS simdgroups; simdgroup sg owns hidden unit u for NB batch rows.
//
// Per step (float32, M2-class GPU at ~3.6 TFLOP/s and ~100 GB/s): 2*N*H*H FLOPs; R (4*H*H
// bytes) is read once per batch tile, so ceil(N/NB)*4*H*H bytes, mostly from the
// system-level cache after the first step; plus 4*N*H bytes each of x', h[t-1] and h[t].
// H=256, N=32 (NB=8): 4.2 MFLOP (1.2 us of ALU), 1.0 MB of R traffic (~10 us from DRAM,
// ~3 us from cache): the step is bound by R traffic and the ~5 us dispatch latency.
#include "common.h"

template <int NB>
inline void rnn_step(STEP_IMPL_PARAMS(float)) {
  const int d = int(tgid.z);
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg);
  const int n0 = int(tgid.y) * NB;
  if (u >= p.H) return;  // whole simdgroup: no simd operation is left half-done
  const StepTimes st = step_times(p, d);
  device const float *Rd = R + d * p.H * p.H;
  device const float *v = st.t_prev < 0 ? (has_init_state ? h0 : nullptr)
                                         : y + st.t_prev * p.N * p.y_ld;
  float acc[1][NB];
  recurrent_dot<NB, 1>(v, p.y_ld, d * p.H, true, mask, Rd, u, 0, 0, 0, p, n0, lane, acc);
  const int n = n0 + int(lane);
  if (int(lane) >= NB || n >= p.N) return;
  const float pre = row_value<NB, 1>(acc, 0, lane) + xp[(st.t_in * p.N + n) * p.xp_ld + d * p.H + u];
  if (training) z[(st.t_out * p.N + n) * p.z_ld + d * p.H + u] = pre;
  y[(st.t_out * p.N + n) * p.y_ld + d * p.H + u] = activate(act_0, pre);
}

INSTANTIATE_STEP_KERNELS(rnn_step, rnn_step)
