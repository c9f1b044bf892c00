// float16 storage on the CPU: the conversions against the compiler's own _Float16 (round to
// nearest even), through both paths: the F16C instructions (whole blocks of 8) and the
// portable code (the tails, and processors without F16C).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/narrow.hpp"

namespace {

using rnncore::cpu::narrow_half;
using rnncore::cpu::widen_half;

float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Narrow, EveryHalfWidensExactlyAndNarrowsBack) {
  std::vector<uint16_t> all(65536), back(65536), one(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> wide(65536), wide_one(65536);
  widen_half(all.data(), wide.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) widen_half(&all[i], &wide_one[i], 1);  // portable
  narrow_half(wide.data(), back.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) narrow_half(&wide[i], &one[i], 1);
  for (uint32_t i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7C00u) == 0x7C00u && (i & 0x3FFu) != 0;
    uint32_t a, b;
    std::memcpy(&a, &wide[i], 4);
    std::memcpy(&b, &wide_one[i], 4);
    if (nan) {
      EXPECT_TRUE(std::isnan(wide[i]) && std::isnan(wide_one[i])) << i;
      EXPECT_EQ(back[i] & 0x7C00u, 0x7C00u) << i;
      EXPECT_NE(one[i] & 0x3FFu, 0u) << i;
      continue;
    }
    ASSERT_EQ(a, b) << "half " << i;
    ASSERT_EQ(back[i], i) << "half " << i;
    ASSERT_EQ(one[i], i) << "half " << i;
#if defined(__FLT16_MAX__)
    ASSERT_EQ(wide[i], float(*reinterpret_cast<const _Float16*>(&all[i]))) << i;
#endif
  }
}

#if defined(__FLT16_MAX__)
TEST(Narrow, FloatsRoundToNearestEven) {
  // Every 389th float bit pattern (with both signs, subnormals, ties, overflow to infinity).
  std::vector<float> block(8);
  uint16_t got[8], single;
  uint64_t checked = 0;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 389 * 8) {
    for (int j = 0; j < 8; ++j) block[j] = bits_float(uint32_t(b + 389 * j));
    narrow_half(block.data(), got, 8);
    for (int j = 0; j < 8; ++j) {
      if (std::isnan(block[j])) continue;
      const _Float16 want = static_cast<_Float16>(block[j]);
      uint16_t w;
      std::memcpy(&w, &want, 2);
      narrow_half(&block[j], &single, 1);
      ASSERT_EQ(got[j], w) << block[j];
      ASSERT_EQ(single, w) << block[j];
      ++checked;
    }
  }
  EXPECT_GT(checked, uint64_t(10000000));
  // The exact edges: the largest half, the first value rounding to infinity, a tie
  // between subnormals, half the smallest subnormal (a tie that rounds to zero).
  const float edges[] = {65504.0f,
                         65519.996f,
                         65520.0f,
                         std::ldexp(3.0f, -25),
                         std::ldexp(1.0f, -25),
                         std::ldexp(1.0f, -24),
                         -0.0f};
  for (float f : edges) {
    const _Float16 want = static_cast<_Float16>(f);
    uint16_t w;
    std::memcpy(&w, &want, 2);
    narrow_half(&f, &single, 1);
    EXPECT_EQ(single, w) << f;
  }
}
#endif

}  // namespace
