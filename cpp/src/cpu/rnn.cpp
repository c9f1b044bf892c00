// Single-gate RNN on the CPU (contract: "Single-gate RNN").
#include "cpu/activations.hpp"
#include "cpu/recurrence.hpp"

namespace rnncore::cpu {

template <class T>
void rnn_forward(const Problem& p, const DirectionForward& a) {
  const int64_t T_ = p.T, N = p.N, H = p.H;
  Scratch<T> ws(3 * N * H);
  T* zeros = ws.take(N * H);
  T* hm = ws.take(N * H);
  T* acc = ws.take(N * H);
  const T* R = static_cast<const T*>(a.R);
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    recurrent_product(masked(a, previous<T>(a, s, T_, N, zeros, H), N, H, hm), N, H, R, H, acc,
                      H);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * H;
      const T* xr = x + n * a.xp_ld;
      for (int64_t j = 0; j < H; ++j) pre[j] += xr[j];
      if (z) std::memcpy(z + n * a.z_ld, pre, static_cast<size_t>(H) * sizeof(T));
      activate(p.gate_act[0], pre, y + n * a.y_ld, H);
    }
  }
}

template void rnn_forward<float>(const Problem&, const DirectionForward&);
template void rnn_forward<double>(const Problem&, const DirectionForward&);

}  // namespace rnncore::cpu
