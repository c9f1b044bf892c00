// float16 and bfloat16 storage on the CPU (contract: storage types): arrays in 16 bits,
// arithmetic in float32. widen/narrow convert whole arrays (round to nearest even, NaN and
// infinities kept), float16 with the processor's conversion instructions where it has them
// (x86 F16C).
#pragma once

#include <cstdint>
#include <cstring>

namespace rnncore::cpu {

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
void narrow_bfloat16(const float* src, uint16_t* dst, int64_t n);

// dst[i] = float(src[i]) for the IEEE binary16 values src.
void widen_half(const uint16_t* src, float* dst, int64_t n);
// dst[i] = binary16(src[i]), rounded to nearest even; overflow gives infinity.
void narrow_half(const float* src, uint16_t* dst, int64_t n);

}  // namespace rnncore::cpu
