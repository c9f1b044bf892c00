// GRU on the CPU (contract: "GRU"): back-propagation through time, and the forward of the
// BLAS path (RNNCORE_CPU_PATH=blas; the default forward is fused_kernels.hpp's).
// Reset-before needs the reset gate before the candidate's recurrent product, so it takes
// two products per step; reset-after takes one.
#include "cpu/activations.hpp"
#include "cpu/recurrence.hpp"

namespace rnncore::cpu {

template <class T>
void gru_forward(const Problem& p, const DirectionForward& a) {
  const int64_t T_ = p.T, N = p.N, H = p.H, G3 = 3 * H;
  Scratch<T> ws(N * H * 3 + N * G3);
  T* zeros = ws.take(N * H);
  T* hm = ws.take(N * H);
  T* rh = ws.take(N * H);
  T* acc = ws.take(N * G3);
  StepProduct<T> product(p, a);
  const T* b2 = static_cast<const T*>(a.b2);
  const int64_t zo = p.gru_z * H, ro = p.gru_r * H, oo = 2 * H;
  const Activation act_z = p.gate_act[p.gru_z], act_r = p.gate_act[p.gru_r], act_o = p.gate_act[2];
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    const Rows<const T> hprev = previous<T>(a, s, T_, N, zeros, H);
    const Rows<const T> h = masked(a, hprev, N, H, hm);
    // z and r are the first two blocks in either order.
    product(h, N, 0, p.gru.reset_after ? G3 : 2 * H, acc, G3);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * G3;
      const T* xr = x + n * a.xp_ld;
      for (int64_t k = 0; k < 2 * H; ++k) pre[k] += xr[k];
      if (z) std::memcpy(z + n * a.z_ld, pre, static_cast<size_t>(2 * H) * sizeof(T));
      activate(act_z, pre + zo, pre + zo, H);
      activate(act_r, pre + ro, pre + ro, H);
      if (!p.gru.reset_after) {
        const T* r = pre + ro;
        const T* hr = h.row(n);
        T* u = rh + n * H;
        for (int64_t j = 0; j < H; ++j) u[j] = r[j] * hr[j];
      }
    }
    // (the candidate block is last in both gate orders)
    if (!p.gru.reset_after) product(Rows<const T>{rh, H}, N, 2 * H, H, acc + oo, G3);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * G3;
      const T* xr = x + n * a.xp_ld;
      const T* r = pre + ro;
      T* o = pre + oo;
      T* zr = z ? z + n * a.z_ld : nullptr;
      if (p.gru.reset_after) {
        if (b2)
          for (int64_t j = 0; j < H; ++j) o[j] += b2[j];
        if (zr) {
          std::memcpy(zr + oo, o, static_cast<size_t>(H) * sizeof(T));
          std::memcpy(zr + 3 * H, xr + oo, static_cast<size_t>(H) * sizeof(T));
        }
        for (int64_t j = 0; j < H; ++j) o[j] = xr[oo + j] + r[j] * o[j];
      } else {
        for (int64_t j = 0; j < H; ++j) o[j] += xr[oo + j];
        if (zr) std::memcpy(zr + oo, o, static_cast<size_t>(H) * sizeof(T));
      }
      activate(act_o, o, o, H);
      const T* zg = pre + zo;
      const T* hp = hprev.row(n);
      T* yr = y + n * a.y_ld;
      if (p.gru.flip_z)
        for (int64_t j = 0; j < H; ++j) yr[j] = (T(1) - zg[j]) * hp[j] + zg[j] * o[j];
      else
        for (int64_t j = 0; j < H; ++j) yr[j] = zg[j] * hp[j] + (T(1) - zg[j]) * o[j];
    }
  }
}

// The gradient of one row of a backward step, as the contract's expressions read (in
// loops the compiler vectorises): the path around the gates (`direct`), and dX' of the
// update gate and of the candidate's pre-activation.
template <bool FlipZ, class T>
void gru_row_gradient(int64_t H, const T* __restrict dh, const T* __restrict zg,
                      const T* __restrict dzg, const T* __restrict og, const T* __restrict dog,
                      const T* __restrict hp, T* __restrict direct, T* __restrict dxz,
                      T* __restrict dxo) {
  for (int64_t j = 0; j < H; ++j) {
    T dz, d_o;
    if constexpr (FlipZ) {
      dz = dh[j] * (og[j] - hp[j]);
      d_o = dh[j] * zg[j];
      direct[j] = dh[j] * (T(1) - zg[j]);
    } else {
      dz = dh[j] * (hp[j] - og[j]);
      d_o = dh[j] * (T(1) - zg[j]);
      direct[j] = dh[j] * zg[j];
    }
    dxz[j] = dz * dzg[j];
    dxo[j] = d_o * dog[j];
  }
}

