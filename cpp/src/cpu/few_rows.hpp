// A few rows of A against B as stored (AVX-512 or AVX2 with FMA, float32): C[r, j] = alpha
// (A[r, :] · B[j, :]) + beta C[r, j], B row-major [n, K]. The products that BLAS would pack
// the whole of B for (an input projection of T·N <= 32 rows, a step's product with R at a
// small batch): B is read once per tile of rows, as stored. Compiled into the AVX2 and
// AVX-512 variants of fused_isa.cpp. B may also be float16 or bfloat16 storage's bits,
// widened as read (exactly): the bits of the float32 product on B widened beforehand.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace rnncore::cpu {
namespace {

// B's element types besides float: float16 and bfloat16 bits.
struct HalfBits {
  uint16_t bits;
};
struct BFloatBits {
  uint16_t bits;
};

#if defined(__AVX512F__)
// 16 lanes, 16 accumulators a tile, up to 4 rows (4 × 4: 0.88-0.90 of the FMA peak from
// L2 at 4 to 64 rows, K = 256; 8 × 2, each column's B read once for 8 rows, 0.75).
struct FewRowsAvx512 {
  using Reg = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16, kRows = 4;
  static Mask full() { return Mask(0xFFFF); }
  static Mask first(int64_t count) { return Mask((1u << count) - 1); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static Reg load_full(const float* p) { return _mm512_loadu_ps(p); }
  static __m256i bits16(Mask m, const void* p) { return _mm256_maskz_loadu_epi16(m, p); }
  static Reg load(Mask m, const HalfBits* p) { return _mm512_maskz_cvtph_ps(full(), bits16(m, p)); }
  static Reg load(Mask m, const BFloatBits* p) {
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(full(), _mm512_maskz_cvtepu16_epi32(full(), bits16(m, p)), 16));
  }
  template <class E>
  static Reg load_full(const E* p) {
    return load(full(), p);
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void pin(Reg& r) { asm("" : "+v"(r)); }
  // (maskz: the unmasked forms' undefined pass-through trips GCC's uninitialised warning)
  template <int imm>
  static Reg blocks(Reg a, Reg b) {
    return _mm512_maskz_shuffle_f32x4(Mask(0xFFFF), a, b, imm);
  }
  template <int imm>
  static Reg shuffle(Reg a, Reg b) {
    return _mm512_maskz_shuffle_ps(Mask(0xFFFF), a, b, imm);
  }
  // The lane sums of acc[0..16), accumulator a's in lane 4 (a % 4) + a / 4: a transposing
  // tree (45 instructions for 16 sums, where one sum alone takes 8).
  static Reg reduce(const Reg* acc) {
    Reg s[8], t[4], u[2];
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i)  // [acc 2i: l + (l+8) | acc 2i+1: same], 8 lanes each
      s[i] = _mm512_add_ps(blocks<0x44>(acc[2 * i], acc[2 * i + 1]),
                           blocks<0xEE>(acc[2 * i], acc[2 * i + 1]));
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i)  // 4 accumulators of 4 lanes (l + (l+4)) each
      t[i] = _mm512_add_ps(blocks<_MM_SHUFFLE(2, 0, 2, 0)>(s[2 * i], s[2 * i + 1]),
                           blocks<_MM_SHUFFLE(3, 1, 3, 1)>(s[2 * i], s[2 * i + 1]));
#pragma GCC unroll 16
    for (int i = 0; i < 2; ++i)  // per 128 bits: 2 accumulators of 2 lanes (l + (l+2))
      u[i] = _mm512_add_ps(shuffle<_MM_SHUFFLE(1, 0, 1, 0)>(t[2 * i], t[2 * i + 1]),
                           shuffle<_MM_SHUFFLE(3, 2, 3, 2)>(t[2 * i], t[2 * i + 1]));
    return _mm512_add_ps(shuffle<_MM_SHUFFLE(2, 0, 2, 0)>(u[0], u[1]),
                         shuffle<_MM_SHUFFLE(3, 1, 3, 1)>(u[0], u[1]));
  }
  // Lanes [0, 16) of `row` = reduce's sums of accumulators first, first + 1, ...
  static Reg row(Reg v, int first) {
    const __m512i a =
        _mm512_add_epi32(_mm512_set1_epi32(first),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i lane = _mm512_add_epi32(
        _mm512_maskz_slli_epi32(Mask(0xFFFF), _mm512_and_si512(a, _mm512_set1_epi32(3)), 2),
        _mm512_maskz_srli_epi32(Mask(0xFFFF), a, 2));
    return _mm512_maskz_permutexvar_ps(Mask(0xFFFF), lane, v);
  }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static constexpr int kBRows = 8, kBCols = 3;  // RowBroadcast's tile: 24 accumulators
  static constexpr int kBCols1 = 8;             // and of one row
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, Mask m, Reg v) { _mm512_mask_storeu_ps(p, m, v); }
  template <int J>
  static void store_first(float* p, Reg v) {
    store(p, first(J), v);
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 8 lanes, 8 accumulators a tile, up to 4 rows (16 registers).
struct FewRowsAvx2 {
  using Reg = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8, kRows = 4;
  static Mask full() { return _mm256_set1_epi32(-1); }
  static Mask first(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static Reg load_full(const float* p) { return _mm256_loadu_ps(p); }
  static Reg widen(__m128i v, const HalfBits*) { return _mm256_cvtph_ps(v); }
  static Reg widen(__m128i v, const BFloatBits*) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
  template <class E>
  static Reg load_full(const E* p) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), p);
  }
  // A tail of 16-bit elements (no masked 16-bit loads here): the lanes m selects, copied.
  template <class E>
  static Reg load(Mask m, const E* p) {
    const int count = __builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
    uint16_t v[8] = {};
    std::memcpy(v, p, static_cast<size_t>(count) * sizeof(E));
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)), p);
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void pin(Reg& r) { asm("" : "+x"(r)); }
  // accumulator a's sum in lane (a % 2) 4 + a / 2; lanes l + (l+4), then l + (l+2), then
  // l + (l+1).
  static Reg reduce(const Reg* acc) {
    Reg s[4], t[2];
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i)  // [acc 2i: l + (l+4) | acc 2i+1: same], 4 lanes each
      s[i] = _mm256_add_ps(_mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x20),
                           _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x31));
