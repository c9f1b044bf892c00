#include "cpu/narrow.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RNNCORE_HAVE_F16C_PATH 1
#endif

namespace rnncore::cpu {
namespace {

// Portable conversions (IEEE 754 binary16 <-> binary32), for processors without F16C and for
// the tails of the vector loops.
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // infinity, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | uint32_t(112 - e) << 23 | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // infinity or NaN (quiet, some payload kept)
    return uint16_t(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u | ((abs >> 13) & 0x3FFu) : 0u));
  if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds past 65504: infinity
  if (abs < 0x38800000u) {               // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t e = abs >> 23, m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 .. 24
    uint32_t v = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (v & 1u))) ++v;
    return uint16_t(sign | v);
  }
  uint32_t v = abs - 0x38000000u;  // rebias the exponent (127 -> 15)
  const uint32_t rest = v & 0x1FFFu;
  v >>= 13;
  if (rest > 0x1000u || (rest == 0x1000u && (v & 1u))) ++v;  // carries into the exponent
  return uint16_t(sign | v);
}

#if defined(RNNCORE_HAVE_F16C_PATH)
__attribute__((target("avx,f16c"))) void widen_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// Every AVX2 processor has F16C (and compilers do not all name "f16c" for the builtin).
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

}  // namespace

// Plain loops the compiler vectorises (shifts and adds).
void widen_bfloat16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
}

void narrow_bfloat16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i]);
}

void widen_half(const uint16_t* src, float* dst, int64_t n) {
#if defined(RNNCORE_HAVE_F16C_PATH)
  if (has_f16c()) return widen_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void narrow_half(const float* src, uint16_t* dst, int64_t n) {
#if defined(RNNCORE_HAVE_F16C_PATH)
  if (has_f16c()) return narrow_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

}  // namespace rnncore::cpu
