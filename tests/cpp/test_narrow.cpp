// float16 storage on the CPU: the conversions against the compiler's own _Float16 (round to
// nearest even), through both paths: the F16C instructions (whole blocks of 8) and the
// portable code (the tails, and processors without F16C).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/fused.hpp"
#include "cpu/narrow.hpp"
#include "rnncore/info.hpp"

namespace {

using rnncore::cpu::narrow_half;
using rnncore::cpu::widen_half;

// The compiler's own half type. __FLT16_MAX__ alone does not say that C++ has _Float16:
// GCC before 13 defines it on AArch64 but has _Float16 in C++ only on x86; on ARM, its
// __fp16 (IEEE format: float -> __fp16 is one rounding, to nearest even) serves instead.
#if defined(__FLT16_MAX__) && \
    (defined(__clang__) || __GNUC__ >= 13 || defined(__x86_64__) || defined(__i386__))
using CompilerHalf = _Float16;
#define RNNCORE_TEST_COMPILER_HALF 1
#elif defined(__ARM_FP16_FORMAT_IEEE)
using CompilerHalf = __fp16;
#define RNNCORE_TEST_COMPILER_HALF 1
#endif

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
#if defined(RNNCORE_TEST_COMPILER_HALF)
    ASSERT_EQ(wide[i], float(*reinterpret_cast<const CompilerHalf*>(&all[i]))) << i;
#endif
  }
}

// Arrays of several 64k-element blocks are converted by the pool's threads: every element
// as it is alone, a ragged last block included.
TEST(Narrow, WholeArraysConvertAsTheirElementsDo) {
  const int64_t n = 3 * 65536 + 77;
  std::mt19937 gen(7);
  std::vector<float> x(static_cast<size_t>(n));
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = bits_float(static_cast<uint32_t>(gen()));
    bits[i] = static_cast<uint16_t>(gen());
  }
  std::vector<uint16_t> got(static_cast<size_t>(n)), one(1);
  std::vector<float> wide(static_cast<size_t>(n)), single(1);
  // (F16C quiets a signalling NaN that the portable path keeps: NaN is all that is asked)
  const auto same = [](float a, float b) {
    return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b));
  };
  narrow_half(x.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    narrow_half(&x[i], one.data(), 1);
    ASSERT_EQ(got[i], one[0]) << i;
  }
  rnncore::cpu::narrow_bfloat16(x.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    rnncore::cpu::narrow_bfloat16(&x[i], one.data(), 1);
    ASSERT_EQ(got[i], one[0]) << i;
  }
  widen_half(bits.data(), wide.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    widen_half(&bits[i], single.data(), 1);
    ASSERT_TRUE(same(wide[i], single[0])) << i;
  }
  rnncore::cpu::widen_bfloat16(bits.data(), wide.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    rnncore::cpu::widen_bfloat16(&bits[i], single.data(), 1);
    ASSERT_TRUE(same(wide[i], single[0])) << i;
  }
}

#if defined(RNNCORE_TEST_COMPILER_HALF)
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
      const CompilerHalf want = static_cast<CompilerHalf>(block[j]);
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
    const CompilerHalf want = static_cast<CompilerHalf>(f);
    uint16_t w;
    std::memcpy(&w, &want, 2);
    narrow_half(&f, &single, 1);
    EXPECT_EQ(single, w) << f;
  }
}
#endif

// The GEMM of bfloat16 storage's gradients (AMX only): the product of the operands rounded
// to bfloat16 (nearest even), in float32 sums: against float64 on the rounded operands
// within 2.5e-7 of the terms' magnitudes (float32's rounding of the sums), and not the
// product of the unrounded ones (up to 2^-8 of a term off). Shapes: whole 32-blocks
// (C written in place), ragged edges, Aᵀ B computed as (Bᵀ A)ᵀ, K in two L2 chunks, and
// one operand exact in bfloat16.
TEST(TileGemm, IsTheProductOfTheOperandsRoundedToBfloat16) {
  const auto gemm = rnncore::cpu::fused_kernels().f32.tile_gemm;
  if (!gemm) GTEST_SKIP() << "no AVX-512 BF16 kernels on this CPU";
  struct Case {
    bool trans_a;
    int64_t M, n, K;
    bool exact_b;
  };
  const Case cases[] = {
      {false, 64, 32, 40, false},  {false, 33, 17, 1, false}, {false, 1, 1, 1, false},
      {true, 100, 30, 700, false}, {true, 20, 70, 33, true},  {true, 31, 20, 5000, false},
      {false, 96, 64, 300, true},  {true, 64, 64, 64, false}, {true, 200, 256, 3000, false}};
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  const auto rounded = [](float x) {
    return double(rnncore::cpu::bfloat16_to_float(rnncore::cpu::float_to_bfloat16(x)));
  };
  for (const Case& c : cases) {
    const int64_t lda = c.trans_a ? c.M + 3 : c.K + 5, ldb = c.n + 2, ldc = c.n + 1;
    std::vector<float> A((c.trans_a ? c.K : c.M) * lda), B(c.K * ldb), C(c.M * ldc, -1.0f);
    for (float& x : A) x = normal(gen);
    for (float& x : B) x = c.exact_b ? float(rounded(normal(gen))) : normal(gen);
    gemm(c.trans_a, c.M, c.n, c.K, A.data(), lda, B.data(), ldb, C.data(), ldc, nullptr);
    double worst = 0, off = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, mag = 0, exact = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const float a = c.trans_a ? A[k * lda + m] : A[m * lda + k], b = B[k * ldb + j];
          const double t = rounded(a) * rounded(b);
          sum += t;
          mag += std::abs(t);
          exact += double(a) * b;
        }
        worst = std::max(worst, std::abs(C[m * ldc + j] - sum) / mag);
        off = std::max(off, std::abs(C[m * ldc + j] - exact) / mag);
      }
    EXPECT_LT(worst, 2.5e-7) << c.trans_a << " " << c.M << " " << c.n << " " << c.K;
    EXPECT_GT(off, 1e-5);  // not the float32 GEMM in disguise (its sums err by ~1e-7)
  }
}

