// LSTM on the CPU (contract: "LSTM"): back-propagation through time, and the forward of the
// BLAS path (RNNCORE_CPU_PATH=blas; the default forward is fused_kernels.hpp's). Per step
// one recurrent product and one pass over the gates.
#include "cpu/activations.hpp"
#include "cpu/narrow.hpp"
#include "cpu/recurrence.hpp"

namespace rnncore::cpu {

template <class T>
void lstm_forward(const Problem& p, const DirectionForward& a) {
  const int64_t T_ = p.T, N = p.N, H = p.H, G4 = 4 * H;
  // Without a cell output the cell ping-pongs between two scratch blocks.
  Scratch<T> ws(N * H * 5 + N * G4 + H);
  T* zeros = ws.take(N * H);
  T* hm = ws.take(N * H);
  T* acc = ws.take(N * G4);
  T* phi = ws.take(H);
  T* cbuf[2] = {ws.take(N * H), ws.take(N * H)};
  StepProduct<T> product(p, a);
  const T* P = static_cast<const T*>(a.peephole);
  Rows<const T> cprev =
      a.c0 ? Rows<const T>{static_cast<const T*>(a.c0), a.c0_ld} : Rows<const T>{zeros, H};
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    Rows<T> c =
        a.c ? Rows<T>{static_cast<T*>(a.c) + tout * N * a.c_ld, a.c_ld} : Rows<T>{cbuf[s & 1], H};
    product(masked(a, previous<T>(a, s, T_, N, zeros, H), N, H, hm), N, 0, G4, acc, G4);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * G4;
      const T* xr = x + n * a.xp_ld;
      const T* cp = cprev.row(n);
      for (int64_t k = 0; k < G4; ++k) pre[k] += xr[k];
      if (P)
        for (int64_t g = 0; g < 4; ++g)
          for (int64_t j = 0; j < H; ++j) pre[g * H + j] += P[g * H + j] * cp[j];
      if (z) std::memcpy(z + n * a.z_ld, pre, static_cast<size_t>(G4) * sizeof(T));
      for (int64_t g = 0; g < 4; ++g) activate(p.gate_act[g], pre + g * H, pre + g * H, H);
      const T* i = pre + p.lstm_i * H;
      const T* f = pre + p.lstm_f * H;
      const T* zg = pre + p.lstm_z * H;
      const T* o = pre + p.lstm_o * H;
      T* cr = c.row(n);
      for (int64_t j = 0; j < H; ++j) cr[j] = f[j] * cp[j] + i[j] * zg[j];
      activate(p.cell_act, cr, phi, H);
      T* yr = y + n * a.y_ld;
      for (int64_t j = 0; j < H; ++j) yr[j] = o[j] * phi[j];
    }
    cprev = {c.data, c.ld};
  }
}

// One row of a backward step: the cell gradient dc (carried in dcn, plus dc_step when
// given) and dX' of the four gates, from dh and the activated gates. Each element is
// computed as the contract's expressions read, left to right.
template <class T>
void lstm_row_gradient(int64_t H, const T* __restrict dh, const T* __restrict gi,
                       const T* __restrict gf, const T* __restrict gz, const T* __restrict go,
                       const T* __restrict dgi, const T* __restrict dgf, const T* __restrict dgz,
                       const T* __restrict dgo, const T* __restrict phi, const T* __restrict dphi,
                       const T* __restrict cp, const T* __restrict dc_step, T* __restrict dcn,
                       T* __restrict dxi, T* __restrict dxf, T* __restrict dxz, T* __restrict dxo) {
  for (int64_t j = 0; j < H; ++j) dxo[j] = dh[j] * phi[j] * dgo[j];
  if (dc_step)
    for (int64_t j = 0; j < H; ++j) dcn[j] = dh[j] * go[j] * dphi[j] + dcn[j] + dc_step[j];
  else
    for (int64_t j = 0; j < H; ++j) dcn[j] = dh[j] * go[j] * dphi[j] + dcn[j];
  for (int64_t j = 0; j < H; ++j) {
    const T dc = dcn[j];
    dxi[j] = dc * gz[j] * dgi[j];
    dxz[j] = dc * gi[j] * dgz[j];
    dxf[j] = dc * cp[j] * dgf[j];
    dcn[j] = dc * gf[j];
  }
}

