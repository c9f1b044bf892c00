// LSTM on the CPU (contract: "LSTM"): per step one recurrent GEMM and one fused pass.
#include "cpu/activations.hpp"
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
  const T* R = static_cast<const T*>(a.R);
  const T* P = static_cast<const T*>(a.peephole);
  Rows<const T> cprev = a.c0 ? Rows<const T>{static_cast<const T*>(a.c0), a.c0_ld}
                             : Rows<const T>{zeros, H};
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    Rows<T> c = a.c ? Rows<T>{static_cast<T*>(a.c) + tout * N * a.c_ld, a.c_ld}
                    : Rows<T>{cbuf[s & 1], H};
    recurrent_product(masked(a, previous<T>(a, s, T_, N, zeros, H), N, H, hm), N, H, R, G4, acc,
                      G4);
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

template void lstm_forward<float>(const Problem&, const DirectionForward&);
template void lstm_forward<double>(const Problem&, const DirectionForward&);

}  // namespace rnncore::cpu