#pragma GCC unroll 8
    for (int i = 0; i < 2; ++i)  // per 128 bits: 2 accumulators of 2 lanes (l + (l+2))
      t[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static Reg row(Reg v, int first) {
    const __m256i a =
        _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i lane = _mm256_add_epi32(
        _mm256_slli_epi32(_mm256_and_si256(a, _mm256_set1_epi32(1)), 2), _mm256_srli_epi32(a, 1));
    return _mm256_permutevar8x32_ps(v, lane);
  }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static constexpr int kBRows = 4, kBCols = 2;  // RowBroadcast's tile: 8 accumulators
  static constexpr int kBCols1 = 6;             // and of one row
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  // (vmaskmovps stores are slow on AMD: a whole row of a tile by plain stores)
  static void store(float* p, Mask m, Reg v) { _mm256_maskstore_ps(p, m, v); }
  template <int J>
  static void store_first(float* p, Reg v) {
    if constexpr (J == 8)
      _mm256_storeu_ps(p, v);
    else if constexpr (J == 4)
      _mm_storeu_ps(p, _mm256_castps256_ps128(v));
    else if constexpr (J == 2)
      _mm_storel_pi(reinterpret_cast<__m64*>(p), _mm256_castps256_ps128(v));
    else
      store(p, first(J), v);
  }
};
#endif

