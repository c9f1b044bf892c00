// vmath's float32 array forms on AVX-512 (built with -mavx512f; vmath.cpp calls them when the
// processor has it): the fused kernels' activations (vmath::v16), so that a training forward
// and the backward pass that recomputes its activations agree, and the backward gains the
// same speed.
#include "cpu/vmath_avx512.hpp"

#include "cpu/vmath.hpp"

namespace rnncore::cpu::vmath::avx512 {
namespace {

// y = F(x) (and dy = slope(y)) 16 at a time; the tail by masked loads and stores.
template <class F, class D>
void map(const float* x, float* y, float* dy, int64_t n, F f, D slope) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1);
    const __m512 v = f(_mm512_maskz_loadu_ps(m, x + j));
    if (dy) _mm512_mask_storeu_ps(dy + j, m, slope(v));
    _mm512_mask_storeu_ps(y + j, m, v);
  }
}

const auto sigmoid_slope = [](__m512 s) {  // s (1 - s)
  return _mm512_mul_ps(s, _mm512_sub_ps(_mm512_set1_ps(1.0f), s));
};
const auto tanh_slope = [](__m512 t) {  // 1 - t^2
  return _mm512_fnmadd_ps(t, t, _mm512_set1_ps(1.0f));
};
const auto sig = [](__m512 v) { return v16::sigmoid(v); };
const auto th = [](__m512 v) { return v16::tanh(v); };

}  // namespace

void sigmoid(const float* x, float* y, int64_t n) { map(x, y, nullptr, n, sig, sigmoid_slope); }
void tanh(const float* x, float* y, int64_t n) { map(x, y, nullptr, n, th, tanh_slope); }
void sigmoid_grad(const float* x, float* y, float* dy, int64_t n) {
  map(x, y, dy, n, sig, sigmoid_slope);
}
void tanh_grad(const float* x, float* y, float* dy, int64_t n) { map(x, y, dy, n, th, tanh_slope); }

}  // namespace rnncore::cpu::vmath::avx512
