// GRU (contract: "GRU"). Reset-after: one dispatch per step does the three gate products
// and the update. Reset-before needs r for every unit before the candidate's product
// (a dependency across the whole grid), so it takes two dispatches per step: gru_gates
// (z and r, and u = r * h~ into the workspace) then gru_candidate (u * R_o and the update).
// Grid and threadgroups as in rnn.metal; simdgroup sg owns hidden unit u.
//
// Per step: 6*N*H*H FLOPs; R (12*H*H bytes) read once per batch tile. Bytes and expected
// times: python -m rnncore cost (README.md, "Cost model").
#include "common.h"

// The state update shared by both variants (contract: flip_z swaps z and 1 - z).
inline float gru_update(float zg, float h_prev, float o) {
  return flip_z ? (1.0f - zg) * h_prev + zg * o : zg * h_prev + (1.0f - zg) * o;
}

template <typename T>
inline float previous_state(device const T* h0, device const T* y, thread const StepParams& p,
                            StepTimes st, int n, int col) {
  if (st.t_prev >= 0) return float(y[(st.t_prev * p.N + n) * p.y_ld + col]);
  return has_init_state ? float(h0[n * p.y_ld + col]) : 0.0f;
}

// Reset-after: a_o = x'_o + r * (R_o h~ + b2).
template <typename T, int NB>
inline void gru_step_at(STEP_BODY_PARAMS(FORWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const T* Rd = R + d * 3 * H * H;
  device const T* v =
      st.t_prev < 0 ? (has_init_state ? h0 : nullptr) : y + st.t_prev * p.N * p.y_ld;
  float acc[3][NB];
  recurrent_dot<T, NB, 3>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 2 * H + u, 0, p, n0, lane,
                          stage, tid, sgs, unit, acc);
  STEP_LANE_ROW;
  const int col = d * H + u;
  device const T* x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 3 * H + u;
  const float pre0 = row_value<NB, 3>(acc, 0, lane) + float(x[0]);
  const float pre1 = row_value<NB, 3>(acc, 1, lane) + float(x[H]);
  float q = row_value<NB, 3>(acc, 2, lane);
  if (has_secondary_bias) q += float(b2[col]);
  if (training) {
    device T* zr = z + (st.t_out * p.N + n) * p.z_ld + d * 4 * H + u;
    zr[0] = T(pre0);
    zr[H] = T(pre1);
    zr[2 * H] = T(q);
    zr[3 * H] = x[2 * H];
  }
  const float a0 = activate(act_0, pre0), a1 = activate(act_1, pre1);
  const float zg = gate_a == 0 ? a0 : a1;
  const float r = gate_b == 0 ? a0 : a1;
  const float o = activate(act_2, float(x[2 * H]) + r * q);
  y[(st.t_out * p.N + n) * p.y_ld + col] =
      T(gru_update(zg, previous_state(h0, y, p, st, n, col), o));
}

// Reset-before, first dispatch: z and r; the workspace gets z (rows [0, N)) and
// u = r * h~ (rows [N, 2N)), both [N, D*H].
template <typename T, int NB>
inline void gru_gates_at(STEP_BODY_PARAMS(FORWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const T* Rd = R + d * 3 * H * H;
  device const T* v =
      st.t_prev < 0 ? (has_init_state ? h0 : nullptr) : y + st.t_prev * p.N * p.y_ld;
  float acc[2][NB];
  recurrent_dot<T, NB, 2>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 0, 0, p, n0, lane, stage, tid,
                          sgs, unit, acc);
  STEP_LANE_ROW;
  const int col = d * H + u;
  device const T* x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 3 * H + u;
  const float pre0 = row_value<NB, 2>(acc, 0, lane) + float(x[0]);
  const float pre1 = row_value<NB, 2>(acc, 1, lane) + float(x[H]);
  if (training) {
    device T* zr = z + (st.t_out * p.N + n) * p.z_ld + d * 3 * H + u;
    zr[0] = T(pre0);
    zr[H] = T(pre1);
  }
  const float a0 = activate(act_0, pre0), a1 = activate(act_1, pre1);
  const float zg = gate_a == 0 ? a0 : a1;
  const float r = gate_b == 0 ? a0 : a1;
  const float h_masked = previous_state(h0, y, p, st, n, col) * mask_at(mask, p, n, col);
  ws[n * p.y_ld + col] = T(zg);
  ws[(p.N + n) * p.y_ld + col] = T(r * h_masked);
}