#if defined(__AVX512BF16__)
// bfloat16 storage's B multiplied by vdpbf16ps (FewRows<FewRowsAvx512, BFloatBits, Dot>): A's
// rows rounded to bfloat16 and, with Split, their remainders A - hi rounded too, as the fused
// kernels' pairs (fused_kernels.hpp's to_pairs): exact products, float32 sums, lane l of an
// accumulator summing the pairs (2l, 2l + 1) of every 32 k (hi's, then lo's), then the tree.
struct DotOperand {
  static __mmask16 first16(int64_t c) {
    return __mmask16(c >= 16 ? 0xFFFF : c <= 0 ? 0 : (1u << c) - 1);
  }
  // A's k .. k + 31 (count of them; the rest zero) as bfloat16 pairs, hi and lo.
  template <bool Split>
  __attribute__((always_inline)) static inline void load(const float* a, int64_t count,
                                                         __m512bh* hi, __m512bh* lo) {
    const __m512 a0 = _mm512_maskz_loadu_ps(first16(count), a);
    const __m512 a1 = _mm512_maskz_loadu_ps(first16(count - 16), a + 16);
    *hi = _mm512_cvtne2ps_pbh(a1, a0);
    if constexpr (Split) {
      const auto widen = [](__m256i v) {
        return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
            __mmask16(0xFFFF), _mm512_maskz_cvtepu16_epi32(__mmask16(0xFFFF), v), 16));
      };
      const __m512i h = (__m512i)*hi;
      *lo = _mm512_cvtne2ps_pbh(
          _mm512_sub_ps(a1, widen(_mm512_maskz_extracti64x4_epi64(__mmask8(0xF), h, 1))),
          _mm512_sub_ps(a0, widen(_mm512_maskz_extracti64x4_epi64(__mmask8(0xF), h, 0))));
    }
  }
};
#endif

// How FewRows multiplies: FMAs on B widened (float32's bits), or vdpbf16ps on A rounded to
// bfloat16 (DotSplit: and its remainder).
enum class FewRowsMode { Widened, Dot, DotSplit };

template <class V, class E = float, FewRowsMode kMode = FewRowsMode::Widened>
struct FewRows {
  // Each dot product is V::kLanes lane sums over k (k in lane k mod kLanes, FMAs in k
  // order), then reduced by a fixed tree (V::reduce): the same order for every element
  // whatever tile it falls in, so that the bits do not depend on M, n or on how C is split
  // among threads.
  using Reg = typename V::Reg;
  static constexpr int kAcc = V::kLanes;  // accumulators a tile: one reduce
  template <int M>
  static constexpr int cols() {
    return M == 1 ? kAcc : kAcc / M;
  }

  // acc[r J + j] += A[r, k:k+lanes] * B_j[k:k+lanes], the lanes past m's zero (Tail).
  template <int M, int J, bool Tail>
  __attribute__((always_inline)) static inline void chunk(Reg* acc, const float* A, int64_t lda,
                                                          const E* const* b, int64_t k,
                                                          typename V::Mask m) {
    Reg bv[J], av[M];
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) bv[j] = Tail ? V::load(m, b[j] + k) : V::load_full(b[j] + k);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      av[r] = V::load(m, A + r * lda + k);
      // In a register: folded into the J FMAs as memory operands, the loads of an 8 × 2
      // tile (18 a 16 FMAs) held it to half the FMA rate.
      V::pin(av[r]);
    }
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) acc[r * J + j] = V::fma(av[r], bv[j], acc[r * J + j]);
  }

  // C[r, j] (r < M, j < jn) = alpha (A[r, :] · b[j][:]) + beta C[r, j] (C not read when beta
  // is 0). Row r's sums leave the register by a permute and one store (written through the
  // stack and read back a float at a time, they stalled store forwarding).
  template <int M, int J>
  __attribute__((noinline)) static void tile(int64_t K, const float* A, int64_t lda,
                                             const E* const* b, float alpha, float beta, float* C,
                                             int64_t ldc, int jn) {
    static_assert(M * J <= kAcc);
    Reg acc[kAcc];
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = V::zero();
    if constexpr (kMode != FewRowsMode::Widened) {
#if defined(__AVX512BF16__)
      for (int64_t k = 0; k < K; k += 32) {
        const int64_t count = std::min<int64_t>(32, K - k);
        const __mmask32 m = count == 32 ? __mmask32(~0u) : __mmask32((1u << count) - 1);
        __m512bh bv[J];
#pragma GCC unroll 16
        for (int j = 0; j < J; ++j) bv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, b[j] + k);
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          __m512bh hi, lo;
          DotOperand::load<kMode == FewRowsMode::DotSplit>(A + r * lda + k, count, &hi, &lo);
#pragma GCC unroll 16
          for (int j = 0; j < J; ++j) acc[r * J + j] = _mm512_dpbf16_ps(acc[r * J + j], hi, bv[j]);
          if constexpr (kMode == FewRowsMode::DotSplit) {
#pragma GCC unroll 16
            for (int j = 0; j < J; ++j)
              acc[r * J + j] = _mm512_dpbf16_ps(acc[r * J + j], lo, bv[j]);
          }
        }
      }
