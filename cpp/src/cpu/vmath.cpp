#include "cpu/vmath.hpp"

#include "cpu/activations.hpp"
#include "cpu/clones.hpp"
#if defined(RNNCORE_VMATH_AVX512)
#include "cpu/vmath_avx512.hpp"
#endif

namespace rnncore::cpu::vmath {
namespace {

// y = F(x) and, for the gradient forms, dy = F'(x): inlined into each clone below, where the
// compiler vectorises them for its instruction set.
template <template <class> class F, class T>
RNNCORE_VMATH_INLINE void values(const T* x, T* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = F<T>::value(x[j]);
}

template <template <class> class F, class T>
RNNCORE_VMATH_INLINE void values_and_slopes(const T* x, T* y, T* dy, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T v = F<T>::value(x[j]);
    y[j] = v;
    dy[j] = F<T>::slope(x[j], v);
  }
}

// float32 on AVX-512: the fused kernels' forms (vmath_avx512.cpp).
#if defined(RNNCORE_VMATH_AVX512)
const bool kAvx512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f"));
#define RNNCORE_AVX512_FORM(f, ...) \
  if (kAvx512) return avx512::f(__VA_ARGS__)
#else
#define RNNCORE_AVX512_FORM(f, ...)
#endif

}  // namespace

RNNCORE_CLONES void sigmoid(const float* x, float* y, int64_t n) {
  RNNCORE_AVX512_FORM(sigmoid, x, y, n);
  values<act::Sigmoid>(x, y, n);
}
RNNCORE_CLONES void tanh(const float* x, float* y, int64_t n) {
  RNNCORE_AVX512_FORM(tanh, x, y, n);
  values<act::Tanh>(x, y, n);
}
RNNCORE_CLONES void sigmoid(const double* x, double* y, int64_t n) {
  values<act::Sigmoid>(x, y, n);
}
RNNCORE_CLONES void tanh(const double* x, double* y, int64_t n) { values<act::Tanh>(x, y, n); }

RNNCORE_CLONES void sigmoid_grad(const float* x, float* y, float* dy, int64_t n) {
  RNNCORE_AVX512_FORM(sigmoid_grad, x, y, dy, n);
  values_and_slopes<act::Sigmoid>(x, y, dy, n);
}
RNNCORE_CLONES void tanh_grad(const float* x, float* y, float* dy, int64_t n) {
  RNNCORE_AVX512_FORM(tanh_grad, x, y, dy, n);
  values_and_slopes<act::Tanh>(x, y, dy, n);
}
RNNCORE_CLONES void sigmoid_grad(const double* x, double* y, double* dy, int64_t n) {
  values_and_slopes<act::Sigmoid>(x, y, dy, n);
}
RNNCORE_CLONES void tanh_grad(const double* x, double* y, double* dy, int64_t n) {
  values_and_slopes<act::Tanh>(x, y, dy, n);
}

}  // namespace rnncore::cpu::vmath