// Reset-after: dX' of the reset gate and δq = δa_o ⊙ r, with [δa_z, δa_r, δq] gathered for
// the step's one product.
template <class T>
void gru_reset_after_gradient(int64_t H, const T* __restrict dao, const T* __restrict q,
                              const T* __restrict r, const T* __restrict dr,
                              const T* __restrict dxz, T* __restrict dxr, T* __restrict dq,
                              T* __restrict gz, T* __restrict gr, T* __restrict gq) {
  for (int64_t j = 0; j < H; ++j) {
    dxr[j] = dao[j] * q[j] * dr[j];
    dq[j] = dao[j] * r[j];
    gz[j] = dxz[j];
    gr[j] = dxr[j];
    gq[j] = dq[j];
  }
}

// Reset-before, from δu = δa_o R_o: dX' of the reset gate, u = r ⊙ h̃ for dR, and the
// part of δh[t-1] through u.
template <class T>
void gru_reset_before_gradient(int64_t H, const T* __restrict du, const T* __restrict hm,
                               const T* __restrict r, const T* __restrict dr, T* __restrict dxr,
                               T* __restrict u, T* __restrict dh_prev) {
  for (int64_t j = 0; j < H; ++j) {
    dxr[j] = du[j] * hm[j] * dr[j];
    u[j] = r[j] * hm[j];
    dh_prev[j] = du[j] * r[j];
  }
}

