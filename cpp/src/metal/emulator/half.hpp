// Metal's `half` for the kernels compiled as C++ (shim.hpp): float16 storage with the
// conversions Metal and numpy use.
#pragma once

#include <cstdint>
#include <cstring>

namespace rnncore::metal::emu {

// IEEE binary16 <-> binary32, round to nearest even (what Metal's half conversions and
// numpy's float16 do).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  uint32_t h, rem, halfway;
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {
    h = static_cast<uint32_t>(e) << 10 | mant >> 13;
    rem = mant & 0x1fffu;
    halfway = 0x1000u;
  }
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // a carry rounds up the exponent
  return static_cast<uint16_t>(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int32_t e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while (!(m & 0x400u));
      x = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | mant << 13;
  } else {
    x = sign | (exp - 15 + 127) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Metal's `half` as a storage type: converts from float implicitly (stores), to float
// explicitly only, so that every read in a kernel is written float(x) as Metal's overload
// rules want for mixed half/float arithmetic.
struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f) : bits(float_to_half_bits(f)) {}  // NOLINT: implicit, like Metal's
  explicit operator float() const { return half_bits_to_float(bits); }
};

}  // namespace rnncore::metal::emu
