// float16 and bfloat16 storage on the CPU (contract: storage types): arrays in 16 bits,
// arithmetic in float32. widen/narrow convert whole arrays (round to nearest even, NaN and
// infinities kept), float16 with the processor's conversion instructions where it has them
// (x86 F16C).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rnncore::cpu {

// IEEE 754 binary16 <-> binary32 (round to nearest even, as Metal's half and numpy's
// float16): for processors without F16C, the tails of the vector loops, the host emulator's
// half and the lengths path.
inline float half_to_float(uint16_t h) {
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

inline uint16_t float_to_half(float f) {
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

// bfloat16: the upper 16 bits of a float32. Narrowing rounds to nearest even; a NaN stays a
// (quiet) NaN whatever its payload.
inline float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
void widen_bfloat16(const uint16_t* src, float* dst, int64_t n);
// out[i] = bits[i]'s value for i < n; returns out. float32 by widen_bfloat16's loop, compiled
// for AVX2 and AVX-512 too (a row of 1024 in SSE2 here took a quarter of the LSTM's backward
// row pass).
template <class T>
const T* widen_bfloat16_row(const uint16_t* bits, int64_t n, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    widen_bfloat16(bits, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(bfloat16_to_float(bits[i]));
  }
  return out;
}
void narrow_bfloat16(const float* src, uint16_t* dst, int64_t n);

// dst[i] = float(src[i]) for the IEEE binary16 values src.
void widen_half(const uint16_t* src, float* dst, int64_t n);
// dst[i] = binary16(src[i]), rounded to nearest even; overflow gives infinity.
void narrow_half(const float* src, uint16_t* dst, int64_t n);

}  // namespace rnncore::cpu
