// GRU on the CPU (contract: "GRU"). Reset-before needs the reset gate before the
// candidate's recurrent product, so it takes two GEMMs per step; reset-after takes one.
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
  const T* R = static_cast<const T*>(a.R);
  const T* Ro = R + 2 * H * H;  // the candidate block is last in both gate orders
  const T* b2 = static_cast<const T*>(a.b2);
  const int64_t zo = p.gru_z * H, ro = p.gru_r * H, oo = 2 * H;
  const Activation act_z = p.gate_act[p.gru_z], act_r = p.gate_act[p.gru_r],
                   act_o = p.gate_act[2];
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    const Rows<const T> hprev = previous<T>(a, s, T_, N, zeros, H);
    const Rows<const T> h = masked(a, hprev, N, H, hm);
    // z and r are the first two blocks in either order.
    recurrent_product(h, N, H, R, p.reset_after ? G3 : 2 * H, acc, G3);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * G3;
      const T* xr = x + n * a.xp_ld;
      for (int64_t k = 0; k < 2 * H; ++k) pre[k] += xr[k];
      if (z) std::memcpy(z + n * a.z_ld, pre, static_cast<size_t>(2 * H) * sizeof(T));
      activate(act_z, pre + zo, pre + zo, H);
      activate(act_r, pre + ro, pre + ro, H);
      if (!p.reset_after) {
        const T* r = pre + ro;
        const T* hr = h.row(n);
        T* u = rh + n * H;
        for (int64_t j = 0; j < H; ++j) u[j] = r[j] * hr[j];
      }
    }
    if (!p.reset_after) recurrent_product(Rows<const T>{rh, H}, N, H, Ro, H, acc + oo, G3);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * G3;
      const T* xr = x + n * a.xp_ld;
      const T* r = pre + ro;
      T* o = pre + oo;
      T* zr = z ? z + n * a.z_ld : nullptr;
      if (p.reset_after) {
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
      if (p.flip_z)
        for (int64_t j = 0; j < H; ++j) yr[j] = (T(1) - zg[j]) * hp[j] + zg[j] * o[j];
      else
        for (int64_t j = 0; j < H; ++j) yr[j] = zg[j] * hp[j] + (T(1) - zg[j]) * o[j];
    }
  }
}

template void gru_forward<float>(const Problem&, const DirectionForward&);
template void gru_forward<double>(const Problem&, const DirectionForward&);

}  // namespace rnncore::cpu
