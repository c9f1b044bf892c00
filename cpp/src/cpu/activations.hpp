// Gate activations of the contract's table, applied to whole H-wide blocks so the switch
// on the activation sits outside the element loop.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu/vmath.hpp"
#include "rnncore/descriptors.hpp"

namespace rnncore::cpu {

// Exact to a few ulp for every finite x; e^-|x| never overflows, so no NaN at +-100.
template <class T>
inline T sigmoid(T x) {
  const T e = std::exp(-std::fabs(x));
  return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}

template <class T>
inline T hard_sigmoid(T x) {
  const T v = T(0.2) * x + T(0.5);
  return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
}

// out[j] = f(in[j]) for j < n; in and out may alias.
template <class T>
void activate(Activation a, const T* in, T* out, int64_t n) {
  if (a == Activation::Sigmoid) return vmath::sigmoid(in, out, n);
  if (a == Activation::Tanh) return vmath::tanh(in, out, n);
  switch (a) {
    case Activation::None:
      if (in != out)
        for (int64_t j = 0; j < n; ++j) out[j] = in[j];
      break;
    case Activation::Relu:
      // NaN fails both tests and passes through (NaN in, NaN out).
      for (int64_t j = 0; j < n; ++j)
        out[j] = in[j] > T(0) ? in[j] : (in[j] <= T(0) ? T(0) : in[j]);
      break;
    case Activation::Tanh:
      for (int64_t j = 0; j < n; ++j) out[j] = std::tanh(in[j]);
      break;
    case Activation::Sigmoid:
      for (int64_t j = 0; j < n; ++j) out[j] = sigmoid(in[j]);
      break;
    case Activation::HardSigmoid:
      for (int64_t j = 0; j < n; ++j) out[j] = hard_sigmoid(in[j]);
      break;
  }
}

// f[j] = f(x[j]) and df[j] = f'(x[j]), the derivative from the pre-activation (the
// contract's table; hard_sigmoid's slope is 0.2 on the closed interval |x| <= 2.5).
template <class T>
void activate_grad(Activation a, const T* x, T* f, T* df, int64_t n) {
  if (a == Activation::Sigmoid) return vmath::sigmoid_grad(x, f, df, n);
  if (a == Activation::Tanh) return vmath::tanh_grad(x, f, df, n);
  switch (a) {
    case Activation::None:
      for (int64_t j = 0; j < n; ++j) f[j] = x[j], df[j] = T(1);
      break;
    case Activation::Relu:
      for (int64_t j = 0; j < n; ++j) {
        // f(NaN) = NaN; f'(NaN) = 0 as PyTorch's threshold_backward gives.
        const bool on = x[j] > T(0);
        f[j] = on ? x[j] : (x[j] <= T(0) ? T(0) : x[j]);
        df[j] = on ? T(1) : T(0);
      }
      break;
    case Activation::Tanh:
      for (int64_t j = 0; j < n; ++j) {
        const T t = std::tanh(x[j]);
        f[j] = t;
        df[j] = T(1) - t * t;
      }
      break;
    case Activation::Sigmoid:
      for (int64_t j = 0; j < n; ++j) {
        const T s = sigmoid(x[j]);
        f[j] = s;
        df[j] = s * (T(1) - s);
      }
      break;
    case Activation::HardSigmoid:
      for (int64_t j = 0; j < n; ++j) {
        f[j] = hard_sigmoid(x[j]);
        df[j] = std::fabs(x[j]) <= T(2.5) ? T(0.2) : T(0);
      }
      break;
  }
}

}  // namespace rnncore::cpu
