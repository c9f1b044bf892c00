// LSTM, one time step of every direction and batch row per dispatch (contract: "LSTM"):
// the four gate products, peepholes, activations, cell and state update in one pass.
// Grid and threadgroups as in rnn.metal; simdgroup sg owns hidden unit u, all four gates.
//
// Per step: 8*N*H*H FLOPs; R (16*H*H bytes) read once per batch tile; per batch row and
// unit 4 x' values, h[t-1], c[t-1] in, h, c (and 4 training-state values) out. Bytes and
// expected times: python -m rnncore cost (README.md, "Cost model").
#include "common.h"

template <typename T, int NB>
inline void lstm_step_at(STEP_BODY_PARAMS(FORWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const T* Rd = R + d * 4 * H * H;
  device const T* v =
      st.t_prev < 0 ? (has_init_state ? h0 : nullptr) : y + st.t_prev * p.N * p.y_ld;
  float acc[4][NB];
  recurrent_dot<T, NB, 4>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 2 * H + u, 3 * H + u, p, n0,
                          lane, stage, tid, sgs, unit, acc);
  STEP_LANE_ROW;
  const int col = d * H + u;
  float c_prev = 0.0f;
  if (st.t_prev >= 0)
    c_prev = float(c[(st.t_prev * p.N + n) * p.y_ld + col]);
  else if (has_init_cell)
    c_prev = float(c0[n * p.y_ld + col]);
  device const T* x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 4 * H + u;
  float pre[4];
  for (int g = 0; g < 4; ++g) {
    pre[g] = row_value<NB, 4>(acc, g, lane) + float(x[g * H]);
    if (has_peephole) pre[g] = fma(float(peephole[d * 4 * H + g * H + u]), c_prev, pre[g]);
  }
  if (training) {
    device T* zr = z + (st.t_out * p.N + n) * p.z_ld + d * 4 * H + u;
    for (int g = 0; g < 4; ++g) zr[g * H] = T(pre[g]);
  }
  const float a0 = activate(act_0, pre[0]), a1 = activate(act_1, pre[1]),
              a2 = activate(act_2, pre[2]), a3 = activate(act_3, pre[3]);
  const float i = pick4(gate_a, a0, a1, a2, a3), f = pick4(gate_b, a0, a1, a2, a3),
              zc = pick4(gate_c, a0, a1, a2, a3), o = pick4(gate_d, a0, a1, a2, a3);
  const float cell = f * c_prev + i * zc;
  const int out = (st.t_out * p.N + n) * p.y_ld + col;
  c[out] = T(cell);
  y[out] = T(o * activate(cell_act, cell));
}

DEFINE_STEP_KERNEL(lstm_step, FORWARD_BUFFERS, SB)
DEFINE_PERSISTENT_KERNEL(lstm_persistent, FORWARD_BUFFERS, SB, 1, lstm_step)

