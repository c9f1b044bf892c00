// GRU (contract: "GRU"). Reset-after: one dispatch per step does the three gate products
// and the update. Reset-before needs r for every unit before the candidate's product
// (a dependency across the whole grid), so it takes two dispatches per step: gru_gates
// (z and r, and u = r * h~ into the workspace) then gru_candidate (u * R_o and the update).
// Grid and threadgroups as in rnn.metal; simdgroup sg owns hidden unit u.
//
// Per step: 6*N*H*H FLOPs; R (12*H*H bytes) read once per batch tile.
// H=256, N=32 (NB=8): 12.6 MFLOP (3.5 us at 3.6 TFLOP/s), 3 MB of R traffic (~8 us from
// the system-level cache); reset-before adds a second dispatch (~5 us latency) per step.
#include "common.h"

// The state update shared by both variants (contract: flip_z swaps z and 1 - z).
inline float gru_update(float zg, float h_prev, float o) {
  return flip_z ? (1.0f - zg) * h_prev + zg * o : zg * h_prev + (1.0f - zg) * o;
}

inline float previous_state(device const float *h0, device const float *y,
                            constant StepParams &p, StepTimes st, int n, int col) {
  if (st.t_prev >= 0) return y[(st.t_prev * p.N + n) * p.y_ld + col];
  return has_init_state ? h0[n * p.y_ld + col] : 0.0f;
}

// Reset-after: a_o = x'_o + r * (R_o h~ + b2).
template <int NB>
inline void gru_step(STEP_IMPL_PARAMS(float)) {
  const int d = int(tgid.z);
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg);
  const int n0 = int(tgid.y) * NB;
  if (u >= p.H) return;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const float *Rd = R + d * 3 * H * H;
  device const float *v = st.t_prev < 0 ? (has_init_state ? h0 : nullptr)
                                         : y + st.t_prev * p.N * p.y_ld;
  float acc[3][NB];
  recurrent_dot<NB, 3>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 2 * H + u, 0, p, n0, lane,
                       acc);
  const int n = n0 + int(lane);
  if (int(lane) >= NB || n >= p.N) return;
  const int col = d * H + u;
  device const float *x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 3 * H + u;
  const float pre0 = row_value<NB, 3>(acc, 0, lane) + x[0];
  const float pre1 = row_value<NB, 3>(acc, 1, lane) + x[H];
  float q = row_value<NB, 3>(acc, 2, lane);
  if (has_secondary_bias) q += b2[col];
  if (training) {
    device float *zr = z + (st.t_out * p.N + n) * p.z_ld + d * 4 * H + u;
    zr[0] = pre0;
    zr[H] = pre1;
    zr[2 * H] = q;
    zr[3 * H] = x[2 * H];
  }
  const float a0 = activate(act_0, pre0), a1 = activate(act_1, pre1);
  const float zg = gate_a == 0 ? a0 : a1;
  const float r = gate_b == 0 ? a0 : a1;
  const float o = activate(act_2, x[2 * H] + r * q);
  y[(st.t_out * p.N + n) * p.y_ld + col] =
      gru_update(zg, previous_state(h0, y, p, st, n, col), o);
}

// Reset-before, first dispatch: z and r; the workspace gets z (rows [0, N)) and
// u = r * h~ (rows [N, 2N)), both [N, D*H].
template <int NB>
inline void gru_gates(STEP_IMPL_PARAMS(float)) {
  const int d = int(tgid.z);
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg);
  const int n0 = int(tgid.y) * NB;
  if (u >= p.H) return;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const float *Rd = R + d * 3 * H * H;
  device const float *v = st.t_prev < 0 ? (has_init_state ? h0 : nullptr)
                                         : y + st.t_prev * p.N * p.y_ld;
  float acc[2][NB];
  recurrent_dot<NB, 2>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 0, 0, p, n0, lane, acc);
  const int n = n0 + int(lane);
  if (int(lane) >= NB || n >= p.N) return;
  const int col = d * H + u;
  device const float *x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 3 * H + u;
  const float pre0 = row_value<NB, 2>(acc, 0, lane) + x[0];
  const float pre1 = row_value<NB, 2>(acc, 1, lane) + x[H];
  if (training) {
    device float *zr = z + (st.t_out * p.N + n) * p.z_ld + d * 3 * H + u;
    zr[0] = pre0;
    zr[H] = pre1;
  }
  const float a0 = activate(act_0, pre0), a1 = activate(act_1, pre1);
  const float zg = gate_a == 0 ? a0 : a1;
  const float r = gate_b == 0 ? a0 : a1;
  const float h_masked = previous_state(h0, y, p, st, n, col) * mask_at(mask, p, n, col);
  ws[n * p.y_ld + col] = zg;
  ws[(p.N + n) * p.y_ld + col] = r * h_masked;
}

// Reset-before, second dispatch: a_o = x'_o + R_o u, then the update.
template <int NB>
inline void gru_candidate(STEP_IMPL_PARAMS(float)) {
  const int d = int(tgid.z);
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg);
  const int n0 = int(tgid.y) * NB;
  if (u >= p.H) return;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const float *Rd = R + d * 3 * H * H;
  float acc[1][NB];
  recurrent_dot<NB, 1>(ws + p.N * p.y_ld, p.y_ld, d * H, false, mask, Rd, 2 * H + u, 0, 0, 0,
                       p, n0, lane, acc);
  const int n = n0 + int(lane);
  if (int(lane) >= NB || n >= p.N) return;
  const int col = d * H + u;
  const float a_o =
      row_value<NB, 1>(acc, 0, lane) + xp[(st.t_in * p.N + n) * p.xp_ld + d * 3 * H + 2 * H + u];
  if (training) z[(st.t_out * p.N + n) * p.z_ld + d * 3 * H + 2 * H + u] = a_o;
  y[(st.t_out * p.N + n) * p.y_ld + col] =
      gru_update(ws[n * p.y_ld + col], previous_state(h0, y, p, st, n, col),
                 activate(act_2, a_o));
}

INSTANTIATE_STEP_KERNELS(gru_step, gru_step)
INSTANTIATE_STEP_KERNELS(gru_gates, gru_gates)
INSTANTIATE_STEP_KERNELS(gru_candidate, gru_candidate)
