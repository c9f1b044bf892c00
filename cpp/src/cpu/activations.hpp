// The gate activations of the contract's table (docs/semantics.md), each written once: its
// value and its slope (from the pre-activation x and the value y). Every CPU path reads
// them here, so a new activation is a new struct and a new case in with_activation().
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/vmath.hpp"
#include "rnncore/descriptors.hpp"

namespace rnncore::cpu {

namespace act {

template <class T>
struct None {
  static RNNCORE_VMATH_INLINE T value(T x) { return x; }
  static RNNCORE_VMATH_INLINE T slope(T, T) { return T(1); }
};

template <class T>
struct Relu {
  // NaN fails both tests and passes through (NaN in, NaN out); f'(NaN) = 0 as PyTorch's
  // threshold_backward gives.
  static RNNCORE_VMATH_INLINE T value(T x) { return x > T(0) ? x : (x <= T(0) ? T(0) : x); }
  static RNNCORE_VMATH_INLINE T slope(T x, T) { return x > T(0) ? T(1) : T(0); }
};

// vmath's: accurate to a few ulp for every finite x.
template <class T>
struct Tanh {
  static RNNCORE_VMATH_INLINE T value(T x) { return vmath::tanh(x); }
  static RNNCORE_VMATH_INLINE T slope(T, T y) { return T(1) - y * y; }
};

template <class T>
struct HardSigmoid {
  static RNNCORE_VMATH_INLINE T value(T x) {
    const T v = T(0.2) * x + T(0.5);
    return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
  }
  // 0.2 on the closed interval |x| <= 2.5.
  static RNNCORE_VMATH_INLINE T slope(T x, T) { return std::fabs(x) <= T(2.5) ? T(0.2) : T(0); }
};

template <class T>
struct Sigmoid {
  static RNNCORE_VMATH_INLINE T value(T x) { return vmath::sigmoid(x); }
  static RNNCORE_VMATH_INLINE T slope(T, T y) { return y * (T(1) - y); }
};

}  // namespace act

// Calls f(F{}) with F activation a's struct above for T, so that a loop over elements
// inside f sees one activation (the switch stays outside the element loop).
template <class T, class Fn>
RNNCORE_VMATH_INLINE void with_activation(Activation a, Fn&& f) {
  switch (a) {
    case Activation::None: return f(act::None<T>{});
    case Activation::Relu: return f(act::Relu<T>{});
    case Activation::Tanh: return f(act::Tanh<T>{});
    case Activation::Sigmoid: return f(act::Sigmoid<T>{});
    case Activation::HardSigmoid: return f(act::HardSigmoid<T>{});
  }
}

// out[j] = f(in[j]) for j < n; in and out may alias.
template <class T>
void activate(Activation a, const T* in, T* out, int64_t n) {
  // sigmoid and tanh through vmath's array forms, compiled for several x86 levels.
  if (a == Activation::Sigmoid) return vmath::sigmoid(in, out, n);
  if (a == Activation::Tanh) return vmath::tanh(in, out, n);
  with_activation<T>(a, [&](auto F) {
    for (int64_t j = 0; j < n; ++j) out[j] = F.value(in[j]);
  });
}

// f[j] = f(x[j]) and df[j] = f'(x[j]), the derivative from the pre-activation.
template <class T>
void activate_grad(Activation a, const T* x, T* f, T* df, int64_t n) {
  if (a == Activation::Sigmoid) return vmath::sigmoid_grad(x, f, df, n);
  if (a == Activation::Tanh) return vmath::tanh_grad(x, f, df, n);
  with_activation<T>(a, [&](auto F) {
    for (int64_t j = 0; j < n; ++j) {
      const T y = F.value(x[j]);
      df[j] = F.slope(x[j], y);
      f[j] = y;
    }
  });
}

}  // namespace rnncore::cpu