// The input projection of bfloat16 storage on AMX tiles: x Wᵀ + bias of bfloat16 arrays as
// they are (exact products, float32 sums), against float64 within float32's rounding of
// the sums: 2.5e-7 of the terms' magnitudes (measured up to 8.1e-8), with ragged edges
// (rows and columns off multiples of 32, K off multiples of 32, one row, odd K) and without
// a bias; and every element's bits independent of the thread count.
TEST(ProjectTiles, MatchesTheFloat64ProductOfTheBfloat16Arrays) {
  const auto& ops = rnncore::cpu::fused_kernels().f32;
  if (!ops.project_tiles) GTEST_SKIP() << "no AMX-BF16 kernels on this CPU";
  struct Case {
    int64_t M, n, K;
    bool bias;
  };
  const Case cases[] = {{64, 64, 32, true}, {100, 96, 256, true}, {33, 17, 7, true},
                        {1, 40, 65, false}, {70, 31, 1, true},    {32, 1024, 256, false}};
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  auto bits = [&] { return rnncore::cpu::float_to_bfloat16(normal(gen)); };
  for (const Case& c : cases) {
    std::vector<uint16_t> x(c.M * c.K), w(c.n * c.K);
    for (uint16_t& v : x) v = bits();
    for (uint16_t& v : w) v = bits();
    std::vector<float> bias(c.n), C(c.M * c.n, -1.0f), C1(c.M * c.n, -2.0f);
    for (float& b : bias) b = normal(gen);
    ops.project_tiles(c.M, c.n, c.K, x.data(), w.data(), c.bias ? bias.data() : nullptr, C.data());
    double worst = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = c.bias ? bias[j] : 0.0, mag = std::abs(sum);
        for (int64_t k = 0; k < c.K; ++k) {
          const double t = double(rnncore::cpu::bfloat16_to_float(x[m * c.K + k])) *
                           rnncore::cpu::bfloat16_to_float(w[j * c.K + k]);
          sum += t;
          mag += std::abs(t);
        }
        worst = std::max(worst, std::abs(C[m * c.n + j] - sum) / mag);
      }
    EXPECT_LT(worst, 2.5e-7) << c.M << " " << c.n << " " << c.K;
    rnncore::set_num_threads(1);
    ops.project_tiles(c.M, c.n, c.K, x.data(), w.data(), c.bias ? bias.data() : nullptr, C1.data());
    rnncore::set_num_threads(0);
    EXPECT_EQ(0, std::memcmp(C.data(), C1.data(), C.size() * sizeof(float)));
  }
}