// BPTT per the contract. h[t-1] (for dR) is o ⊙ φ(c) of the previous step: the step
// that activates them (the next one this loop runs) stores it; dR is one GEMM after the
// loop, and each step's dX' product is the packed kernel's.
template <class T>
void lstm_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl) {
  const int64_t T_ = p.T, N = sl.rows, TS = p.N, H = p.H, G4 = 4 * H;
  Scratch<T> ws(N * H * 3 + 3 * G4 + 6 * H);
  T* zeros = ws.take(N * H);
  T* dh_next = ws.take(N * H);
  T* dc_next = ws.take(N * H);
  T* g = ws.take(G4);   // activated gates of one row
  T* dg = ws.take(G4);  // their derivatives
  T* zw = ws.take(G4);  // a row of bfloat16 training state, widened
  T* phi = ws.take(H);
  T* dphi = ws.take(H);
  T* tmp = ws.take(H);
  T* cw = ws.take(H);  // rows of bfloat16 arrays widened (c_bits, dy_bits)
  T* cpw = ws.take(H);
  T* dyw = ws.take(H);
  T* dP = sl.dP;
  const T* P = static_cast<const T*>(a.peephole);
  const int64_t oi = p.lstm_i * H, of = p.lstm_f * H, oz = p.lstm_z * H, oo = p.lstm_o * H;
  if (a.dc_final)  // the final-cell form seeds the cell gradient of the last step
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(dc_next + n * H, static_cast<const T*>(a.dc_final) + n * a.dc_final_ld,
                  static_cast<size_t>(H) * sizeof(T));
  for (int64_t s = T_ - 1; s >= 0; --s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* z = a.z ? static_cast<const T*>(a.z) + tout * TS * a.z_ld : nullptr;
    const uint16_t* zb = a.z_bits ? a.z_bits + tout * TS * a.z_ld : nullptr;
    // The cell output, the previous step's and dy: float32 rows, or bfloat16 rows widened.
    const uint16_t* cb = a.c_bits ? a.c_bits + tout * TS * a.c_fwd_ld : nullptr;
    const uint16_t* cpb =
        a.c_bits && s > 0 ? a.c_bits + step_time(s - 1, T_, a.flip_out) * TS * a.c_fwd_ld : nullptr;
    const uint16_t* dyb = a.dy_bits ? a.dy_bits + tout * TS * a.dy_ld : nullptr;
    const T* c = cb ? nullptr : static_cast<const T*>(a.c_fwd) + tout * TS * a.c_fwd_ld;
    const Rows<const T> cp =
        cpb ? Rows<const T>{nullptr, 0}
            : previous_fwd<T>(a.c0, a.c0_ld, a.c_fwd, a.c_fwd_ld, s, T_, TS, a.flip_out, zeros, H);
    const T* dy = dyb ? nullptr : static_cast<const T*>(a.dy) + tout * TS * a.dy_ld;
    const T* dfin = s == T_ - 1 ? static_cast<const T*>(a.dh_final) : nullptr;
    const T* dcs =
        a.dc_steps ? static_cast<const T*>(a.dc_steps) + tout * TS * a.dc_steps_ld : nullptr;
    T* dx = step_dx<T>(a, tin, TS);
    for (int64_t n = 0; n < N; ++n) {
      const T* zr = zb ? widen_bfloat16_row(zb + n * a.z_ld, G4, zw) : z + n * a.z_ld;
      for (int64_t k = 0; k < 4; ++k)
        activate_grad(p.gate_act[k], zr + k * H, g + k * H, dg + k * H, H);
      const T* cr = cb ? widen_bfloat16_row(cb + n * a.c_fwd_ld, H, cw) : c + n * a.c_fwd_ld;
      activate_grad(p.cell_act, cr, phi, dphi, H);
      store_next_state(p, a, sl, s, n, g + oo, phi);
      const T* cpr = cpb ? widen_bfloat16_row(cpb + n * a.c_fwd_ld, H, cpw) : cp.row(n);
      T* dxr = dx + n * a.dxp_ld;
      T* dcn = dc_next + n * H;
      // dh of the row, then its gates' dX' (lstm_row_gradient: loops the compiler vectorises).
      const T* dyr = dyb ? widen_bfloat16_row(dyb + n * a.dy_ld, H, dyw) : dy + n * a.dy_ld;
      T* dhr = dh_next + n * H;
      for (int64_t j = 0; j < H; ++j) tmp[j] = dyr[j] + dhr[j];
      if (dfin)
        for (int64_t j = 0; j < H; ++j) tmp[j] += dfin[n * a.dh_final_ld + j];
      lstm_row_gradient(H, tmp, g + oi, g + of, g + oz, g + oo, dg + oi, dg + of, dg + oz, dg + oo,
                        phi, dphi, cpr, dcs ? dcs + n * a.dc_steps_ld : nullptr, dcn, dxr + oi,
                        dxr + of, dxr + oz, dxr + oo);
      if (P)
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t j = 0; j < H; ++j) {
            dP[n / kProductRows * G4 + k * H + j] += dxr[k * H + j] * cpr[j];
            dcn[j] += dxr[k * H + j] * P[k * H + j];
          }
    }
    end_step(p, a, sl, s, zeros, dx, G4, dh_next);
    keep_step_dx(a, dx, tin, TS, N, G4);
  }
  copy_rows(dh_next, N, H, a.dh0, a.dh0_ld);
  copy_rows(dc_next, N, H, a.dc0, a.dc0_ld);
}

template <class T>
void lstm_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all, const T*) {
  recurrent_gradient<T>(p, a, 4 * p.H, hm_all);
}

RNNCORE_INSTANTIATE_CELL(lstm, float)
RNNCORE_INSTANTIATE_CELL(lstm, double)

}  // namespace rnncore::cpu
