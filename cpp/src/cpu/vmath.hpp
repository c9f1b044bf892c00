// Vectorisable float32 and float64 exp, sigmoid and tanh, accurate to a few ulp for every
// finite input (the contract asks for that, and no NaN at +-100); NaN gives NaN and +-inf the
// limits, by defined arithmetic. Written branch-free so that the compiler vectorises the array
// loops in vmath.cpp; no -ffast-math anywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// Forced so that the per-ISA clones in vmath.cpp inline (and vectorise) them.
#if defined(__GNUC__)
#define RNNCORE_VMATH_INLINE inline __attribute__((always_inline))
#else
#define RNNCORE_VMATH_INLINE inline
#endif

namespace rnncore::cpu::vmath {

// c0 x^n + c1 x^(n-1) + ... + cn by Horner's rule: p = c0, then p = p * x + c for each c.
template <class F, class... C>
RNNCORE_VMATH_INLINE F horner(F x, F c0, C... c) {
  F p = c0;
  ((p = p * x + c), ...);
  return p;
}

// What differs between float32 and float64: the bit layout, the constants and the
// polynomials. float32: degree-7 Taylor for e^r (truncation < 0.1 ulp), an odd minimax
// polynomial for tanh below 0.55 (0.83 ulp). float64: degree-13 Taylor (< 0.01 ulp), the
// fdlibm split of ln 2, and a degree-9 minimax polynomial in x^2 for tanh below 0.55
// (<= 1 ulp, fitted against 40-digit tanh).
template <class F>
struct Binary;
template <>
struct Binary<float> {
  using U = uint32_t;
  using I = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
  static constexpr U kRoundBits = 0x4B400000u;  // the bits of kRound
  static constexpr float kExpMin = -104.0f;     // e^x underflows below
  static constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;  // 1.5 * 2^23
  // ln2 split: hi has 16 bits, n * hi is exact.
  static constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
  static constexpr float kTanhSmall = 0.55f;
  static RNNCORE_VMATH_INLINE float exp_taylor(float r) {
    return horner(r, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f,
                  1.0f, 1.0f);
  }
  static RNNCORE_VMATH_INLINE float tanh_poly(float u) {
    return horner(u, -9.174790319e-04f, 3.356197387e-03f, -8.807121391e-03f, 2.186202857e-02f,
                  -5.396772056e-02f, 1.333333153e-01f, -3.333333331e-01f);
  }
};
template <>
struct Binary<double> {
  using U = uint64_t;
  using I = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
  static constexpr U kRoundBits = 0x4338000000000000u;
  static constexpr double kExpMin = -746.0;
  static constexpr double kLog2e = 1.4426950408889634, kRound = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kTanhSmall = 0.55;
  static RNNCORE_VMATH_INLINE double exp_taylor(double r) {
    return horner(r, 1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                  1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0,
                  1.0 / 6.0, 0.5, 1.0, 1.0);
  }
  static RNNCORE_VMATH_INLINE double tanh_poly(double u) {
    return horner(u, 5.1147816968764899e-05, -0.00021050203561424953, 0.00057927128210207598,
                  -0.0014532668453533541, 0.0035917310151032094, -0.00886319609069499,
                  0.021869486110475081, -0.053968253882736641, 0.13333333333185071,
                  -0.33333333333332477);
  }
};

// p * 2^n, for t = 1.5 * 2^mantissa + n as exp_nonpositive rounds it. n is taken as an
// integer from the bits of t (one binade: the low bits count n), not by converting n,
// which is undefined for NaN. Every step is defined for any bits t may hold; for NaN the
// scale is garbage and p, hence the result, is NaN. 2^n is applied in two halves so that
// results in the subnormal range are still right.
template <class F>
RNNCORE_VMATH_INLINE F times_pow2(F p, F t) {
  using B = Binary<F>;
  typename B::U tb;
  std::memcpy(&tb, &t, sizeof(F));
  const typename B::U nb = tb - B::kRoundBits;
  typename B::I ni;
  std::memcpy(&ni, &nb, sizeof(F));
  const typename B::I n1 = ni / 2, n2 = ni - n1;  // far from overflow below
  const typename B::U b1 = static_cast<typename B::U>(n1 + B::kBias) << B::kMantissa;
  const typename B::U b2 = static_cast<typename B::U>(n2 + B::kBias) << B::kMantissa;
  F s1, s2;
  std::memcpy(&s1, &b1, sizeof(F));
  std::memcpy(&s2, &b2, sizeof(F));
  return p * s1 * s2;
}

// e^x for x <= 0 down to the underflow: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
// a Taylor polynomial for e^r, then 2^n.
template <class F>
RNNCORE_VMATH_INLINE F exp_nonpositive(F x) {
  using B = Binary<F>;
  x = x < B::kExpMin ? B::kExpMin : x;  // NaN stays NaN
  // Round to nearest by adding and subtracting 1.5 * 2^mantissa (no libm call, vectorises).
  const F t = x * B::kLog2e + B::kRound;
  const F n = t - B::kRound;
  F r = x - n * B::kLn2Hi;
  r = r - n * B::kLn2Lo;
  return times_pow2(B::exp_taylor(r), t);
}

// |x| < 0.55: odd minimax polynomial; else (1 - e) / (1 + e) with e = e^-2|x|, which has
// no cancellation there.
template <class F>
RNNCORE_VMATH_INLINE F tanh(F x) {
  const F a = x < F(0) ? -x : x;
  const F u = x * x;
  const F small = a + a * u * Binary<F>::tanh_poly(u);
  const F e = exp_nonpositive(F(-2) * a);
  const F big = (F(1) - e) / (F(1) + e);
  return std::copysign(a < Binary<F>::kTanhSmall ? small : big, x);  // odd: tanh(-0) = -0
}

template <class F>
RNNCORE_VMATH_INLINE F sigmoid(F x) {
  const F e = exp_nonpositive(x < F(0) ? x : -x);  // e^-|x|
  const F s = F(1) / (F(1) + e);
  return x >= F(0) ? s : e * s;
}

// Array forms (vmath.cpp), compiled for several x86 levels and picked at load time.
void sigmoid(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void sigmoid(const double* x, double* y, int64_t n);
void tanh(const double* x, double* y, int64_t n);
// y = f(x), dy = f'(x).
void sigmoid_grad(const float* x, float* y, float* dy, int64_t n);
void tanh_grad(const float* x, float* y, float* dy, int64_t n);
void sigmoid_grad(const double* x, double* y, double* dy, int64_t n);
void tanh_grad(const double* x, double* y, double* dy, int64_t n);

}  // namespace rnncore::cpu::vmath
