// Single-gate RNN, one time step of every direction and batch row per dispatch (contract:
// "Single-gate RNN"). Grid: (ceil(H / STEP_SIMDGROUPS), ceil(N / NB), D) threadgroups of
// STEP_SIMDGROUPS simdgroups; simdgroup sg owns hidden unit u for NB batch rows.
//
// Per step: 2*N*H*H FLOPs; R (4*H*H bytes) is read once per batch tile, the NB state rows
// once per hidden unit. Bytes and expected times: python -m rnncore cost (README.md,
// "Cost model").
#include "common.h"

template <typename T, int NB>
inline void rnn_step_at(STEP_BODY_PARAMS(FORWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const StepTimes st = step_times(p, d);
  device const T* Rd = R + d * p.H * p.H;
  device const T* v =
      st.t_prev < 0 ? (has_init_state ? h0 : nullptr) : y + st.t_prev * p.N * p.y_ld;
  float acc[1][NB];
  recurrent_dot<T, NB, 1>(v, p.y_ld, d * p.H, true, mask, Rd, u, 0, 0, 0, p, n0, lane, stage, tid,
                          sgs, unit, acc);
  STEP_LANE_ROW;
  const float pre =
      row_value<NB, 1>(acc, 0, lane) + float(xp[(st.t_in * p.N + n) * p.xp_ld + d * p.H + u]);
  if (training) z[(st.t_out * p.N + n) * p.z_ld + d * p.H + u] = T(pre);
  y[(st.t_out * p.N + n) * p.y_ld + d * p.H + u] = T(activate(act_0, pre));
}

DEFINE_STEP_KERNEL(rnn_step, FORWARD_BUFFERS, SB)
DEFINE_PERSISTENT_KERNEL(rnn_persistent, FORWARD_BUFFERS, SB, 1, rnn_step)

// Gradient step s (contract: "Gradient operations"), s = T-1 down to 0, then s = -1 for the
// init_state gradient. The carry into step s is (dX'[s+1] R) * m, read through R^T; the
// step writes dX'[s] = dh * f'(z) and h~[s] for dR (a GEMM after the loop).
// Per step: 2*N*H*H FLOPs, R^T read once per batch tile; as the forward step.
template <typename T, int NB>
inline void rnn_backward_at(STEP_BODY_PARAMS(BACKWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const int H = p.H, s = p.step, col = d * H + u;
  float acc[NB];
  carried_dot<T, NB>(dxp, d * H, rt + (d * H + u) * H, H, p, d, n0, lane, stage, tid, sgs, unit,
                     acc);
  STEP_LANE_ROW;
  const float m = mask_at(mask, p, n, col);
  const float carry_h = lane_value<NB>(acc, lane) * m;
  if (s < 0) {
    if (want_dh0) dh0[n * p.y_ld + col] = T(carry_h);
    return;
  }
  const int ti = time_in(p, d, s), to = time_out(p, d, s);
  float dh = float(dy[(to * p.N + n) * p.y_ld + col]) + carry_h;
  if (has_dh_final && s == p.T - 1) dh += float(dh_final[n * p.y_ld + col]);
  const float2 f = activate_grad(act_0, float(z[(to * p.N + n) * p.z_ld + d * H + u]));
  dxp[(ti * p.N + n) * p.xp_ld + d * H + u] = dh * f.y;
  float h_prev = 0.0f;  // rebuilt from the training state: the op does not receive h
  if (s > 0)
    h_prev = activate(act_0, float(z[(time_out(p, d, s - 1) * p.N + n) * p.z_ld + d * H + u]));
  else if (has_init_state)
    h_prev = float(h0[n * p.y_ld + col]);
  htilde[(ti * p.N + n) * p.y_ld + col] = h_prev * m;
}

DEFINE_STEP_KERNEL(rnn_backward, BACKWARD_BUFFERS, BB)
DEFINE_PERSISTENT_KERNEL(rnn_backward_persistent, BACKWARD_BUFFERS, BB, -1, rnn_backward)
