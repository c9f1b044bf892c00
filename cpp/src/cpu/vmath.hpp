// Vectorisable float32 exp, sigmoid and tanh, accurate to a few ulp for every finite input
// (the contract asks for that, and no NaN at +-100); NaN gives NaN and +-inf the limits,
// by defined arithmetic. Written branch-free so that the compiler vectorises the array
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

// e^x for x <= 0 down to the float underflow: Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2/2, degree-7 Taylor for e^r (truncation < 0.1 ulp), then 2^n applied in two
// halves so that results in the subnormal range are still right.
RNNCORE_VMATH_INLINE float exp_nonpositive(float x) {
  x = x < -104.0f ? -104.0f : x;  // NaN stays NaN
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no libm call, vectorises).
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = x - n * 0.693145751953125f;  // ln2 split: hi has 16 bits, n * hi is exact
  r = r - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n as an integer from the bits of t = 1.5 * 2^23 + n (one binade: the low bits count
  // n), not by converting n, which is undefined for NaN. Every step below is defined for
  // any bits t may hold; for NaN the scale is garbage and p, hence the result, is NaN.
  uint32_t tb;
  std::memcpy(&tb, &t, 4);
  const uint32_t nb = tb - 0x4B400000u;
  int32_t ni;
  std::memcpy(&ni, &nb, 4);
  const int32_t n1 = ni / 2, n2 = ni - n1;  // |n1|, |n2| <= 2^30: no overflow below
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23;
  const uint32_t b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return p * s1 * s2;
}

RNNCORE_VMATH_INLINE float sigmoid(float x) {
  const float e = exp_nonpositive(x < 0.0f ? x : -x);  // e^-|x|
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}

// |x| < 0.55: odd minimax polynomial (0.83 ulp); else (1 - e) / (1 + e) with e = e^-2|x|,
// which has no cancellation there.
RNNCORE_VMATH_INLINE float tanh(float x) {
  const float a = x < 0.0f ? -x : x;
  const float u = x * x;
  float p = -9.174790319e-04f;
  p = p * u + 3.356197387e-03f;
  p = p * u - 8.807121391e-03f;
  p = p * u + 2.186202857e-02f;
  p = p * u - 5.396772056e-02f;
  p = p * u + 1.333333153e-01f;
  p = p * u - 3.333333331e-01f;
  const float small = a + a * u * p;
  const float e = exp_nonpositive(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  return std::copysign(a < 0.55f ? small : big, x);  // odd: tanh(-0) = -0
}

// float64: the same scheme with a degree-13 Taylor polynomial for e^r (truncation
// < 0.01 ulp), the fdlibm split of ln 2, and a degree-9 minimax polynomial in x^2 for tanh
// below 0.55 (<= 1 ulp, fitted against 40-digit tanh).
RNNCORE_VMATH_INLINE double exp_nonpositive(double x) {
  x = x < -746.0 ? -746.0 : x;
  const double t = x * 1.4426950408889634 + 6755399441055744.0;
  const double n = t - 6755399441055744.0;
  double r = x - n * 6.93147180369123816490e-01;
  r = r - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t tb;
  std::memcpy(&tb, &t, 8);
  const uint64_t nb = tb - 0x4338000000000000u;
  int64_t ni;
  std::memcpy(&ni, &nb, 8);
  const int64_t n1 = ni / 2, n2 = ni - n1;
  const uint64_t b1 = static_cast<uint64_t>(n1 + 1023) << 52;
  const uint64_t b2 = static_cast<uint64_t>(n2 + 1023) << 52;
  double s1, s2;
  std::memcpy(&s1, &b1, 8);
  std::memcpy(&s2, &b2, 8);
  return p * s1 * s2;
}

RNNCORE_VMATH_INLINE double sigmoid(double x) {
  const double e = exp_nonpositive(x < 0.0 ? x : -x);
  const double s = 1.0 / (1.0 + e);
  return x >= 0.0 ? s : e * s;
}

RNNCORE_VMATH_INLINE double tanh(double x) {
  const double a = x < 0.0 ? -x : x;
  const double u = x * x;
  double p = 5.1147816968764899e-05;
  p = p * u - 0.00021050203561424953;
  p = p * u + 0.00057927128210207598;
  p = p * u - 0.0014532668453533541;
  p = p * u + 0.0035917310151032094;
  p = p * u - 0.00886319609069499;
  p = p * u + 0.021869486110475081;
  p = p * u - 0.053968253882736641;
  p = p * u + 0.13333333333185071;
  p = p * u - 0.33333333333332477;
  const double small = a + a * u * p;
  const double e = exp_nonpositive(-2.0 * a);
  const double big = (1.0 - e) / (1.0 + e);
  return std::copysign(a < 0.55 ? small : big, x);
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
