// Metal's `half` and `bfloat` for the kernels compiled as C++ (shim.hpp): float16 and
// bfloat16 storage with the conversions Metal and numpy (ml_dtypes) use.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/narrow.hpp"

namespace rnncore::metal::emu {

inline uint16_t float_to_half_bits(float f) { return cpu::float_to_half(f); }
inline float half_bits_to_float(uint16_t h) { return cpu::half_to_float(h); }

// Metal's `half` as a storage type: converts from float implicitly (stores), to float
// explicitly only, so that every read in a kernel is written float(x) as Metal's overload
// rules want for mixed half/float arithmetic.
struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f) : bits(float_to_half_bits(f)) {}  // NOLINT: implicit, like Metal's
  explicit operator float() const { return half_bits_to_float(bits); }
};

// MSL 3.1's `bfloat` as a storage type (round to nearest even, as Metal's conversion and
// the CPU's). Both conversions are explicit, stricter than Metal: every store in a kernel is
// written T(x), the one form every MSL version's bfloat and half accept alike.
struct bfloat {
  uint16_t bits = 0;
  bfloat() = default;
  explicit bfloat(float f) : bits(cpu::float_to_bfloat16(f)) {}
  explicit operator float() const { return cpu::bfloat16_to_float(bits); }
};

}  // namespace rnncore::metal::emu