#endif
    } else {
      int64_t k = 0;
      for (; k + V::kLanes <= K; k += V::kLanes) chunk<M, J, false>(acc, A, lda, b, k, V::full());
      if (k < K) chunk<M, J, true>(acc, A, lda, b, k, V::first(K - k));
    }
    const Reg v = V::mul(V::set1(alpha), V::reduce(acc));
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      float* out = C + r * ldc;
      const auto m = V::first(jn);
      const Reg row = V::row(v, r * J);  // C[r, j0 + j] in lane j
      const Reg c = beta == 0.0f ? row : V::fma(V::set1(beta), V::load(m, out), row);
      if (jn == J)
        V::template store_first<J>(out, c);
      else
        V::store(out, m, c);
    }
  }

  template <int M>
  static void rows(int64_t n, int64_t K, float alpha, const float* A, int64_t lda, const E* B,
                   int64_t ldb, float beta, float* C, int64_t ldc) {
    constexpr int J = cols<M>();
    const E* b[J];
    for (int64_t j0 = 0; j0 < n; j0 += J) {
      const int jn = static_cast<int>(std::min<int64_t>(J, n - j0));
      // (past n: the last row again, its sums not stored)
      for (int j = 0; j < J; ++j) b[j] = B + (j0 + std::min(j, jn - 1)) * ldb;
      tile<M, J>(K, A, lda, b, alpha, beta, C + j0, ldc, jn);
    }
  }

  template <int M = V::kRows>
  static void rows_of(int m, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    if constexpr (M > 1) {
      if (m < M) return rows_of<M - 1>(m, n, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    rows<M>(n, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  // The entry (FusedOps::gemm_nt): every M, by tiles of up to kRows rows, each block of 64
  // rows of B read from memory once for all of them (then from L2).
  static void gemm_nt(int64_t M, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    constexpr int64_t kBlock = 64;
    for (int64_t j0 = 0; j0 < n; j0 += kBlock)
      for (int64_t r0 = 0; r0 < M; r0 += V::kRows)
        rows_of(static_cast<int>(std::min<int64_t>(V::kRows, M - r0)), std::min(kBlock, n - j0), K,
                alpha, A + r0 * lda, lda, B + j0 * ldb, ldb, beta, C + r0 * ldc + j0, ldc);
  }
  // gemm_nt on 16-bit B (FusedOps::gemm_nt_half, gemm_nt_bfloat16), any M from 1.
  static void gemm_nt_bits(int64_t M, int64_t n, int64_t K, float alpha, const float* A,
                           int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                           int64_t ldc) {
    static_assert(sizeof(E) == sizeof(uint16_t));
    gemm_nt(M, n, K, alpha, A, lda, reinterpret_cast<const E*>(B), ldb, beta, C, ldc);
  }
};

// C = alpha op(A) B + beta C with B [K, n] row-major as stored, each row of C a sum over k of
// a(r, k) times B's row k: few rows of A (A [M, K]: the backward's dX'·W and dX'·R at a
// small batch, where OpenBLAS packs all of W or R for a few rows) or a short K (A [K, M]
// transposed: dX'ᵀ·x and dX'ᵀ·h of T·N <= 32 rows, where OpenBLAS's kernels ran at a fifth
// of the FMA peak). Each element is one chain of FMAs in k order, whatever the tile or the
// split of C among threads.
template <class V, class E = float>
struct RowBroadcast {
  using Reg = typename V::Reg;
  static constexpr int kRows = V::kBRows, kCols = V::kBCols, kWidth = kCols * V::kLanes;
  // One row alone: more columns a tile, so that enough chains of FMAs (8; AVX2 6) hide their
  // latency (3 left a row's product at half the speed of OpenBLAS's GEMV). Each element's
  // chain is the same: the same bits.
  static constexpr int kCols1 = V::kBCols1, kWidth1 = kCols1 * V::kLanes;

  // Rows [0, R) and columns [0, jn) of C (jn <= kWidth, Full: jn == kWidth); A's element
  // (r, k) at A[r sr + k sk].
  template <int R, bool Full, int kCols = kCols>
  __attribute__((noinline)) static void tile(int64_t K, const float* A, int64_t sr, int64_t sk,
                                             const E* B, int64_t ldb, float alpha, float beta,
                                             float* C, int64_t ldc, int64_t jn) {
    typename V::Mask m[kCols];
#pragma GCC unroll 8
    for (int j = 0; j < kCols; ++j)
      m[j] = V::first(std::clamp<int64_t>(jn - j * V::kLanes, 0, V::kLanes));
    Reg acc[R][kCols];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < kCols; ++j) acc[r][j] = V::zero();
    for (int64_t k = 0; k < K; ++k) {
      Reg b[kCols];
#pragma GCC unroll 8
      for (int j = 0; j < kCols; ++j)
        b[j] = Full ? V::load_full(B + k * ldb + j * V::kLanes)
                    : V::load(m[j], B + k * ldb + j * V::kLanes);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Reg a = V::set1(A[r * sr + k * sk]);
#pragma GCC unroll 8
        for (int j = 0; j < kCols; ++j) acc[r][j] = V::fma(a, b[j], acc[r][j]);
      }
    }
    const Reg va = V::set1(alpha), vb = V::set1(beta);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < kCols; ++j) {
        if (j * V::kLanes >= jn) break;
        float* out = C + r * ldc + j * V::kLanes;
        const Reg v = V::mul(va, acc[r][j]);
        V::store(out, m[j], beta == 0.0f ? v : V::fma(vb, V::load(m[j], out), v));
      }
  }

  template <int R = kRows>
  static void tile_of(int rows, int64_t K, const float* A, int64_t sr, int64_t sk, const E* B,
                      int64_t ldb, float alpha, float beta, float* C, int64_t ldc, int64_t jn) {
    if constexpr (R > 1) {
      if (rows < R) return tile_of<R - 1>(rows, K, A, sr, sk, B, ldb, alpha, beta, C, ldc, jn);
    }
    if (jn == kWidth) return tile<R, true>(K, A, sr, sk, B, ldb, alpha, beta, C, ldc, jn);
    tile<R, false>(K, A, sr, sk, B, ldb, alpha, beta, C, ldc, jn);
  }

  static void gemm(int64_t M, int64_t n, int64_t K, float alpha, const float* A, int64_t sr,
                   int64_t sk, const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    if (M == 1) {
      int64_t j0 = 0;
      for (; j0 + kWidth1 <= n; j0 += kWidth1)
        tile<1, true, kCols1>(K, A, sr, sk, B + j0, ldb, alpha, beta, C + j0, ldc, kWidth1);
      for (; j0 < n; j0 += kWidth)  // the rest by tiles of kWidth
        tile_of<1>(1, K, A, sr, sk, B + j0, ldb, alpha, beta, C + j0, ldc,
                   std::min<int64_t>(kWidth, n - j0));
      return;
    }
    for (int64_t j0 = 0; j0 < n; j0 += kWidth)
      for (int64_t r0 = 0; r0 < M; r0 += kRows)
        tile_of(static_cast<int>(std::min<int64_t>(kRows, M - r0)), K, A + r0 * sr, sr, sk, B + j0,
                ldb, alpha, beta, C + r0 * ldc + j0, ldc, std::min<int64_t>(kWidth, n - j0));
  }
  // C [M, n] = alpha A [M, K] · B + beta C (FusedOps::gemm_nn).
  static void gemm_nn(int64_t M, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm(M, n, K, alpha, A, lda, 1, B, ldb, beta, C, ldc);
  }
  // gemm_nn on 16-bit B (FusedOps::gemm_nn_half, gemm_nn_bfloat16).
  static void gemm_nn_bits(int64_t M, int64_t n, int64_t K, float alpha, const float* A,
                           int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                           int64_t ldc) {
    static_assert(sizeof(E) == sizeof(uint16_t));
    gemm(M, n, K, alpha, A, lda, 1, reinterpret_cast<const E*>(B), ldb, beta, C, ldc);
  }
  // C [M, n] = alpha A [K, M]ᵀ · B + beta C (FusedOps::gemm_tn).
  static void gemm_tn(int64_t M, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm(M, n, K, alpha, A, 1, lda, B, ldb, beta, C, ldc);
  }
};

}  // namespace
}  // namespace rnncore::cpu
