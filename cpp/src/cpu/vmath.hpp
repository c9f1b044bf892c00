// Vectorisable float32 and float64 exp, sigmoid and tanh, accurate to a few ulp for every
// finite input (the contract asks for that, and no NaN at +-100); NaN gives NaN and +-inf the
// limits, by defined arithmetic. Written branch-free so that the compiler vectorises the array
// loops in vmath.cpp; no -ffast-math anywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

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
  // Highest degree first (shared with the AVX-512 forms below).
  static constexpr float kExpTaylor[8] = {
      1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
  static constexpr float kTanhPoly[7] = {-9.174790319e-04f, 3.356197387e-03f,  -8.807121391e-03f,
                                         2.186202857e-02f,  -5.396772056e-02f, 1.333333153e-01f,
                                         -3.333333331e-01f};
  static RNNCORE_VMATH_INLINE float exp_taylor(float r) {
    const auto& c = kExpTaylor;
    return horner(r, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
  }
  static RNNCORE_VMATH_INLINE float tanh_poly(float u) {
    const auto& c = kTanhPoly;
    return horner(u, c[0], c[1], c[2], c[3], c[4], c[5], c[6]);
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

#if defined(__AVX512F__)
// 16 floats at a time, for the AVX-512 fused kernels and the float32 array forms on AVX-512
// (vmath_avx512.cpp): the same reduction and polynomials as above (tanh: the same reduction
// and e^r's polynomial, in the form below), with vscalefps for 2^n
// (one rounding, subnormal results included) and a reciprocal estimate refined by a Newton
// step in place of each division (vdivps, at 10 cycles a vector, was a third of the LSTM's
// gate activations). tests/cpp/test_vmath_vector.cpp bounds their error.
namespace v16 {
// (maskz with every lane: the unmasked forms' undefined pass-through trips GCC's
// uninitialised warning)
constexpr __mmask16 kAll = 0xFFFF;
RNNCORE_VMATH_INLINE __m512 splat(float c) { return _mm512_set1_ps(c); }
RNNCORE_VMATH_INLINE __m512 sign_bits(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(int32_t(0x80000000u))));
}
RNNCORE_VMATH_INLINE __m512 with_sign(__m512 a, __m512 s) {  // a (sign clear) | s's sign
  return _mm512_castsi512_ps(
      _mm512_or_epi32(_mm512_castps_si512(a), _mm512_castps_si512(sign_bits(s))));
}
RNNCORE_VMATH_INLINE __m512 exp_nonpositive(__m512 x) {
  using B = Binary<float>;
  x = _mm512_maskz_max_ps(kAll, splat(B::kExpMin),
                          x);  // NaN stays NaN (max returns its second operand)
  const __m512 t = _mm512_fmadd_ps(x, splat(B::kLog2e), splat(B::kRound));
  const __m512 n = _mm512_sub_ps(t, splat(B::kRound));
  __m512 r = _mm512_fnmadd_ps(n, splat(B::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, splat(B::kLn2Lo), r);
  __m512 p = splat(B::kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, splat(B::kExpTaylor[i]));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}
// a / d for d in [1, 2]: the quotient by the estimate, then its residual times the estimate.
RNNCORE_VMATH_INLINE __m512 divide(__m512 a, __m512 d) {
  const __m512 r = _mm512_maskz_rcp14_ps(kAll, d);
  const __m512 q = _mm512_mul_ps(a, r);
  return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, q, a), r, q);
}
RNNCORE_VMATH_INLINE __m512 sigmoid(__m512 x) {
  // e^-|x|, -|x| by setting the sign bit (one instruction; abs then with_sign took two)
  const __m512 e = exp_nonpositive(_mm512_castsi512_ps(
      _mm512_or_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(int32_t(0x80000000u)))));
  const __m512 s = divide(splat(1.0f), _mm512_add_ps(splat(1.0f), e));
  return _mm512_mask_mul_ps(s, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), e, s);
}
// tanh |x| = -m / (2 + m) with m = e^-2|x| - 1 = s p + (s - 1) for -2|x| = n ln2 + r, s = 2^n
// and p = e^r - 1 (no cancellation near 0, hence no second polynomial for small x, which
// every lane paid for: 24 instructions where 33 were). Numerator and denominator each by one
// FMA from s and p, not from a rounded m, whose error the quotient would double (1.84 ulp
// over every 64th float; 2.54 from a rounded m, in a float32 emulation).
RNNCORE_VMATH_INLINE __m512 tanh(__m512 x) {
  using B = Binary<float>;
  // -2|x|, clamped where tanh rounds to 1 (NaN stays NaN: max returns its second operand)
  const __m512 y =
      _mm512_maskz_max_ps(kAll, splat(-20.0f), _mm512_mul_ps(_mm512_abs_ps(x), splat(-2.0f)));
  const __m512 t = _mm512_fmadd_ps(y, splat(B::kLog2e), splat(B::kRound));
  const __m512 n = _mm512_sub_ps(t, splat(B::kRound));
  __m512 r = _mm512_fnmadd_ps(n, splat(B::kLn2Hi), y);
  r = _mm512_fnmadd_ps(n, splat(B::kLn2Lo), r);
  // p = r + r^2 (1/2 + r/6 + ... + r^5/5040): Taylor, truncated below 0.1 ulp for |r| <= ln2/2
  const auto& c = B::kExpTaylor;
  __m512 q = splat(c[0]);
  for (int i = 1; i < 6; ++i) q = _mm512_fmadd_ps(q, r, splat(c[i]));
  const __m512 p = _mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r);
  const __m512 s = _mm512_maskz_scalef_ps(kAll, splat(1.0f), n);
  const __m512 num = _mm512_fnmadd_ps(s, p, _mm512_sub_ps(splat(1.0f), s));  // -m
  const __m512 den = _mm512_fmadd_ps(s, p, _mm512_add_ps(splat(1.0f), s));   // 2 + m
  // odd: tanh(-0) = -0
  return with_sign(divide(num, den), x);
}
}  // namespace v16
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// 8 floats at a time, for the AVX2 fused kernels' one-pass epilogues: v16's reduction and
// polynomials, 2^n applied in two halves (times_pow2; AVX2 has no vscalefps) and a true
// division (vdivps issues once per ~4 cycles at 256 bits on Zen 2 and Haswell, and the
// five activations of an LSTM unit keep the FMA pipes busier than that).
// tests/cpp/test_vmath_vector.cpp bounds their error.
namespace v8 {
RNNCORE_VMATH_INLINE __m256 splat(float c) { return _mm256_set1_ps(c); }
RNNCORE_VMATH_INLINE __m256 sign_bits(__m256 x) {
  return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u))));
}
RNNCORE_VMATH_INLINE __m256 abs(__m256 x) {
  return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u))), x);
}
RNNCORE_VMATH_INLINE __m256 exp_nonpositive(__m256 x) {
  using B = Binary<float>;
  x = _mm256_max_ps(splat(B::kExpMin), x);  // NaN stays NaN (max returns its second operand)
  const __m256 t = _mm256_fmadd_ps(x, splat(B::kLog2e), splat(B::kRound));
  const __m256 n = _mm256_sub_ps(t, splat(B::kRound));
  __m256 r = _mm256_fnmadd_ps(n, splat(B::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, splat(B::kLn2Lo), r);
  __m256 p = splat(B::kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, splat(B::kExpTaylor[i]));
  // n from t's low bits (times_pow2), as two halves n1 + n2 whose powers are normal.
  const __m256i ni =
      _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(int32_t(B::kRoundBits)));
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(B::kBias);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), B::kMantissa));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), B::kMantissa));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
RNNCORE_VMATH_INLINE __m256 sigmoid(__m256 x) {
  const __m256 e = exp_nonpositive(_mm256_or_ps(abs(x), sign_bits(splat(-1.0f))));  // e^-|x|
  const __m256 s = _mm256_div_ps(splat(1.0f), _mm256_add_ps(splat(1.0f), e));
  const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(s, _mm256_mul_ps(e, s), neg);
}
RNNCORE_VMATH_INLINE __m256 tanh(__m256 x) {
  const __m256 a = abs(x), u = _mm256_mul_ps(x, x);
  const auto& c = Binary<float>::kTanhPoly;
  __m256 q = splat(c[0]);
  for (int i = 1; i < 7; ++i) q = _mm256_fmadd_ps(q, u, splat(c[i]));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, u), q, a);
  const __m256 e = exp_nonpositive(_mm256_mul_ps(splat(-2.0f), a));
  const __m256 big = _mm256_div_ps(_mm256_sub_ps(splat(1.0f), e), _mm256_add_ps(splat(1.0f), e));
  const __m256 lt = _mm256_cmp_ps(a, splat(Binary<float>::kTanhSmall), _CMP_LT_OQ);
  return _mm256_or_ps(_mm256_blendv_ps(big, small, lt), sign_bits(x));  // odd: tanh(-0) = -0
}
}  // namespace v8
#endif

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