// Reset-before, second dispatch: a_o = x'_o + R_o u, then the update.
template <typename T, int NB>
inline void gru_candidate_at(STEP_BODY_PARAMS(FORWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const T* Rd = R + d * 3 * H * H;
  float acc[1][NB];
  recurrent_dot<T, NB, 1>(ws + p.N * p.y_ld, p.y_ld, d * H, false, mask, Rd, 2 * H + u, 0, 0, 0, p,
                          n0, lane, stage, tid, sgs, unit, acc);
  STEP_LANE_ROW;
  const int col = d * H + u;
  const float a_o = row_value<NB, 1>(acc, 0, lane) +
                    float(xp[(st.t_in * p.N + n) * p.xp_ld + d * 3 * H + 2 * H + u]);
  if (training) z[(st.t_out * p.N + n) * p.z_ld + d * 3 * H + 2 * H + u] = T(a_o);
  y[(st.t_out * p.N + n) * p.y_ld + col] = T(gru_update(
      float(ws[n * p.y_ld + col]), previous_state(h0, y, p, st, n, col), activate(act_2, a_o)));
}

DEFINE_STEP_KERNEL(gru_step, FORWARD_BUFFERS, SB)
DEFINE_STEP_KERNEL(gru_gates, FORWARD_BUFFERS, SB)
DEFINE_STEP_KERNEL(gru_candidate, FORWARD_BUFFERS, SB)
DEFINE_PERSISTENT_KERNEL(gru_persistent, FORWARD_BUFFERS, SB, 1, gru_step)
DEFINE_PERSISTENT_KERNEL2(gru_rb_persistent, FORWARD_BUFFERS, SB, 1, gru_gates, gru_candidate)

// ---- gradients (contract: "Gradient operations") --------------------------------------------
// Gradient step s runs s = T-1 .. 0, then s = -1 for the init_state gradient. The carry into
// step s is the previous step's deltas times R (through R^T), masked, plus the direct path
// dh * z (or 1 - z) that the same unit kept in the carry workspace.

// dh into step s and the pieces of the update's derivative shared by both variants.
struct GruDeltas {
  float dz, d_o, direct;
};

inline GruDeltas gru_update_grad(float dh, float zg, float o, float h_prev) {
  GruDeltas g;
  if (flip_z) {
    g.dz = dh * (o - h_prev);
    g.d_o = dh * zg;
    g.direct = dh * (1.0f - zg);
  } else {
    g.dz = dh * (h_prev - o);
    g.d_o = dh * (1.0f - zg);
    g.direct = dh * zg;
  }
  return g;
}

template <typename T>
inline float gru_h_prev(device const T* h_fwd, device const T* h0, thread const StepParams& p,
                        int d, int s, int n, int col) {
  if (s > 0) return float(h_fwd[(time_out(p, d, s - 1) * p.N + n) * p.y_ld + col]);
  return has_init_state ? float(h0[n * p.y_ld + col]) : 0.0f;
}

// Reset-after: R sees [dz, dr, dq] (dq = da_o * r), kept in rdelta for the carry and dR.
// Per step: 6*N*H*H FLOPs, R^T (12*H*H bytes) read once per batch tile.
template <typename T, int NB>
inline void gru_backward_at(STEP_BODY_PARAMS(BACKWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const int H = p.H, s = p.step, col = d * H + u;
  float acc[NB];
  carried_dot<T, NB>(rdelta, d * 3 * H, rt + (d * H + u) * 3 * H, 3 * H, p, d, n0, lane, stage, tid,
                     sgs, unit, acc);
  STEP_LANE_ROW;
  const float m = mask_at(mask, p, n, col);
  device float* direct = carry + (CARRY_DIRECT * p.N + n) * p.y_ld + col;
  const float carry_h = s + 1 < p.T ? lane_value<NB>(acc, lane) * m + float(*direct) : 0.0f;
  if (s < 0) {
    if (want_dh0) dh0[n * p.y_ld + col] = T(carry_h);
    return;
  }
  const int ti = time_in(p, d, s), to = time_out(p, d, s);
  device const T* zr = z + (to * p.N + n) * p.z_ld + d * 4 * H + u;
  const float2 zg = activate_grad(act_at(gate_a), float(zr[gate_a * H]));
  const float2 r = activate_grad(act_at(gate_b), float(zr[gate_b * H]));
  const float q = float(zr[2 * H]);
  const float2 og = activate_grad(act_2, float(zr[3 * H]) + r.x * q);
  const float h_prev = gru_h_prev(h_fwd, h0, p, d, s, n, col);
  float dh = float(dy[(to * p.N + n) * p.y_ld + col]) + carry_h;
  if (has_dh_final && s == p.T - 1) dh += float(dh_final[n * p.y_ld + col]);
  const GruDeltas g = gru_update_grad(dh, zg.x, og.x, h_prev);
  const float da_z = g.dz * zg.y, da_o = g.d_o * og.y;
  const float da_r = da_o * q * r.y, dq = da_o * r.x;
  const int row = (ti * p.N + n) * p.xp_ld + d * 3 * H + u;
  dxp[row + gate_a * H] = da_z;
  dxp[row + gate_b * H] = da_r;
  dxp[row + 2 * H] = da_o;
  rdelta[row + gate_a * H] = da_z;
  rdelta[row + gate_b * H] = da_r;
  rdelta[row + 2 * H] = dq;
  *direct = g.direct;
  htilde[(ti * p.N + n) * p.y_ld + col] = h_prev * m;
}

// Reset-before, first dispatch of step s: the carry (da_zr[s+1] R_zr + du[s+1] * r[s+1]) * m
// + direct, then da_z and da_o. dr needs du = da_o R_o of every unit (the second dispatch).
template <typename T, int NB>
inline void gru_backward_zo_at(STEP_BODY_PARAMS(BACKWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const int H = p.H, s = p.step, col = d * H + u;
  float acc[NB];
  carried_dot<T, NB>(dxp, d * 3 * H, rt + (d * H + u) * 3 * H, 2 * H, p, d, n0, lane, stage, tid,
                     sgs, unit, acc);
  STEP_LANE_ROW;
  const float m = mask_at(mask, p, n, col);
  device float* direct = carry + (CARRY_DIRECT * p.N + n) * p.y_ld + col;
  float carry_h = 0.0f;
  if (s + 1 < p.T) {
    const int tn = time_out(p, d, s + 1);
    const float r_next =
        activate(act_at(gate_b), float(z[(tn * p.N + n) * p.z_ld + d * 3 * H + gate_b * H + u]));
    const float du_next = float(carry[(CARRY_DU * p.N + n) * p.y_ld + col]);
    carry_h = (lane_value<NB>(acc, lane) + du_next * r_next) * m + float(*direct);
  }
  if (s < 0) {
    if (want_dh0) dh0[n * p.y_ld + col] = T(carry_h);
    return;
  }
  const int ti = time_in(p, d, s), to = time_out(p, d, s);
  device const T* zr = z + (to * p.N + n) * p.z_ld + d * 3 * H + u;
  const float2 zg = activate_grad(act_at(gate_a), float(zr[gate_a * H]));
  const float2 og = activate_grad(act_2, float(zr[2 * H]));
  const float h_prev = gru_h_prev(h_fwd, h0, p, d, s, n, col);
  float dh = float(dy[(to * p.N + n) * p.y_ld + col]) + carry_h;
  if (has_dh_final && s == p.T - 1) dh += float(dh_final[n * p.y_ld + col]);
  const GruDeltas g = gru_update_grad(dh, zg.x, og.x, h_prev);
  const int row = (ti * p.N + n) * p.xp_ld + d * 3 * H + u;
  dxp[row + gate_a * H] = g.dz * zg.y;
  dxp[row + 2 * H] = g.d_o * og.y;
  *direct = g.direct;
  htilde[(ti * p.N + n) * p.y_ld + col] = h_prev * m;
}

// Reset-before, second dispatch of step s: du = da_o R_o (through R_o^T), dr = du * h~ * r',
// and u = r * h~ kept for dR's candidate rows.
template <typename T, int NB>
inline void gru_backward_r_at(STEP_BODY_PARAMS(BACKWARD_BUFFERS, T)) {
  STEP_PROLOGUE;
  const int H = p.H, s = p.step, col = d * H + u;
  const int ti = time_in(p, d, s), to = time_out(p, d, s);
  float acc[NB];
  transposed_dot<T, NB>(dxp + ti * p.N * p.xp_ld, p.xp_ld, d * 3 * H + 2 * H,
                        rt + (d * H + u) * 3 * H + 2 * H, H, p, n0, lane, stage, tid, sgs, unit,
                        acc);
  STEP_LANE_ROW;
  const float du = lane_value<NB>(acc, lane);
  const float2 r =
      activate_grad(act_at(gate_b), float(z[(to * p.N + n) * p.z_ld + d * 3 * H + gate_b * H + u]));
  const float h_masked = float(htilde[(ti * p.N + n) * p.y_ld + col]);
  dxp[(ti * p.N + n) * p.xp_ld + d * 3 * H + gate_b * H + u] = du * h_masked * r.y;
  u_in[(ti * p.N + n) * p.y_ld + col] = r.x * h_masked;
  carry[(CARRY_DU * p.N + n) * p.y_ld + col] = du;
}

DEFINE_STEP_KERNEL(gru_backward, BACKWARD_BUFFERS, BB)
DEFINE_STEP_KERNEL(gru_backward_zo, BACKWARD_BUFFERS, BB)
DEFINE_STEP_KERNEL(gru_backward_r, BACKWARD_BUFFERS, BB)
DEFINE_PERSISTENT_KERNEL(gru_backward_persistent, BACKWARD_BUFFERS, BB, -1, gru_backward)
DEFINE_PERSISTENT_KERNEL2(gru_rb_backward_persistent, BACKWARD_BUFFERS, BB, -1, gru_backward_zo,
                          gru_backward_r)