// BPTT per the contract. Reset-before needs δu = δa_o R_o before δr, so it takes two
// GEMMs per step; reset-after folds δq into the one product with R.
template <class T>
void gru_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl) {
  const int64_t T_ = p.T, N = sl.rows, TS = p.N, H = p.H, G3 = 3 * H;
  Scratch<T> ws(N * H * 6 + N * G3 + 6 * H);
  T* zeros = ws.take(N * H);
  T* dh_next = ws.take(N * H);
  T* direct = ws.take(N * H);  // δh ⊙ z (or 1 - z): the path around the gates
  T* rbuf = ws.take(N * H);    // r, kept for the second pass of reset-before
  T* drbuf = ws.take(N * H);   // σ_r'(a_r)
  T* du = ws.take(N * H);
  T* hm_all = sl.hm_all;    // h̃ at input time, for dR
  T* side = sl.side;        // u = r ⊙ h̃ (reset-before) or δq (reset-after)
  T* dg = ws.take(N * G3);  // reset-after: [δa_z, δa_r, δq] in block order
  T* zg = ws.take(H);
  T* dzg = ws.take(H);
  T* og = ws.take(H);
  T* dog = ws.take(H);
  T* ao = ws.take(H);
  T* dh = ws.take(H);
  const T* R = static_cast<const T*>(a.R);
  const int64_t zo = p.gru_z * H, ro = p.gru_r * H, oo = 2 * H;
  const Activation act_z = p.gate_act[p.gru_z], act_r = p.gate_act[p.gru_r], act_o = p.gate_act[2];
  for (int64_t s = T_ - 1; s >= 0; --s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* z = static_cast<const T*>(a.z) + tout * TS * a.z_ld;
    const T* dy = static_cast<const T*>(a.dy) + tout * TS * a.dy_ld;
    const T* dfin = s == T_ - 1 ? static_cast<const T*>(a.dh_final) : nullptr;
    const Rows<const T> hp =
        previous_fwd<T>(a.h0, a.h0_ld, a.h_fwd, a.h_fwd_ld, s, T_, TS, a.flip_out, zeros, H);
    T* hm = hm_all + tin * TS * H;
    store_masked(a, hp, N, H, hm);
    T* sd = side + tin * TS * H;
    T* dx = step_dx<T>(a, tin, TS);
    for (int64_t n = 0; n < N; ++n) {
      const T* zr = z + n * a.z_ld;
      const T* hpr = hp.row(n);
      T* r = rbuf + n * H;
      T* dr = drbuf + n * H;
      activate_grad(act_z, zr + zo, zg, dzg, H);
      activate_grad(act_r, zr + ro, r, dr, H);
      if (p.gru.reset_after)  // a_o = x'_o + r ⊙ q, from the 4th and 3rd blocks of z_state
        for (int64_t j = 0; j < H; ++j) ao[j] = zr[3 * H + j] + r[j] * zr[oo + j];
      else
        std::memcpy(ao, zr + oo, static_cast<size_t>(H) * sizeof(T));
      activate_grad(act_o, ao, og, dog, H);
      T* dxr = dx + n * a.dxp_ld;
      T* dir = direct + n * H;
      const T* dyr = dy + n * a.dy_ld;
      const T* dhr = dh_next + n * H;
      for (int64_t j = 0; j < H; ++j) dh[j] = dyr[j] + dhr[j];
      if (dfin)
        for (int64_t j = 0; j < H; ++j) dh[j] += dfin[n * a.dh_final_ld + j];
      if (p.gru.flip_z)
        gru_row_gradient<true>(H, dh, zg, dzg, og, dog, hpr, dir, dxr + zo, dxr + oo);
      else
        gru_row_gradient<false>(H, dh, zg, dzg, og, dog, hpr, dir, dxr + zo, dxr + oo);
      if (p.gru.reset_after) {
        T* dgr = dg + n * G3;
        gru_reset_after_gradient(H, dxr + oo, zr + oo, r, dr, dxr + zo, dxr + ro, sd + n * H,
                                 dgr + zo, dgr + ro, dgr + oo);
      }
    }
    if (p.gru.reset_after) {
      step_product<T>(dg, G3, N, G3, R, sl.packed_R, sl.tiles, H, dh_next, H, false, R_bits(a),
                      a.R_bfloat16);
    } else {
      step_product<T>(dx + oo, a.dxp_ld, N, H, R ? R + 2 * H * H : nullptr, sl.packed_Ro, sl.tiles,
                      H, du, H, false, R_bits(a, 2 * H * H), a.R_bfloat16);
      for (int64_t n = 0; n < N; ++n) {
        const T* r = rbuf + n * H;
        const T* dr = drbuf + n * H;
        const T* hmr = hm + n * H;
        const T* dur = du + n * H;
        T* dxr = dx + n * a.dxp_ld;
        gru_reset_before_gradient(H, dur, hmr, r, dr, dxr + ro, sd + n * H, dh_next + n * H);
      }
      step_product<T>(dx, a.dxp_ld, N, 2 * H, R, sl.packed_R, sl.tiles, H, dh_next, H, true,
                      R_bits(a), a.R_bfloat16);
    }
    add_bias_rows(sl, dx, a.dxp_ld, G3);
    keep_step_dx(a, dx, tin, TS, N, G3);
    apply_mask(a, dh_next, N, H);
    for (int64_t k = 0; k < N * H; ++k) dh_next[k] += direct[k];
  }
  copy_rows(dh_next, N, H, a.dh0, a.dh0_ld);
}

template <class T>
void gru_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all,
                         const T* side) {
  const int64_t H = p.H, rows = p.T * p.N, oo = 2 * H;
  const T* dxp = static_cast<const T*>(a.dxp);
  T* dR = static_cast<T*>(a.dR);
  const uint16_t* bits = a.dxp_bits;  // (dX' as bfloat16 bits, dxp unused)
  gradient_gemm<T>(p, true, 2 * H, H, rows, dxp, a.dxp_ld, hm_all, H, dR, H, nullptr, bits);
  if (p.gru.reset_after) {
    gradient_gemm<T>(p, true, H, H, rows, side, H, hm_all, H, dR + 2 * H * H, H);
    if (a.db2) {
      T* db2 = static_cast<T*>(a.db2);
      for (int64_t j = 0; j < H; ++j) db2[j] = T(0);
      for (int64_t k = 0; k < rows; ++k)
        for (int64_t j = 0; j < H; ++j) db2[j] += side[k * H + j];
    }
  } else {
    gradient_gemm<T>(p, true, H, H, rows, bits ? nullptr : dxp + oo, a.dxp_ld, side, H,
                     dR + 2 * H * H, H, nullptr, bits ? bits + oo : nullptr);
  }
}

RNNCORE_INSTANTIATE_CELL(gru, float)
RNNCORE_INSTANTIATE_CELL(gru, double)

}  // namespace rnncore::cpu
