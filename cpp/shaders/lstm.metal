// LSTM, one time step of every direction and batch row per dispatch (contract: "LSTM"):
// the four gate products, peepholes, activations, cell and state update in one pass.
// Grid and threadgroups as in rnn.metal; simdgroup sg owns hidden unit u, all four gates.
//
// Per step: 8*N*H*H FLOPs; R (16*H*H bytes) read once per batch tile; per batch row and
// unit 4 x' values, h[t-1], c[t-1] in, h, c (and 4 training-state values) out.
// H=256, N=32 (NB=8): 16.8 MFLOP (4.7 us at 3.6 TFLOP/s), 4 MB of R traffic per step
// (about 10 us from the system-level cache at ~400 GB/s): R traffic bound; NB=8 keeps
// it at N/8 reads of R per step. N=1: 1 MB of R, ~3-10 us, near the dispatch latency.
#include "common.h"

template <int NB>
inline void lstm_step(STEP_IMPL_PARAMS(float)) {
  const int d = int(tgid.z);
  const int u = int(tgid.x) * STEP_SIMDGROUPS + int(sg);
  const int n0 = int(tgid.y) * NB;
  if (u >= p.H) return;
  const StepTimes st = step_times(p, d);
  const int H = p.H;
  device const float *Rd = R + d * 4 * H * H;
  device const float *v = st.t_prev < 0 ? (has_init_state ? h0 : nullptr)
                                         : y + st.t_prev * p.N * p.y_ld;
  float acc[4][NB];
  recurrent_dot<NB, 4>(v, p.y_ld, d * H, true, mask, Rd, u, H + u, 2 * H + u, 3 * H + u, p,
                       n0, lane, acc);
  const int n = n0 + int(lane);
  if (int(lane) >= NB || n >= p.N) return;
  const int col = d * H + u;
  float c_prev = 0.0f;
  if (st.t_prev >= 0)
    c_prev = c[(st.t_prev * p.N + n) * p.y_ld + col];
  else if (has_init_cell)
    c_prev = c0[n * p.y_ld + col];
  device const float *x = xp + (st.t_in * p.N + n) * p.xp_ld + d * 4 * H + u;
  float pre[4];
  for (int g = 0; g < 4; ++g) {
    pre[g] = row_value<NB, 4>(acc, g, lane) + x[g * H];
    if (has_peephole) pre[g] = fma(peephole[d * 4 * H + g * H + u], c_prev, pre[g]);
  }
  if (training) {
    device float *zr = z + (st.t_out * p.N + n) * p.z_ld + d * 4 * H + u;
    for (int g = 0; g < 4; ++g) zr[g * H] = pre[g];
  }
  const float a0 = activate(act_0, pre[0]), a1 = activate(act_1, pre[1]),
              a2 = activate(act_2, pre[2]), a3 = activate(act_3, pre[3]);
  const float i = pick4(gate_a, a0, a1, a2, a3), f = pick4(gate_b, a0, a1, a2, a3),
              zc = pick4(gate_c, a0, a1, a2, a3), o = pick4(gate_d, a0, a1, a2, a3);
  const float cell = f * c_prev + i * zc;
  const int out = (st.t_out * p.N + n) * p.y_ld + col;
  c[out] = cell;
  y[out] = o * activate(cell_act, cell);
}

INSTANTIATE_STEP_KERNELS(lstm_step, lstm_step)