// Gradient step s (s = T-1 .. 0, then -1 for init_state / init_cell). The carry into step
// s is (dX'[s+1] R) * m through R^T (4H long rows); the cell carry stays with the unit in
// the carry workspace. h~[s] for dR is o * phi(c) of step s-1, rebuilt from the training
// state and the cell output. Per step: 8*N*H*H FLOPs, R^T read once per batch tile.
template <typename T, int NB>
inline void lstm_backward_at(STEP_BODY_PARAMS(BACKWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const int H = p.H, s = p.step, col = d * H + u;
  float acc[NB];
  carried_dot<T, NB>(dxp, d * 4 * H, rt + (d * H + u) * 4 * H, 4 * H, p, d, n0, lane, stage, tid,
                     sgs, unit, acc);
  STEP_LANE_ROW;
  const float m = mask_at(mask, p, n, col);
  const float carry_h = lane_value<NB>(acc, lane) * m;
  device float* dc_carry = carry + (CARRY_CELL * p.N + n) * p.y_ld + col;
  if (s < 0) {
    if (want_dh0) dh0[n * p.y_ld + col] = T(carry_h);
    if (want_dc0) dc0[n * p.y_ld + col] = T(*dc_carry);
    return;
  }
  const int ti = time_in(p, d, s), to = time_out(p, d, s);
  device const T* zr = z + (to * p.N + n) * p.z_ld + d * 4 * H + u;
  const float2 g0 = activate_grad(act_0, float(zr[0])), g1 = activate_grad(act_1, float(zr[H])),
               g2 = activate_grad(act_2, float(zr[2 * H])),
               g3 = activate_grad(act_3, float(zr[3 * H]));
  const float2 gi = gate_a == 0 ? g0 : gate_a == 1 ? g1 : gate_a == 2 ? g2 : g3;
  const float2 gf = gate_b == 0 ? g0 : gate_b == 1 ? g1 : gate_b == 2 ? g2 : g3;
  const float2 gz = gate_c == 0 ? g0 : gate_c == 1 ? g1 : gate_c == 2 ? g2 : g3;
  const float2 go = gate_d == 0 ? g0 : gate_d == 1 ? g1 : gate_d == 2 ? g2 : g3;
  const float2 phi = activate_grad(cell_act, float(c_fwd[(to * p.N + n) * p.y_ld + col]));
  float c_prev = 0.0f;
  if (s > 0)
    c_prev = float(c_fwd[(time_out(p, d, s - 1) * p.N + n) * p.y_ld + col]);
  else if (has_init_cell)
    c_prev = float(c0[n * p.y_ld + col]);

  float dh = float(dy[(to * p.N + n) * p.y_ld + col]) + carry_h;
  if (has_dh_final && s == p.T - 1) dh += float(dh_final[n * p.y_ld + col]);
  float dc_in = 0.0f;
  if (s < p.T - 1)
    dc_in = float(*dc_carry);
  else if (has_dc_final)
    dc_in = float(dc_final[n * p.y_ld + col]);
  float dc = dh * go.x * phi.y + dc_in;
  if (has_dc_steps) dc += float(dc_steps[(to * p.N + n) * p.y_ld + col]);
  const float d_o = dh * phi.x * go.y, d_i = dc * gz.x * gi.y, d_z = dc * gi.x * gz.y,
              d_f = dc * c_prev * gf.y;
  device float* dx = dxp + (ti * p.N + n) * p.xp_ld + d * 4 * H + u;
  dx[gate_a * H] = d_i;
  dx[gate_b * H] = d_f;
  dx[gate_c * H] = d_z;
  dx[gate_d * H] = d_o;
  float dc_next = dc * gf.x;
  if (has_peephole) {
    device const T* P = peephole + d * 4 * H + u;
    for (int k = 0; k < 4; ++k) {
      const float dk = k == gate_a ? d_i : k == gate_b ? d_f : k == gate_c ? d_z : d_o;
      dc_next = fma(dk, float(P[k * H]), dc_next);
    }
    cprev[(ti * p.N + n) * p.y_ld + col] = c_prev;
  }
  *dc_carry = dc_next;
  float h_prev = 0.0f;
  if (s > 0) {
    const int tp = time_out(p, d, s - 1);
    const float o_prev =
        activate(act_at(gate_d), float(z[(tp * p.N + n) * p.z_ld + d * 4 * H + gate_d * H + u]));
    h_prev = o_prev * activate(cell_act, c_prev);
  } else if (has_init_state) {
    h_prev = float(h0[n * p.y_ld + col]);
  }
  htilde[(ti * p.N + n) * p.y_ld + col] = h_prev * m;
}

DEFINE_STEP_KERNEL(lstm_backward, BACKWARD_BUFFERS, BB)
DEFINE_PERSISTENT_KERNEL(lstm_backward_persistent, BACKWARD_BUFFERS, BB, -1, lstm_backward)
