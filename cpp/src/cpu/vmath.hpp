// Vectorisable float32 exp, sigmoid and tanh, accurate to a few ulp for every finite input
// (the contract asks for that, and no NaN at +-100). Written branch-free so that the
// compiler vectorises the array loops in vmath.cpp; no -ffast-math anywhere.
#pragma once

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
  x = x < -104.0f ? -104.0f : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no libm call, vectorises).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
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
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
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
  const float small = x + x * u * p;
  const float e = exp_nonpositive(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  const float signed_big = x < 0.0f ? -big : big;
  return a < 0.55f ? small : signed_big;
}

// Array forms (vmath.cpp), compiled for several x86 levels and picked at load time.
void sigmoid(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
// y = f(x), dy = f'(x).
void sigmoid_grad(const float* x, float* y, float* dy, int64_t n);
void tanh_grad(const float* x, float* y, float* dy, int64_t n);

}  // namespace rnncore::cpu::vmath
