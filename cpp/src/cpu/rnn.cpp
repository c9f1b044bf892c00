// Single-gate RNN on the CPU (contract: "Single-gate RNN"): back-propagation through time,
// and the forward of the BLAS path (RNNCORE_CPU_PATH=blas; the default forward is
// fused_kernels.hpp's).
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
  StepProduct<T> product(p, a);
  for (int64_t s = 0; s < T_; ++s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* x = static_cast<const T*>(a.xp) + tin * N * a.xp_ld;
    T* y = static_cast<T*>(a.y) + tout * N * a.y_ld;
    T* z = a.z ? static_cast<T*>(a.z) + tout * N * a.z_ld : nullptr;
    product(masked(a, previous<T>(a, s, T_, N, zeros, H), N, H, hm), N, 0, H, acc, H);
    for (int64_t n = 0; n < N; ++n) {
      T* pre = acc + n * H;
      const T* xr = x + n * a.xp_ld;
      for (int64_t j = 0; j < H; ++j) pre[j] += xr[j];
      if (z) std::memcpy(z + n * a.z_ld, pre, static_cast<size_t>(H) * sizeof(T));
      activate(p.gate_act[0], pre, y + n * a.y_ld, H);
    }
  }
}

// BPTT per the contract; dR comes from one GEMM over all steps after the loop.
template <class T>
void rnn_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl) {
  const int64_t T_ = p.T, N = sl.rows, TS = p.N, H = p.H;
  Scratch<T> ws(N * H * 2 + 2 * H);
  T* zeros = ws.take(N * H);
  T* dh_next = ws.take(N * H);
  T* f = ws.take(H);
  T* df = ws.take(H);
  const Activation act = p.gate_act[0];
  for (int64_t s = T_ - 1; s >= 0; --s) {
    const int64_t tin = step_time(s, T_, a.flip_in), tout = step_time(s, T_, a.flip_out);
    const T* z = static_cast<const T*>(a.z) + tout * TS * a.z_ld;
    const T* dy = static_cast<const T*>(a.dy) + tout * TS * a.dy_ld;
    const T* dfin = s == T_ - 1 ? static_cast<const T*>(a.dh_final) : nullptr;
    T* dx = step_dx<T>(a, tin, TS);
    for (int64_t n = 0; n < N; ++n) {
      activate_grad(act, z + n * a.z_ld, f, df, H);
      store_next_state(p, a, sl, s, n, f, static_cast<const T*>(nullptr));
      const T* dyr = dy + n * a.dy_ld;
      const T* dn = dh_next + n * H;
      T* dxr = dx + n * a.dxp_ld;
      // dh, then dX' = dh ⊙ f', in loops the compiler vectorises.
      for (int64_t j = 0; j < H; ++j) dxr[j] = dyr[j] + dn[j];
      if (dfin)
        for (int64_t j = 0; j < H; ++j) dxr[j] += dfin[n * a.dh_final_ld + j];
      for (int64_t j = 0; j < H; ++j) dxr[j] *= df[j];
    }
    end_step(p, a, sl, s, zeros, dx, H, dh_next);
    keep_step_dx(a, dx, tin, TS, N, H);
  }
  copy_rows(dh_next, N, H, a.dh0, a.dh0_ld);
}

template <class T>
void rnn_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all, const T*) {
  recurrent_gradient<T>(p, a, p.H, hm_all);
}

RNNCORE_INSTANTIATE_CELL(rnn, float)
RNNCORE_INSTANTIATE_CELL(rnn, double)

}  // namespace rnncore::cpu