// dX' kept as bfloat16 bits (narrow_rows_bf16) and read by the tiles in place of its float32
// values: the same bits as the tiles' own rounding of the float32 operand, for A as rows and
// transposed (Aᵀ B as (Bᵀ A)ᵀ too), ragged edges, K in L2 chunks, two pieces side by side, and
// values at the edges of rounding (halfway cases, float32 subnormals, infinities, NaN).
TEST(TileGemm, OperandAsBfloat16BitsGivesTheBitsOfItsRounding) {
  const auto& ops = rnncore::cpu::fused_kernels().f32;
  if (!ops.tile_gemm) GTEST_SKIP() << "no AVX-512 BF16 kernels on this CPU";
  ASSERT_TRUE(ops.narrow_rows_bf16 && ops.tile_gemm_pieces);
  struct Case {
    bool trans_a;
    int64_t M, n, K;
  };
  const Case cases[] = {{false, 64, 32, 40},     {false, 33, 17, 1},      {true, 100, 30, 700},
                        {true, 20, 70, 33},      {true, 31, 20, 5000},    {false, 96, 64, 300},
                        {true, 1024, 512, 3200}, {false, 3200, 256, 1024}};
  std::mt19937 gen(13);
  std::normal_distribution<float> normal;
  const float specials[] = {1.0f + 0x1p-8f,
                            1.0f + 0x1p-8f + 0x1p-9f,
                            0x1p-130f,
                            -0x1p-140f,
                            std::numeric_limits<float>::infinity(),
                            3.0e38f};
  for (const Case& c : cases) {
    const int64_t rows = c.trans_a ? c.K : c.M, cols = c.trans_a ? c.M : c.K;
    const int64_t lda = cols + 3, ldb = c.n + 2;
    std::vector<float> A(rows * lda), B(c.K * ldb);
    for (float& x : A) x = normal(gen);
    for (float& x : B) x = normal(gen);
    for (int64_t i = 0; i < 6; ++i) A[(i * 7919) % (rows * lda)] = specials[i];
    std::vector<uint16_t> bits(rows * lda);
    ops.narrow_rows_bf16(A.data(), lda, rows, cols, bits.data(), lda);
    std::vector<float> C(c.M * c.n), Cb(c.M * c.n, -1.0f);
    ops.tile_gemm(c.trans_a, c.M, c.n, c.K, A.data(), lda, B.data(), ldb, C.data(), c.n, nullptr);
    ops.tile_gemm(c.trans_a, c.M, c.n, c.K, nullptr, lda, B.data(), ldb, Cb.data(), c.n,
                  bits.data());
    EXPECT_EQ(0, std::memcmp(C.data(), Cb.data(), C.size() * sizeof(float)))
        << c.trans_a << " " << c.M << " " << c.n << " " << c.K;
    if (!c.trans_a) continue;
    // Two pieces: B's first n1 columns and the rest, each its own product.
    const int64_t n1 = c.n / 3;
    std::vector<float> P(c.M * c.n, -2.0f), Pb(c.M * c.n, -3.0f);
    for (auto* out : {&P, &Pb}) {
      const rnncore::cpu::GemmPiece<float> pieces[2] = {
          {B.data(), ldb, n1, out->data(), c.n},
          {B.data() + n1, ldb, c.n - n1, out->data() + n1, c.n}};
      const bool b = out == &Pb;
      ops.tile_gemm_pieces(true, c.M, c.K, b ? nullptr : A.data(), lda, pieces, 2,
                           b ? bits.data() : nullptr);
    }
    EXPECT_EQ(0, std::memcmp(P.data(), Pb.data(), P.size() * sizeof(float))) << c.M << " " << c.n;
  }
}

TEST(TileGemm, InfinitiesStayInfiniteAndEmptySumsAreZero) {
  const auto gemm = rnncore::cpu::fused_kernels().f32.tile_gemm;
  if (!gemm) GTEST_SKIP() << "no AVX-512 BF16 kernels on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> A = {inf, 1.0f, 0.5f, 2.0f}, B = {1.0f, 3.0f, 1.0f, 3.0f}, C(4);
  gemm(false, 2, 2, 2, A.data(), 2, B.data(), 2, C.data(), 2,
       nullptr);  // [[inf,1],[.5,2]]·[[1,3],[1,3]]
  EXPECT_EQ(C[0], inf);
  EXPECT_EQ(C[1], inf);
  EXPECT_EQ(C[2], 2.5f);
  EXPECT_EQ(C[3], 7.5f);
  std::vector<float> Z(6, 5.0f);
  gemm(true, 2, 3, 0, A.data(), 2, B.data(), 3, Z.data(), 3, nullptr);
  for (float z : Z) EXPECT_EQ(z, 0.0f);
}

// The tile configuration is shared with any other code on the thread (oneDNN in PyTorch
// configures and releases it around its own products): a release, or another library's
// configuration, between two calls must not break the next (it raised SIGILL once).
// (x86-64 only: the AMX instructions below, and the AMX kernels, exist only there.)
#if defined(__x86_64__)
TEST(TileGemm, OtherTileUsersOnTheThreadChangeNothing) {
  const auto& ops = rnncore::cpu::fused_kernels().f32;
  if (!ops.matmul_tiles) GTEST_SKIP() << "no AMX-BF16 kernels on this CPU";
  const int64_t M = 32, K = 96, n = 40;  // (whole 16-row blocks: the last rows configured are 16)
  std::mt19937 gen(9);
  std::normal_distribution<float> normal;
  std::vector<float> A(M * K), B(K * n);
  for (float& x : A) x = normal(gen);
  for (float& x : B)
    x = rnncore::cpu::bfloat16_to_float(rnncore::cpu::float_to_bfloat16(normal(gen)));
  std::vector<uint16_t> packed(static_cast<size_t>(rnncore::cpu::tiles_size(K, n)));
  ops.pack_tiles(B.data(), K, n, packed.data());
  const auto both = [&] {
    std::vector<float> C(M * n), D(M * n);
    ops.tile_gemm(false, M, n, K, A.data(), K, B.data(), n, C.data(), n, nullptr);
    ops.matmul_tiles(A.data(), K, M, K, packed.data(), n, D.data(), n, false);
    C.insert(C.end(), D.begin(), D.end());
    return C;
  };
  const std::vector<float> want = both();
  asm volatile("tilerelease");
  EXPECT_EQ(both(), want);
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {32, 32, 32, 32, 32, 32, 32, 32};
    uint8_t rows[16] = {8, 8, 8, 8, 8, 8, 8, 8};
  } foreign;
  asm volatile("ldtilecfg %0" : : "m"(foreign));
  EXPECT_EQ(both(), want);
}
#endif

}  // namespace
