// The fused forward recurrences, written once for a scalar type and a vector width W and
// compiled once per instruction set (fused_isa.cpp, built per ISA by CMakeLists.txt).
//
// Per step and direction the work is acc[N, G*H] = h̃[N, H] R^T plus the gate math. R is
// packed once per call into panels of W hidden units: panel b holds, for every k, the G
// gate rows of units b*W .. b*W+W-1 side by side ([k][g][w]), so one k-step of the tile
// loads G vectors of R and broadcasts M values of h̃ into M*G accumulators, and the gate
// math of the panel's units runs in the tile's epilogue, while the pre-activations are
// still in L1. fused.cpp schedules the panels: chunks of them are packed and then run
// step after step by whichever thread claims them (each unit's arithmetic is the same
// whoever runs it, so the bits do not depend on the threads).
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/activations.hpp"
#include "cpu/fused.hpp"
#include "cpu/narrow.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/vmath.hpp"

// float16 and bfloat16 storage: R's panels in 16 bits, widened by the tile as it loads them,
// where the instruction set converts (F16C for float16; the AVX2 and AVX-512 variants are
// built with it; bfloat16 is a zero-extend and a shift).
#if defined(__F16C__) && (defined(__x86_64__) || defined(_M_X64))
#include <immintrin.h>
#define RNNCORE_FUSED_HALF_PANELS 1
#else
#define RNNCORE_FUSED_HALF_PANELS 0
#endif
// AVX-512 BF16: the bfloat16 product by vdpbf16ps (the avx512bf16 variant).
#if defined(__AVX512BF16__) && RNNCORE_FUSED_HALF_PANELS
#define RNNCORE_FUSED_DOT_BF16 1
#else
#define RNNCORE_FUSED_DOT_BF16 0
#endif
// AMX (Sapphire Rapids on): the same bfloat16 products by tiles of 16 rows × 16 pairs of k,
// from 4 rows on (batch rows of a step, or of the input projection); the
// avx512amx variant, picked only once the OS has granted the tile state (fused.cpp).
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && RNNCORE_FUSED_DOT_BF16
#define RNNCORE_FUSED_AMX 1
#else
#define RNNCORE_FUSED_AMX 0
#endif
// The one-pass epilogues' vector activations: vmath::v16 (AVX-512) or v8 (AVX2 and FMA).
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define RNNCORE_FUSED_ROWS 1
#else
#define RNNCORE_FUSED_ROWS 0
#endif
#if RNNCORE_FUSED_DOT_BF16
#include "cpu/bf16_gemm.hpp"  // the gradients' bfloat16 GEMMs (and AMX's tile configuration)
#endif

namespace rnncore::cpu {
// A bfloat16 element of R's panels (its bits), told apart from a float16 one (uint16_t).
struct BFloat16Elem {
  uint16_t bits;
};
// A float16 element of R's panels widened by 256-bit halves (widen_f16_by_halves).
struct Float16Halves {
  uint16_t bits;
};
// Internal linkage: each instruction-set translation unit has its own copy, so the linker
// can never hand code built for one ISA to another.
namespace {

// The register tiles are never inlined into their callers: inlined into a step they were
// compiled worse (the bfloat16 LSTM's batch-1 step 10% slower when lstm() grew).
#define RNNCORE_TILE __attribute__((noinline))

// AVX-512 tiles that take A's element from memory in each FMA (vfmadd231ps m32{1to16}, and
// vdpbf16ps likewise) rather than from one vbroadcastss that a row's FMAs share, where
// fma_broadcast_from_memory() says so. GCC's extended asm (clang and others keep the register
// form); the same instructions in the same order: the same bits.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define RNNCORE_FMA_BROADCAST 1
// Whether this translation unit's `acc += a * b` on vectors is one FMA, as the register form
// computes the tiles' products (GCC from -O2): below that (-O1, as the sanitizer builds, and
// -O0) it rounds the product first, and the memory form's FMAs would give other bits.
// (1 + 2^-12)^2 - 1 is 2^-11 with the product rounded, 2^-11 + 2^-24 fused.
__attribute__((noinline)) bool fuses_multiply_add() {
  typedef float v16 __attribute__((vector_size(64)));
  volatile float x = 1.0f + 0x1p-12f;
  v16 a = {}, acc = {};
  a[0] = x;
  acc[0] = -1.0f;
  acc += x * a;
  return acc[0] != 0x1p-11f;
}
const bool kMemoryBroadcast = fma_broadcast_from_memory() && fuses_multiply_add();
#else
#define RNNCORE_FMA_BROADCAST 0
#endif

template <class S, int W>
struct Fused {  // S: the scalar type
  typedef S vec __attribute__((vector_size(W * sizeof(S)), aligned(sizeof(S)), may_alias));
  static constexpr int kRegs = W >= 16 ? 32 : 16;
  // Rows per tile: as many accumulators as the register file holds beside the G vectors
  // of R and one broadcast (one more and the compiler spills accumulators to the stack).
  template <int G>
  static constexpr int rows() {
    return std::min(8, std::max(1, (kRegs - G - 1) / G));
  }

  using Problem = detail::Problem;
  using Dir = DirectionForward;

  // Panels of R in 16 bits (float16 or bfloat16 storage): half the bytes each step streams
  // from L2.
  // The one-pass LSTM and GRU epilogues (lstm_rows, gru_rows) for float32 vectors of 16
  // (AVX-512) or 8 (AVX2).
#if defined(__AVX512F__)
  static constexpr bool kRows = std::is_same_v<S, float> && W == 16;
#elif RNNCORE_FUSED_ROWS
  static constexpr bool kRows = std::is_same_v<S, float> && W == 8;
#else
  static constexpr bool kRows = false;
#endif
  static constexpr bool kHalfPanels =
      RNNCORE_FUSED_HALF_PANELS && std::is_same_v<S, float> && (W == 8 || W == 16);
  static vec load(const S* p) { return *reinterpret_cast<const vec*>(p); }
  static void store(S* p, vec v) { *reinterpret_cast<vec*>(p) = v; }
  static vec load(const uint16_t* p) {
    vec r;
#if RNNCORE_FUSED_HALF_PANELS
    if constexpr (W == 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      std::memcpy(&r, &v, sizeof r);
    } else if constexpr (W == 16) {
      // (maskz: _mm512_cvtph_ps's undefined pass-through trips GCC's uninitialised warning)
      const __m512 v = _mm512_maskz_cvtph_ps(
          __mmask16(0xFFFF), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      std::memcpy(&r, &v, sizeof r);
    }
#else
    (void)p;
    r = vec{};
#endif
    return r;
  }
  static vec load(const Float16Halves* p) { return load(reinterpret_cast<const uint16_t*>(p)); }
  // bfloat16: zero-extend the bits to 32 and shift them into a float's upper half.
  static vec load(const BFloat16Elem* p) {
    vec r;
#if RNNCORE_FUSED_HALF_PANELS
    if constexpr (W == 8) {
      const __m256i v = _mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
      std::memcpy(&r, &v, sizeof r);
      return r;
    } else if constexpr (W == 16) {
      // (maskz: the unmasked forms' undefined pass-through trips GCC's uninitialised warning)
      const __m512i v = _mm512_maskz_slli_epi32(
          __mmask16(0xFFFF),
          _mm512_maskz_cvtepu16_epi32(__mmask16(0xFFFF),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
          16);
      std::memcpy(&r, &v, sizeof r);
      return r;
    }
#endif
    for (int w = 0; w < W; ++w) {
      const uint32_t bits = uint32_t(p[w].bits) << 16;
      std::memcpy(reinterpret_cast<char*>(&r) + w * sizeof(S), &bits, sizeof bits);
    }
    return r;
  }
  static_assert(rows<1>() == kProductRows, "matmul's row tile is kProductRows");

  // AVX-512 BF16: bfloat16 panels hold pairs of k ([k/2][g][w][2]), so that one vdpbf16ps
  // does 32 multiply-adds (a product of two bfloat16 is exact in float32; the sums are
  // float32). The input projection multiplies bfloat16 arrays as they are. In the steps h̃ is
  // float32: inference rounds it to bfloat16 for the product (as PyTorch's bfloat16 layers
  // store it); a training forward splits it into hi = bf16(h̃) and lo = bf16(h̃ - hi), whose
  // sum carries 16 of h̃'s 24 bits, since the gradients computed from the training state are
  // more sensitive (a ReLU LSTM's input-weight gradient moved past the storage type's
  // tolerance): two vdpbf16ps per pair of k, still fewer instructions than the widened
  // panels' two FMAs and four conversions.
  static constexpr bool kDotBf16 = RNNCORE_FUSED_DOT_BF16 && kHalfPanels && W == 16;
  // AVX2: a k-row of bfloat16 panels holds gates 2j and 2j+1 in the halves of 32-bit slots
  // ([g/2][w][2]; an odd last gate as it is), so that one load and a shift or a mask widen
  // two gates' vectors, where a zero-extend per gate (a shuffle each) bound batch 1. The
  // same products in the same order: the same bits.
#if defined(__AVX2__) && !defined(__AVX512F__)
  static constexpr bool kGatePairs = kHalfPanels && W == 8;
#else
  static constexpr bool kGatePairs = false;
#endif
  // The GN gate vectors from G0 of the k-row `row` of a panel (G0 even with gate pairs).
  template <int G, int G0, int GN, class P>
  static RNNCORE_VMATH_INLINE void load_gates(const P* row, vec (&b)[GN]) {
    if constexpr (kGatePairs && std::is_same_v<P, BFloat16Elem>) {
#if defined(__AVX2__) && !defined(__AVX512F__)
      static_assert(G0 % 2 == 0, "gate pairs start at even gates");
      constexpr int pairs = (G0 + GN == G && G % 2 == 1) ? (GN - 1) / 2 : GN / 2;
      static_assert(pairs * 2 == GN || (G0 + GN == G && G % 2 == 1), "whole gate pairs");
      const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
      for (int j = 0; j < pairs; ++j) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (G0 + 2 * j) * W));
        const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        std::memcpy(&b[2 * j], &lo, sizeof lo);
        std::memcpy(&b[2 * j + 1], &hi, sizeof hi);
      }
      if constexpr (pairs * 2 < GN) b[GN - 1] = load(row + (G0 + GN - 1) * W);
#endif
    } else {
      for (int g = 0; g < GN; ++g) b[g] = load(row + (G0 + g) * W);
    }
  }
  // pack_panels's k-rows of panel (K rows of G gates) into gate pairs, in place.
  template <int G, class P>
  static void pair_gates(P* panel, int64_t K) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    if constexpr (kGatePairs && std::is_same_v<P, BFloat16Elem>) {
      for (int64_t k = 0; k < K; ++k)
        for (int j = 0; j + 1 < G; j += 2) {
          P* row = panel + (k * G + j) * W;
          const __m128i g0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row));
          const __m128i g1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + W));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row), _mm_unpacklo_epi16(g0, g1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + W), _mm_unpackhi_epi16(g0, g1));
        }
    }
#endif
    (void)panel, (void)K;
  }
  // Two bfloat16, the lower k low (2-byte aligned: a caller's bfloat16 rows read in place).
  typedef uint32_t Pair __attribute__((may_alias, aligned(2)));

#if RNNCORE_FUSED_DOT_BF16
  // Split: A's rows are hi pairs, and lo_off pairs on, the lo pairs.
  template <int G, int M, bool Split>
  RNNCORE_TILE static void tile_dot(const Pair* A, int64_t lda, int64_t lo_off, int64_t K2,
                                    const Pair* Bp, S* out, bool accumulate) {
    constexpr int U = M * G >= 8 ? 1 : (M * G >= 4 ? 2 : 4);
#if RNNCORE_FMA_BROADCAST
    if (kMemoryBroadcast)
      return tile_dot_memory<G, M, Split, U>(A, lda, lo_off, K2, Bp, out, accumulate);
#endif
    __m512 acc[U][M][G];  // in registers by the unrolled loops, as tile's
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          acc[u][r][g] =
              u == 0 && accumulate ? _mm512_loadu_ps(out + (r * G + g) * W) : _mm512_setzero_ps();
    auto kstep = [&](int u, int64_t k) {
      __m512bh b[G];
      for (int g = 0; g < G; ++g)
        b[g] = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(Bp + (k * G + g) * W));
      for (int r = 0; r < M; ++r) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[r * lda + k]));
        for (int g = 0; g < G; ++g) acc[u][r][g] = _mm512_dpbf16_ps(acc[u][r][g], a, b[g]);
        if constexpr (Split) {
          const __m512bh lo =
              (__m512bh)_mm512_set1_epi32(static_cast<int>(A[lo_off + r * lda + k]));
          for (int g = 0; g < G; ++g) acc[u][r][g] = _mm512_dpbf16_ps(acc[u][r][g], lo, b[g]);
        }
      }
    };
    int64_t k = 0;
    for (; k + U <= K2; k += U)
      for (int u = 0; u < U; ++u) kstep(u, k + u);
    for (; k < K2; ++k) kstep(0, k);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        __m512 sum = acc[0][r][g];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][r][g]);
        _mm512_storeu_ps(out + (r * G + g) * W, sum);
      }
  }

#if RNNCORE_FMA_BROADCAST
  // tile_dot with each pair taken from memory by its vdpbf16ps (RNNCORE_FMA_BROADCAST).
  template <int G, int M, bool Split, int U>
  RNNCORE_TILE static void tile_dot_memory(const Pair* A, int64_t lda, int64_t lo_off, int64_t K2,
                                           const Pair* Bp, S* out, bool accumulate) {
    __m512 acc[U][M][G];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          acc[u][r][g] =
              u == 0 && accumulate ? _mm512_loadu_ps(out + (r * G + g) * W) : _mm512_setzero_ps();
    const auto kstep = [&](int u, int64_t k) __attribute__((always_inline)) {
      __m512bh b[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g)
        b[g] = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(Bp + (k * G + g) * W));
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const Pair* a = A + r * lda + k;
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          asm("vdpbf16ps %[a]%{1to16%}, %[b], %[acc]"
              : [acc] "+v"(acc[u][r][g])
              : [b] "v"(b[g]), [a] "m"(*a));
        if constexpr (Split) {
          const Pair* lo = A + lo_off + r * lda + k;
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g)
            asm("vdpbf16ps %[a]%{1to16%}, %[b], %[acc]"
                : [acc] "+v"(acc[u][r][g])
                : [b] "v"(b[g]), [a] "m"(*lo));
        }
      }
    };
    int64_t k = 0;
    for (; k + U <= K2; k += U)
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) kstep(u, k + u);
    for (; k < K2; ++k) kstep(0, k);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        __m512 sum = acc[0][r][g];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][r][g]);
        _mm512_storeu_ps(out + (r * G + g) * W, sum);
      }
  }
#endif

  template <int G, bool Split, int M = rows<G>()>
  static void tile_rows_dot(int m, const Pair* A, int64_t lda, int64_t lo_off, int64_t K2,
                            const Pair* Bp, S* out, bool accumulate) {
    if constexpr (M > 1) {
      if (m < M) return tile_rows_dot<G, Split, M - 1>(m, A, lda, lo_off, K2, Bp, out, accumulate);
    }
    tile_dot<G, M, Split>(A, lda, lo_off, K2, Bp, out, accumulate);
  }

  // block_product_dot of one row (N = 1, no split: its sums in its order, block_product_vec's
  // chunks of k and tile_dot's accumulators) that also carries units [kp0, kp1) of the
  // product of M rows of X (ldx pairs apart) with the panel Wp (K2x pairs): unit u is pair
  // u % K2x of gates [q·GC, q·GC + GC) for q = u / K2x, summed into acc ([r][g][w], from zero
  // at each q's first pair: one accumulator each in k order, whatever the slices). One
  // carried unit after every kPer of the row's pairs. The row's product streams its panel
  // from L2 with the vdpbf16ps unit half idle, and the carried rows reuse each pair of Wp M
  // times from registers: together they overlap (bench/micro/carry_rows.cpp). 8 rows × 2
  // gates a unit (16 sums beside the row's 8) stream half the Wp of 4 rows × 4: the T=100 N=1
  // H=256 LSTM on 2 threads took 0.97 of the time (Zen 4, alternating processes).
  static constexpr int kPer = 4;
  template <int G, int M, int GC>
  RNNCORE_TILE static void carry_product(const Pair* h, int64_t K2, const Pair* Bp, S* out,
                                         const Pair* X, int64_t ldx, const Pair* Wp, int64_t K2x,
                                         S* acc, int64_t kp0, int64_t kp1) {
    constexpr int U = G >= 8 ? 1 : (G >= 4 ? 2 : 4);                   // tile_dot's at M = 1
    constexpr int64_t KC = std::max<int64_t>(8, 24576 / (G * W * 4));  // block_product_vec's
    static_assert(kPer % U == 0 && M * GC >= 8 && G % GC == 0, "whole rounds; carried U = 1");
    __m512 pa[M][GC];
    int64_t kp = kp0, q = kp0 / K2x, qend = std::min(kp1, (q + 1) * K2x);
    const auto load_sums = [&](bool zero) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < GC; ++g)
          pa[r][g] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r * G + q * GC + g) * W);
    };
    const auto store_sums = [&]() __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < GC; ++g) _mm512_storeu_ps(acc + (r * G + q * GC + g) * W, pa[r][g]);
    };
    load_sums(kp0 % K2x == 0);
    const auto carried = [&]() __attribute__((always_inline)) {
      if (kp == qend) {  // the next gates' first pair
        store_sums();
        ++q, qend = std::min(kp1, (q + 1) * K2x);
        load_sums(true);
      }
      const int64_t k = kp - q * K2x;
      __m512bh b[GC];
#pragma GCC unroll 8
      for (int g = 0; g < GC; ++g)
        b[g] =
            (__m512bh)_mm512_loadu_si512(static_cast<const void*>(Wp + (k * G + q * GC + g) * W));
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(X[r * ldx + k]));
#pragma GCC unroll 8
        for (int g = 0; g < GC; ++g) pa[r][g] = _mm512_dpbf16_ps(pa[r][g], a, b[g]);
      }
      ++kp;
    };
    for (int64_t k0 = 0; k0 < K2; k0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K2 - k0);
      __m512 ra[U][G];
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          ra[u][g] = u == 0 && k0 > 0 ? _mm512_loadu_ps(out + g * W) : _mm512_setzero_ps();
      const auto rstep = [&](int u, int64_t k) __attribute__((always_inline)) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(h[k]));
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          ra[u][g] = _mm512_dpbf16_ps(
              ra[u][g], a,
              (__m512bh)_mm512_loadu_si512(static_cast<const void*>(Bp + (k * G + g) * W)));
      };
      int64_t k = 0;
      for (; k + kPer <= kc; k += kPer) {
#pragma GCC unroll 4
        for (int j = 0; j < kPer; j += U)
#pragma GCC unroll 4
          for (int u = 0; u < U; ++u) rstep(u, k0 + k + j + u);
        if (kp < kp1) carried();
      }
      for (; k + U <= kc; k += U)
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) rstep(u, k0 + k + u);
      for (; k < kc; ++k) rstep(0, k0 + k);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        __m512 sum = ra[0][g];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, ra[u][g]);
        _mm512_storeu_ps(out + g * W, sum);
      }
    }
    while (kp < kp1) carried();
    store_sums();
  }

#if RNNCORE_FUSED_AMX
  // Tiles (amx_configure): C 16 × 16 float32, A 16 rows × 16 pairs, B 16 pairs of k × 16
  // columns (a panel's gate block, as packed).
  // out[r][g][w] = A[r, :K16] · panel for rows [0, N) (K16 a multiple of 16 pairs): tiles
  // 0..G-1 accumulate the G gates, 4 (and 5, the lo pairs) hold A, 6 and 7 B; the rows past
  // a multiple of 16 by tiles of fewer rows. The tile macros name their tiles by literal
  // numbers, hence the unrolled gates.
  // Rows from which tiles beat vdpbf16ps (measured on a Xeon with AMX: 1.3× slower at N = 1,
  // even at 3, 1.6× faster at 8).
  static constexpr int64_t kAmxRows = 4;
  template <int G, bool Split>
  static void amx_product(const Pair* A, int64_t lda, int64_t lo_off, int64_t N, int64_t K16,
                          const Pair* panel, S* out) {
    static_assert(G >= 1 && G <= 4, "four accumulator tiles");
    const int64_t sa = lda * 4, sb = G * W * 4, so = G * W * int64_t(sizeof(S));
    int64_t n0 = 0;
    // 32 rows at a time, by pairs of gates: tiles 0-3 are (rows + 16r, gate g + j) for r, j in
    // {0, 1}, 4-5 the two row blocks, 6-7 the two gates, so each B tile serves 32 rows (half
    // the loads from L2 of one block at a time). Per tile the same sums in the same order.
    if (N >= 32) amx_configure(16);
    for (; n0 + 32 <= N; n0 += 32)
      for (int g = 0; g < G; g += 2) {
        const bool two = g + 1 < G;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k = 0; k < K16; k += 16) {
          const Pair* a = A + n0 * lda + k;
          const Pair* b = panel + k * G * W + g * W;
          _tile_loadd(4, a, sa);
          _tile_loadd(5, a + 16 * lda, sa);
          _tile_loadd(6, b, sb);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(2, 5, 6);
          if (two) {
            _tile_loadd(7, b + W, sb);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
          if constexpr (Split) {
            _tile_loadd(4, a + lo_off, sa);
            _tile_loadd(5, a + lo_off + 16 * lda, sa);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if (two) {
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
        S* o = out + n0 * G * W + g * W;
        _tile_stored(0, o, so);
        _tile_stored(2, o + 16 * G * W, so);
        if (two) {
          _tile_stored(1, o + W, so);
          _tile_stored(3, o + 16 * G * W + W, so);
        }
      }
    for (; n0 < N; n0 += 16) {
      amx_configure(static_cast<int>(std::min<int64_t>(16, N - n0)));
      _tile_zero(0);
      if constexpr (G > 1) _tile_zero(1);
      if constexpr (G > 2) _tile_zero(2);
      if constexpr (G > 3) _tile_zero(3);
      for (int64_t k = 0; k < K16; k += 16) {
        const Pair* a = A + n0 * lda + k;
        const Pair* b = panel + k * G * W;
        _tile_loadd(4, a, sa);
        if constexpr (Split) _tile_loadd(5, a + lo_off, sa);
        _tile_loadd(6, b, sb);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (Split) _tile_dpbf16ps(0, 5, 6);
        if constexpr (G > 1) {
          _tile_loadd(7, b + W, sb);
          _tile_dpbf16ps(1, 4, 7);
          if constexpr (Split) _tile_dpbf16ps(1, 5, 7);
        }
        if constexpr (G > 2) {
          _tile_loadd(6, b + 2 * W, sb);
          _tile_dpbf16ps(2, 4, 6);
          if constexpr (Split) _tile_dpbf16ps(2, 5, 6);
        }
        if constexpr (G > 3) {
          _tile_loadd(7, b + 3 * W, sb);
          _tile_dpbf16ps(3, 4, 7);
          if constexpr (Split) _tile_dpbf16ps(3, 5, 7);
        }
      }
      S* o = out + n0 * G * W;
      _tile_stored(0, o, so);
      if constexpr (G > 1) _tile_stored(1, o + W, so);
      if constexpr (G > 2) _tile_stored(2, o + 2 * W, so);
      if constexpr (G > 3) _tile_stored(3, o + 3 * W, so);
    }
  }
#endif

  // block_product on pairs: K2 pairs of k, the panel's chunks kept in L1 as there; by AMX
  // tiles from kAmxRows rows and 16 pairs on.
  template <int G, bool Split>
  static void block_product_dot(const Pair* A, int64_t lda, int64_t lo_off, int64_t N, int64_t K2,
                                const Pair* panel, S* out) {
#if RNNCORE_FUSED_AMX
    const int64_t K16 = K2 / 16 * 16;
    if (K16 > 0 && N >= kAmxRows) {
      amx_product<G, Split>(A, lda, lo_off, N, K16, panel, out);
      constexpr int M = rows<G>();
      if (K16 < K2)  // the last pairs of k, added by vdpbf16ps
        for (int64_t n0 = 0; n0 < N; n0 += M) {
          const int m = static_cast<int>(std::min<int64_t>(M, N - n0));
          tile_rows_dot<G, Split>(m, A + n0 * lda + K16, lda, lo_off, K2 - K16, panel + K16 * G * W,
                                  out + n0 * G * W, true);
        }
      return;
    }
#endif
    block_product_vec<G, Split>(A, lda, lo_off, N, K2, panel, out);
  }
  template <int G, bool Split>
  static void block_product_vec(const Pair* A, int64_t lda, int64_t lo_off, int64_t N, int64_t K2,
                                const Pair* panel, S* out) {
    constexpr int M = rows<G>();
    constexpr int64_t KC = std::max<int64_t>(8, 24576 / (G * W * 4));
    for (int64_t k0 = 0; k0 < K2; k0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K2 - k0);
      for (int64_t n0 = 0; n0 < N; n0 += M) {
        const int m = static_cast<int>(std::min<int64_t>(M, N - n0));
        tile_rows_dot<G, Split>(m, A + n0 * lda + k0, lda, lo_off, kc, panel + k0 * G * W,
                                out + n0 * G * W, k0 > 0);
      }
    }
  }

  // Rows [0, N) of A (K elements each) as bfloat16 pairs (rounded to nearest even by the
  // instruction, an odd K padded with zero), row n's at out + n * ldo; with split, also the
  // pairs of the remainders (lo) N rows on.
  static void to_pairs(const S* A, int64_t lda, int64_t N, int64_t K, Pair* out, int64_t ldo,
                       bool split) {
    const auto mask = [](int64_t c) {
      return __mmask16(c >= 16 ? 0xFFFF : c <= 0 ? 0 : (1u << c) - 1);
    };
    // The float32 values of 16 bfloat16 (bits in 16-bit lanes).
    const auto widen = [](__m256i v) {
      return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
          __mmask16(0xFFFF), _mm512_maskz_cvtepu16_epi32(__mmask16(0xFFFF), v), 16));
    };
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; k += 32) {
        const int64_t left = K - k;
        const __m512 a0 = _mm512_maskz_loadu_ps(mask(left), A + n * lda + k);
        const __m512 a1 = _mm512_maskz_loadu_ps(mask(left - 16), A + n * lda + k + 16);
        const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(a1, a0);
        const __mmask16 m = mask((left + 1) / 2);
        _mm512_mask_storeu_epi32(static_cast<void*>(out + n * ldo + k / 2), m, hi);
        if (!split) continue;
        const __m512 r0 =
            _mm512_sub_ps(a0, widen(_mm512_maskz_extracti64x4_epi64(__mmask8(0xF), hi, 0)));
        const __m512 r1 =
            _mm512_sub_ps(a1, widen(_mm512_maskz_extracti64x4_epi64(__mmask8(0xF), hi, 1)));
        const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(r1, r0);
        _mm512_mask_storeu_epi32(static_cast<void*>(out + (N + n) * ldo + k / 2), m, lo);
      }
  }
#endif

  // out[r][g][:] = sum_k A[r, k] * Bp[k][g][:] for r < M. With few rows (N = 1 is the
  // GEMV of batch-1 inference) the M*G accumulation chains cannot hide the FMA latency,
  // so the k loop is split into U interleaved partial sums.
  // The tile of gates G0 .. G0+GN-1 only (block_product_split's tiles) keeps the
  // partial sums U of the whole tile of M rows, so that its elements' bits are the same.
  // The accumulators' loops are unrolled by pragma: otherwise GCC keeps acc on the stack and
  // copies it through memory around the k loop (14% of the float32 LSTM's 6-row tile at N=32).
  template <int G, int M, class P, int G0 = 0, int GN = G>
  RNNCORE_TILE static void tile(const S* A, int64_t lda, int64_t K, const P* Bp, S* out,
                                bool accumulate) {
    constexpr int U = M * G >= 8 ? 1 : (M * G >= 4 ? 2 : 4);
    if constexpr (M == 1 && GN == G && std::is_same_v<P, Float16Halves>) {
      return tile_halves<G, U>(A, K, reinterpret_cast<const uint16_t*>(Bp), out, accumulate);
    }
#if RNNCORE_FMA_BROADCAST
    if constexpr (W == 16 && std::is_same_v<S, float> && std::is_same_v<P, S>) {
      if (kMemoryBroadcast) return tile_broadcast<G, M, U, G0, GN>(A, lda, K, Bp, out, accumulate);
    }
#endif
    const vec zero = {};
    vec acc[U][M][GN];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < GN; ++g)
          acc[u][r][g] = u == 0 && accumulate
                             ? *reinterpret_cast<const vec*>(out + (r * G + G0 + g) * W)
                             : zero;
    int64_t k = 0;
    for (; k + U <= K; k += U)
      for (int u = 0; u < U; ++u) {
        vec b[GN];
        load_gates<G, G0, GN>(Bp + (k + u) * G * W, b);
        for (int r = 0; r < M; ++r) {
          const S a = A[r * lda + k + u];
          for (int g = 0; g < GN; ++g) acc[u][r][g] += a * b[g];
        }
      }
    for (; k < K; ++k) {
      vec b[GN];
      load_gates<G, G0, GN>(Bp + k * G * W, b);
      for (int r = 0; r < M; ++r) {
        const S a = A[r * lda + k];
        for (int g = 0; g < GN; ++g) acc[0][r][g] += a * b[g];
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < GN; ++g) {
        vec sum = acc[0][r][g];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum += acc[u][r][g];
        *reinterpret_cast<vec*>(out + (r * G + G0 + g) * W) = sum;
      }
  }

#if RNNCORE_FMA_BROADCAST
  // tile's float32 product, its FMAs taking A's element from memory (RNNCORE_FMA_BROADCAST).
  // The unroll pragmas keep the accumulators in registers (asm operands otherwise pin the
  // arrays to the stack).
  template <int G, int M, int U, int G0, int GN>
  RNNCORE_TILE static void tile_broadcast(const S* A, int64_t lda, int64_t K, const S* Bp, S* out,
                                          bool accumulate) {
    __m512 acc[U][M][GN];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < GN; ++g)
          acc[u][r][g] = u == 0 && accumulate ? _mm512_loadu_ps(out + (r * G + G0 + g) * W)
                                              : _mm512_setzero_ps();
    const auto kstep = [&](int u, int64_t k) __attribute__((always_inline)) {
      __m512 b[GN];
#pragma GCC unroll 8
      for (int g = 0; g < GN; ++g) b[g] = _mm512_loadu_ps(Bp + (k * G + G0 + g) * W);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const S* a = A + r * lda + k;
#pragma GCC unroll 8
        for (int g = 0; g < GN; ++g)
          asm("vfmadd231ps %[a]%{1to16%}, %[b], %[acc]"
              : [acc] "+v"(acc[u][r][g])
              : [b] "v"(b[g]), [a] "m"(*a));
      }
    };
    int64_t k = 0;
    for (; k + U <= K; k += U)
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) kstep(u, k + u);
    for (; k < K; ++k) kstep(0, k);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < GN; ++g) {
        __m512 sum = acc[0][r][g];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][r][g]);
        _mm512_storeu_ps(out + (r * G + G0 + g) * W, sum);
      }
  }
#endif

  // tile<G, 1> on float16 panels, each vector of 16 as two 256-bit halves: where a 512-bit
  // vcvtph2ps issues at half the rate of two 256-bit ones (widen_f16_by_halves), batch 1 is
  // bound by the conversions. The same FMAs lane by lane in the same order: the same bits.
  template <int G, int U>
  RNNCORE_TILE static void tile_halves(const S* A, int64_t K, const uint16_t* Bp, S* out,
                                       bool accumulate) {
#if RNNCORE_FUSED_HALF_PANELS
    static_assert(W == 16 && std::is_same_v<S, float>);
    typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));
    const v8 zero = {};
    v8 acc[U][G][2];  // in registers by the unrolled loops, as tile's
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
          acc[u][g][h] =
              u == 0 && accumulate ? *reinterpret_cast<const v8*>(out + g * W + h * 8) : zero;
    const auto ld = [](const uint16_t* p) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      v8 r;
      std::memcpy(&r, &v, sizeof r);
      return r;
    };
    int64_t k = 0;
    for (; k + U <= K; k += U)
      for (int u = 0; u < U; ++u) {
        const S a = A[k + u];
        for (int g = 0; g < G; ++g)
          for (int h = 0; h < 2; ++h) acc[u][g][h] += a * ld(Bp + ((k + u) * G + g) * W + h * 8);
      }
    for (; k < K; ++k) {
      const S a = A[k];
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < 2; ++h) acc[0][g][h] += a * ld(Bp + (k * G + g) * W + h * 8);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        v8 sum = acc[0][g][h];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) sum += acc[u][g][h];
        *reinterpret_cast<v8*>(out + g * W + h * 8) = sum;
      }
#else
    (void)A, (void)K, (void)Bp, (void)out, (void)accumulate;
#endif
  }

  template <int G, class P, int M = rows<G>()>
  static void tile_rows(int m, const S* A, int64_t lda, int64_t K, const P* Bp, S* out,
                        bool accumulate) {
    if constexpr (M > 1) {
      if (m < M) return tile_rows<G, P, M - 1>(m, A, lda, K, Bp, out, accumulate);
    }
    tile<G, M>(A, lda, K, Bp, out, accumulate);
  }

  // out[n][g][:] = sum_k A[n, k] * panel[k][g][:] for every row n < N. The k loop is
  // blocked by chunks of the panel of 24 KiB or 256 k-rows, whichever is longer, that every
  // row tile passes over. Each chunk reloads and stores the tiles' sums; a 6-row tile
  // streams its panel from L2 well within L2's bandwidth, and Zen 4's 32 KiB L1 does not hold
  // a 24 KiB chunk beside the rows anyway (T=100 N=32 H=256, alternating processes against
  // 24 KiB: LSTM 0.98-0.99 of the time on Zen 4, within noise to 64 KiB on the Xeon; GRU
  // 0.98). With `accumulate`, out's products are added to (from its first k on).
  // KC by float32 elements whatever the panels hold: 16-bit panels then sum in the float32
  // panels' order, so that narrow storage keeps the float32 operation's bits (blocked by
  // their own size, the float16 LSTM at N=1 H=256 rounded 5 of 7936 outputs differently).
  template <int G, class P = S>
  static void block_product(const S* A, int64_t lda, int64_t N, int64_t K, const P* panel, S* out,
                            bool accumulate = false) {
    constexpr int M = rows<G>();
    constexpr int64_t KC =
        std::max<int64_t>(256, 24576 / (G * W * static_cast<int64_t>(sizeof(S))));
    if constexpr (split_rows<G>() > M) {
      if (N >= split_rows<G>())
        return block_product_split<G, P, KC>(A, lda, N, K, panel, out, accumulate);
    }
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K - k0);
      for (int64_t n0 = 0; n0 < N; n0 += M) {
        const int m = static_cast<int>(std::min<int64_t>(M, N - n0));
        tile_rows<G, P>(m, A + n0 * lda + k0, lda, kc, panel + k0 * G * W, out + n0 * G * W,
                        k0 > 0 || accumulate);
      }
    }
  }

  // With 16 vector registers (AVX2) the four LSTM gates' tile holds 2 rows, 8 accumulation
  // chains: barely the FMA latency times its two pipes. Two gates at a time hold 6 rows
  // (12 chains, 2 loads of the panel per 6 broadcasts, as OpenBLAS's 6x16 SGEMM kernel).
  template <int G>
  static constexpr int split_rows() {
    return kRegs == 16 && G == 4 ? 6 : 0;
  }
  template <int G, class P, int64_t KC>
  static void block_product_split(const S* A, int64_t lda, int64_t N, int64_t K, const P* panel,
                                  S* out, bool accumulate) {
    constexpr int M = split_rows<G>(), GN = G / 2;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K - k0);
      const bool acc = k0 > 0 || accumulate;
      const P* Bp = panel + k0 * G * W;
      // The rows in tiles of as even sizes as the tiles allow (N = 32: 6, 6, 5, 5, 5, 5), each
      // of 3 rows at least. Two rows or more take one partial sum (tile's U), as the unsplit
      // tiles of rows<G>() = 2 rows did, and the last row of an odd N the two of their tile
      // of one row (its own tile here): the bits are theirs.
      const int64_t even = N & ~int64_t(1);
      const int64_t tiles = (even + M - 1) / M, base = even / tiles, extra = even % tiles;
      for (int64_t i = 0, n0 = 0; i < tiles; ++i) {
        const int m = static_cast<int>(base + (i < extra));
        split_tile<G, P, GN, M>(m, A + n0 * lda + k0, lda, kc, Bp, out + n0 * G * W, acc);
        n0 += m;
      }
      if (even < N) tile<G, 1>(A + even * lda + k0, lda, kc, Bp, out + even * G * W, acc);
    }
  }
  template <int G, class P, int GN, int M>
  static void split_tile(int m, const S* A, int64_t lda, int64_t K, const P* Bp, S* out,
                         bool accumulate) {
    static_assert(M >= 3 && G * 2 >= 8, "one partial sum (tile's U) from 2 rows on");
    if constexpr (M > 3) {
      if (m < M) return split_tile<G, P, GN, M - 1>(m, A, lda, K, Bp, out, accumulate);
    }
    tile<G, M, P, 0, GN>(A, lda, K, Bp, out, accumulate);
    tile<G, M, P, GN, GN>(A, lda, K, Bp, out, accumulate);
  }

  // v[0:W] = F(v[0:W]) in place; sigmoid and tanh by vmath's AVX-512 or AVX2 forms where they
  // exist.
  template <class F>
  static RNNCORE_VMATH_INLINE void apply(F f, S* v) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<S, float> && W == 16) {
      if constexpr (std::is_same_v<F, act::Sigmoid<S>>)
        return _mm512_storeu_ps(v, vmath::v16::sigmoid(_mm512_loadu_ps(v)));
      if constexpr (std::is_same_v<F, act::Tanh<S>>)
        return _mm512_storeu_ps(v, vmath::v16::tanh(_mm512_loadu_ps(v)));
    }
#elif RNNCORE_FUSED_ROWS
    if constexpr (std::is_same_v<S, float> && W == 8) {
      if constexpr (std::is_same_v<F, act::Sigmoid<S>>)
        return _mm256_storeu_ps(v, vmath::v8::sigmoid(_mm256_loadu_ps(v)));
      if constexpr (std::is_same_v<F, act::Tanh<S>>)
        return _mm256_storeu_ps(v, vmath::v8::tanh(_mm256_loadu_ps(v)));
    }
#endif
    for (int w = 0; w < W; ++w) v[w] = f.value(v[w]);
  }
  static void act(Activation a, S* v) {
    with_activation<S>(a, [v](auto F) { apply(F, v); });
  }
  // f over K gates' vectors v[0:K*W] in one loop: at N = 1 each gate is one vector, and a
  // call per gate is one dependency chain that nothing overlaps; K chains in a loop do.
  template <int K>
  static void act_k(Activation a, S* v) {
    with_activation<S>(a, [v](auto F) {
      for (int k = 0; k < K; ++k) apply(F, v + k * W);
    });
  }
  // The four LSTM gates (v[g*W..]) by their activations: in one loop when they share one, or
  // when all but one do (three sigmoids and a tanh by default).
  static void act_gates4(const std::array<Activation, 4>& f, S* v, int64_t rows = 1) {
    int ones = 0, odd = 0;
    for (int g = 0; g < 4; ++g)
      if (std::count(f.begin(), f.end(), f[g]) == 1) ones += 1, odd = g;
    if (ones == 0 && std::count(f.begin(), f.end(), f[0]) == 4)
      return act_rows(f[0], v, rows * 4, W);
    if (ones != 1) {
      for (int g = 0; g < 4; ++g) act_rows(f[g], v + g * W, rows, 4 * W);
      return;
    }
    int rest[3];
    for (int g = 0, j = 0; g < 4; ++g)
      if (g != odd) rest[j++] = g;
    with_activation<S>(f[(odd + 1) % 4], [&](auto F) {
      with_activation<S>(f[odd], [&](auto F1) {
        for (int64_t n = 0; n < rows; ++n) {
          S* r = v + n * 4 * W;
          apply(F, r + rest[0] * W);
          apply(F, r + rest[1] * W);
          apply(F, r + rest[2] * W);
          apply(F1, r + odd * W);
        }
      });
    });
  }
  // f over `rows` vectors of W, `stride` elements apart.
  static void act_rows(Activation a, S* v, int64_t rows, int64_t stride) {
    with_activation<S>(a, [v, rows, stride](auto F) {
      for (int64_t n = 0; n < rows; ++n) apply(F, v + n * stride);
    });
  }

  // The GRU's z and r (v[0:2W], z at zo * W): one loop when they share an activation.
  static void act_zr(Activation act_z, Activation act_r, int64_t zo, S* v) {
    if (act_z == act_r) return act_k<2>(act_z, v);
    act(act_z, v + zo * W);
    act(act_r, v + (1 - zo) * W);
  }

  // The 16 lines a 16×16 transpose reads (a block's rows are 16 streams: more than the
  // hardware prefetchers follow, so a pack waits on every line without these).
  static void prefetch16(const void* src, int64_t ld) {
    const char* p = static_cast<const char*>(src);
    for (int i = 0; i < 16; ++i) __builtin_prefetch(p + i * ld, 0, 3);
  }
  // Blocks a pack prefetches ahead (2: 8% less time at T = 1 than none or 4, in alternating
  // runs of the bfloat16 LSTM at N = 1, H = 256).
  static constexpr int64_t kAhead = 2;
#if defined(__AVX512F__)
  // The 16×16 32-bit elements at src (16 rows, ld bytes apart) transposed: r[c] holds
  // column c. Packing by these moves a cache line per load and per store.
  static void transpose16(const void* src, int64_t ld, __m512i (&r)[16]) {
    const char* p = static_cast<const char*>(src);
    // (maskz: the unmasked forms' undefined pass-through trips GCC's uninitialised warning)
    const __mmask16 m16 = 0xFFFF;
    const __mmask8 m8 = 0xFF;
    __m512i t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(static_cast<const void*>(p + i * ld));
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_maskz_unpacklo_epi32(m16, r[i], r[i + 1]);
      t[i + 1] = _mm512_maskz_unpackhi_epi32(m16, r[i], r[i + 1]);
    }
    // r[i + m], i = 0, 4, 8, 12: 128-bit lane L holds rows i..i+3 of column 4L + m.
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_maskz_unpacklo_epi64(m8, t[i], t[i + 2]);
      r[i + 1] = _mm512_maskz_unpackhi_epi64(m8, t[i], t[i + 2]);
      r[i + 2] = _mm512_maskz_unpacklo_epi64(m8, t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_maskz_unpackhi_epi64(m8, t[i + 1], t[i + 3]);
    }
    for (int m = 0; m < 4; ++m) {
      const __m512i u = _mm512_maskz_shuffle_i32x4(m16, r[m], r[4 + m], 0x88);
      const __m512i v = _mm512_maskz_shuffle_i32x4(m16, r[m], r[4 + m], 0xDD);
      const __m512i u2 = _mm512_maskz_shuffle_i32x4(m16, r[8 + m], r[12 + m], 0x88);
      const __m512i v2 = _mm512_maskz_shuffle_i32x4(m16, r[8 + m], r[12 + m], 0xDD);
      t[m] = _mm512_maskz_shuffle_i32x4(m16, u, u2, 0x88);
      t[8 + m] = _mm512_maskz_shuffle_i32x4(m16, u, u2, 0xDD);
      t[4 + m] = _mm512_maskz_shuffle_i32x4(m16, v, v2, 0x88);
      t[12 + m] = _mm512_maskz_shuffle_i32x4(m16, v, v2, 0xDD);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
  }
  static constexpr bool kTranspose = W == 16 && sizeof(S) == 4;
#else
  static constexpr bool kTranspose = false;
#endif
  // The 32 elements from `rows` of 16 rows of 16-bit elements (ld elements apart) as 16 pairs
  // of k, pair j (16 rows × 2) at out + j * stride. Only where kTranspose.
  static void pairs_block(const uint16_t* rows, int64_t ld, uint16_t* out, int64_t stride) {
#if defined(__AVX512F__)
    if constexpr (kTranspose) {
      __m512i r[16];
      transpose16(rows, ld * 2, r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(static_cast<void*>(out + j * stride), r[j]);
    }
#endif
    (void)rows, (void)ld, (void)out, (void)stride;
  }

  // pack_panels of a whole panel b by 16×16 transposes, for k below the value returned (a
  // multiple of 16 for 32-bit elements, of 32 for 16-bit ones; 0 without transposes).
  template <int G, class P>
  static int64_t transposed_panels(const P* R, int64_t H, int64_t K, const int (&gates)[G],
                                   int64_t b, P* panel) {
#if defined(__AVX512F__)
    if constexpr (kTranspose) {
      constexpr int64_t KB = sizeof(P) == 4 ? 16 : 32;
      // Gate by gate (16 rows' streams at a time), the block kAhead on prefetched.
      const int64_t nk = K / KB, ld = K * int64_t(sizeof(P));
      const auto rows = [&](int64_t i) {
        return R + (gates[i / nk] * H + b * W) * K + i % nk * KB;
      };
      for (int64_t i = 0; i < G * nk; ++i) {
        const int g = static_cast<int>(i / nk);
        const int64_t k0 = i % nk * KB;
        if (i + kAhead < G * nk) prefetch16(rows(i + kAhead), ld);
        __m512i r[16];
        transpose16(rows(i), ld, r);
        if constexpr (sizeof(P) == 4) {
          for (int k = 0; k < 16; ++k)
            _mm512_storeu_si512(static_cast<void*>(panel + ((k0 + k) * G + g) * W), r[k]);
        } else {
          // r[j]: the pair k0 + 2j, k0 + 2j + 1 of the 16 units; split into the two k by one
          // permute (even words, then odd ones) rather than two narrowing moves.
          const __m512i evens_odds =
              _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28,
                               26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
          for (int j = 0; j < 16; ++j) {
            const __m512i v = _mm512_permutexvar_epi16(evens_odds, r[j]);
            _mm512_mask_storeu_epi16(panel + ((k0 + 2 * j) * G + g) * W, __mmask32(0xFFFF), v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + ((k0 + 2 * j + 1) * G + g) * W),
                                _mm512_maskz_extracti64x4_epi64(__mmask8(0xF), v, 1));
          }
        }
      }
      return nk * KB;
    }
#elif defined(__AVX2__)
    if constexpr (W == 8 && sizeof(S) == 4 && (sizeof(P) == 4 || sizeof(P) == 2)) {
      // AVX2: by 8×8 transposes of 8 k (the element loop's strided loads were a tenth of a
      // batch-1 LSTM's time, T = 100, H = 256, on Zen 3).
      const int64_t nk = K / 8;
      for (int g = 0; g < G; ++g)
        for (int64_t i = 0; i < nk; ++i) {
          const P* rows = R + (gates[g] * H + b * W) * K + i * 8;
          P* out = panel + (i * 8 * G + g) * W;
          if constexpr (sizeof(P) == 4)
            transpose8x8_32(rows, K, out, G * W);
          else
            transpose8x8_16(rows, K, out, G * W);
        }
      return nk * 8;
    }
#endif
    (void)R, (void)H, (void)K, (void)gates, (void)b, (void)panel;
    return 0;
  }
#if defined(__AVX2__) && !defined(__AVX512F__)
  // The 8×8 block of 32-bit elements at src (rows ld elements apart) transposed: column k to
  // dst + k * stride.
  template <class P>
  static void transpose8x8_32(const P* src, int64_t ld, P* dst, int64_t stride) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i)
      r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * ld));
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      r[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
      r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
      r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
      r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + k * stride),
                       _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + (k + 4) * stride),
                       _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
    }
  }
  // The same of 16-bit elements.
  template <class P>
  static void transpose8x8_16(const P* src, int64_t ld, P* dst, int64_t stride) {
    __m128i a[8], c[8];
    for (int i = 0; i < 8; ++i)
      a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ld));
    for (int i = 0; i < 8; i += 2) {  // c[i]: rows i, i+1 for k 0-3; c[i+1]: k 4-7
      c[i] = _mm_unpacklo_epi16(a[i], a[i + 1]);
      c[i + 1] = _mm_unpackhi_epi16(a[i], a[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {  // a[h + j]: rows h .. h+3 for k 2j, 2j+1
      a[h] = _mm_unpacklo_epi32(c[h], c[h + 2]);
      a[h + 1] = _mm_unpackhi_epi32(c[h], c[h + 2]);
      a[h + 2] = _mm_unpacklo_epi32(c[h + 1], c[h + 3]);
      a[h + 3] = _mm_unpackhi_epi32(c[h + 1], c[h + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * j * stride),
                       _mm_unpacklo_epi64(a[j], a[j + 4]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * j + 1) * stride),
                       _mm_unpackhi_epi64(a[j], a[j + 4]));
    }
  }
#endif

  // Packs gate rows gates[0..G) of R [*, K] (H units a gate) for panels [b0, b1):
  // Bp[b][k][g][w].
  template <int G, class P>
  static void pack_panels(const P* R, int64_t H, int64_t K, const int (&gates)[G], int64_t b0,
                          int64_t b1, P* Bp) {
    for (int64_t b = b0; b < b1; ++b) pack_panel(R, H, K, gates, b, Bp + b * K * G * W);
  }

  // pack_panels of float16 R into float32 panels (Dir::R_widen): each panel packed as float16
  // into its own upper half, then widened forwards in place (a vector's bytes are read before
  // any write reaches them). The values exactly: the float32 panels' bits.
  template <int G>
  static void pack_widened(const uint16_t* R, int64_t H, int64_t K, const int (&gates)[G],
                           int64_t b0, int64_t b1, S* Bp) {
    if constexpr (kHalfPanels) {
      const int64_t n = K * G * W;  // (even: W is)
      for (int64_t b = b0; b < b1; ++b) {
        S* panel = Bp + b * n;
        const uint16_t* half = reinterpret_cast<uint16_t*>(panel + n / 2);
        pack_panel(R, H, K, gates, b, reinterpret_cast<uint16_t*>(panel + n / 2));
        for (int64_t i = 0; i < n; i += W) store(panel + i, load(half + i));
      }
    } else {
      (void)R, (void)H, (void)K, (void)gates, (void)b0, (void)b1, (void)Bp;
    }
  }

  template <int G, class P>
  static void pack_panel(const P* R, int64_t H, int64_t K, const int (&gates)[G], int64_t b,
                         P* panel) {
    // By blocks of W×KB: the W rows' blocks stay in L1 while the panel's lines are written
    // (a whole row per unit would write a line per k, every row).
    constexpr int64_t KB = 16;
    const int64_t wv = std::min<int64_t>(W, H - b * W);
    const int64_t kv = wv == W ? transposed_panels(R, H, K, gates, b, panel) : 0;
    for (int64_t k0 = kv; k0 < K; k0 += KB) {
      const int64_t kb = std::min(KB, K - k0);
      for (int g = 0; g < G; ++g) {
        const P* rows = R + (gates[g] * H + b * W) * K + k0;
        for (int64_t k = 0; k < kb; ++k) {
          P* out = panel + ((k0 + k) * G + g) * W;
          for (int64_t w = 0; w < wv; ++w) out[w] = rows[w * K + k];
          for (int64_t w = wv; w < W; ++w) out[w] = P{};
        }
      }
    }
    pair_gates<G>(panel, K);
  }

  // Workspace (elements): packed panels, two masked-state buffers, zeros, and per-op extras;
  // then, with a fused projection, W's panels (64-byte aligned).
  static int64_t workspace_base(const Problem& p) {
    const int64_t nb = (p.H + W - 1) / W, NH = p.N * p.H;
    return (nb * p.H * p.G * W + 5 * NH + 64 + 15) / 16 * 16;
  }
  static int64_t workspace(const Problem& p) {
    const int64_t nb = (p.H + W - 1) / W;
    const bool w = p.fused_projection || p.lazy_projection;
    return workspace_base(p) + (w ? nb * p.I * p.G * W : 0);
  }
  // Panels whose products an LSTM step of one row computes before their epilogues.
  static constexpr int64_t kBatch = 16;
  // Scratch of one participant: the products of one panel for every row.
  // On the vdpbf16ps path also h̃'s bfloat16 pairs.
  static int64_t block_base(const Problem& p) {
    return (p.N * p.G * W + (kDotBf16 ? 2 * p.N * ((p.H + 1) / 2) + 16 : 0) + 15) / 16 * 16;
  }
  // Then, for a fused projection on pairs or of the GRU (panel_x), that product of the
  // panel for every row.
  static int64_t block(const Problem& p) {
    const bool xblk = p.fused_projection && (kDotBf16 || p.op != detail::OpKind::Lstm);
    return block_base(p) + (xblk ? p.N * p.G * W : 0);
  }
  // A reset-before GRU runs each step in two phases: its candidate product needs r of
  // every unit.
  static int phases(const Problem& p) {
    return p.op == detail::OpKind::Gru && !p.gru.reset_after ? 2 : 1;
  }

  // Shared per-direction state of a call.
  struct Buffers {
    S* panels;
    S* hm[2];  // h̃ of the step about to run (masked state), double-buffered
    S* zeros;
    S* extra[2];      // LSTM: cell ping-pong without a cell output; GRU: z and r ⊙ h̃
    S* w_panels;      // W's panels with a fused projection: [b][k < I][g][w]
    bool f16_halves;  // float16 panels widened by halves (widen_f16_by_halves)
  };
  static Buffers buffers(const Problem& p, S* ws) {
    const int64_t nb = (p.H + W - 1) / W, NH = p.N * p.H;
    Buffers b;
    b.panels = ws;
    S* q = ws + nb * p.H * p.G * W;
    b.hm[0] = q;
    b.hm[1] = q + NH;
    b.zeros = q + 2 * NH;
    b.extra[0] = q + 3 * NH;
    b.extra[1] = q + 4 * NH;
    b.w_panels = ws + workspace_base(p);
    b.f16_halves = widen_f16_by_halves();
    return b;
  }

  // Whether direction a's panels are 16-bit (narrow storage and an ISA that converts).
  static bool half_panels(const Dir& a) {
    return kHalfPanels && a.R_narrow != nullptr && !a.R_widen;
  }
  // Whether direction a's panels are bfloat16 pairs for vdpbf16ps.
  static bool dot_panels(const Dir& a) { return kDotBf16 && half_panels(a) && a.R_bfloat16; }
  // Whether W's panels are 16-bit (lazy_projection of float16, or off vdpbf16ps bfloat16,
  // storage: W_bits, W null; R_bfloat16 says which).
  static bool half_w(const Dir& a) { return kHalfPanels && a.W_bits && !dot_panels(a); }
  // A panel's extent along k (elements): the pairs' even count on the vdpbf16ps path.
  static int64_t kext(const Problem& p, const Dir& a) {
    return dot_panels(a) ? (p.H + 1) / 2 * 2 : p.H;
  }

  // The product's left operand: h̃ in float32 and, on the vdpbf16ps path, its bfloat16 pairs
  // (in the scratch after the product's block).
  struct Operand {
    const S* data;
    int64_t ld;
    const Pair* pairs;
    int64_t ld2;
    bool split;  // pairs: hi rows, then lo rows (a training forward)
  };
  // Which operand a participant's pairs hold (after them in its scratch, zeroed per call): a
  // participant's chunks of one step share h̃, converted once.
  struct OperandKey {
    const void* A;
    const void* dir;
    int64_t step, lda;
  };
  // With bits, A holds bfloat16 rows already (lda apart, H even): they are copied as they
  // are (tile loads of rows the other thread has just written ran slower than the copy).
  static Operand product_operand(const Problem& p, const Dir& a, const S* A, int64_t lda, int64_t s,
                                 S* blk, const uint16_t* bits = nullptr) {
    Operand o{A, lda, nullptr, 0, false};
#if RNNCORE_FUSED_DOT_BF16
    if (dot_panels(a)) {
      Pair* pairs = reinterpret_cast<Pair*>(blk + p.N * p.G * W);
      o.ld2 = (p.H + 1) / 2;
      o.split = a.z || a.z_bits;
      o.pairs = pairs;
      const OperandKey key{bits ? static_cast<const void*>(bits) : A, &a, s, lda};
      void* held = pairs + 2 * p.N * o.ld2;
      OperandKey had;
      std::memcpy(&had, held, sizeof had);
      if (had.A == key.A && had.dir == key.dir && had.step == key.step && had.lda == key.lda)
        return o;
      if (bits)
        for (int64_t n = 0; n < p.N; ++n)
          std::memcpy(static_cast<void*>(pairs + n * o.ld2), bits + n * lda,
                      static_cast<size_t>(p.H) * sizeof(uint16_t));
      else
        to_pairs(A, lda, p.N, p.H, pairs, o.ld2, o.split);
      std::memcpy(held, &key, sizeof key);
    }
#else
    (void)p, (void)a, (void)s, (void)blk, (void)bits;
#endif
    return o;
  }

  // block_product of the rows [0, N) of A over the panel that starts `panel` gate-row sets of
  // W units into the panels, in their type.
  template <int G>
  static void panel_product(const Problem& p, const Dir& a, const Buffers& bf, int64_t panel,
                            const Operand& op, int64_t N, S* out, bool accumulate = false) {
    const int64_t K = p.H, offset = panel * kext(p, a) * W;
    const S* A = op.data;
    const int64_t lda = op.ld;
#if RNNCORE_FUSED_DOT_BF16
    if (op.pairs) {
      const Pair* B =
          reinterpret_cast<const Pair*>(reinterpret_cast<const uint16_t*>(bf.panels) + offset);
      if (op.split)
        return block_product_dot<G, true>(op.pairs, op.ld2, N * op.ld2, N, (K + 1) / 2, B, out);
      return block_product_dot<G, false>(op.pairs, op.ld2, 0, N, (K + 1) / 2, B, out);
    }
#endif
    if constexpr (kHalfPanels) {
      if (half_panels(a) && a.R_bfloat16)
        return block_product<G, BFloat16Elem>(
            A, lda, N, K, reinterpret_cast<const BFloat16Elem*>(bf.panels) + offset, out,
            accumulate);
      if constexpr (W == 16) {
        if (half_panels(a) && bf.f16_halves)
          return block_product<G, Float16Halves>(
              A, lda, N, K, reinterpret_cast<const Float16Halves*>(bf.panels) + offset, out,
              accumulate);
      }
      if (half_panels(a))
        return block_product<G, uint16_t>(
            A, lda, N, K, reinterpret_cast<const uint16_t*>(bf.panels) + offset, out, accumulate);
    }
    block_product<G>(A, lda, N, K, bf.panels + offset, out, accumulate);
  }

  struct Rows {
    const S* data;
    int64_t ld;
  };

  // Sets up the units [u0, u1) for step 0: zeros, and h̃[0] when masked.
  static void init_units(const Problem& p, const Dir& a, const Buffers& bf, int64_t u0,
                         int64_t u1) {
    const S* h0 = static_cast<const S*>(a.h0);
    const S* m = static_cast<const S*>(a.mask);
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t u = u0; u < u1; ++u) {
        bf.zeros[n * p.H + u] = S(0);
        if (m) bf.hm[0][n * p.H + u] = (h0 ? h0[n * a.h0_ld + u] : S(0)) * m[n * a.mask_ld + u];
      }
  }

  // The state entering step s (unmasked), and the product's left operand h̃.
  static Rows prev_state(const Problem& p, const Dir& a, const Buffers& bf, int64_t s) {
    if (s == 0) return a.h0 ? Rows{static_cast<const S*>(a.h0), a.h0_ld} : Rows{bf.zeros, p.H};
    const int64_t t = a.flip_out ? p.T - s : s - 1;
    return {static_cast<const S*>(a.y) + t * p.N * a.y_ld, a.y_ld};
  }
  static Rows operand(const Dir& a, const Buffers& bf, Rows hprev, int64_t s, int64_t H) {
    return a.mask ? Rows{bf.hm[s & 1], H} : hprev;
  }

  // Stores h for units [u0, u0 + wv) of row n (into the step's rows y, or in bfloat16 into
  // yb), and h ⊙ m for the next step.
  static void store_h(const Dir& a, const Buffers& bf, S* y, int64_t n, int64_t u0, int64_t wv,
                      const S* h, int64_t s, int64_t H, uint16_t* yb = nullptr) {
    if (yb)
      store_bits(yb + n * a.y_ld + u0, h, wv);
    else
      std::memcpy(y + n * a.y_ld + u0, h, static_cast<size_t>(wv) * sizeof(S));
    if (yb && a.z_bits && !a.mask)  // the float32 state of a training forward's next step
      std::memcpy(bf.hm[(s + 1) & 1] + n * H + u0, h, static_cast<size_t>(wv) * sizeof(S));
    if (a.mask) {
      const S* m = static_cast<const S*>(a.mask) + n * a.mask_ld + u0;
      S* out = bf.hm[(s + 1) & 1] + n * H + u0;
      for (int64_t w = 0; w < wv; ++w) out[w] = h[w] * m[w];
    }
  }

  // dst[w] = bfloat16(src[w]) for w < n, as narrow_bfloat16 rounds (the whole-array pass
  // that the outputs written this way skip).
  static void store_bits(uint16_t* dst, const S* src, int64_t n) {
#if RNNCORE_FUSED_DOT_BF16
    if constexpr (std::is_same_v<S, float>) {  // (the only variant that writes them)
      for (int64_t w = 0; w < n; w += 16) {
        const __mmask16 m = n - w >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - w)) - 1);
        store_bits16(dst + w, _mm512_maskz_loadu_ps(m, src + w), m);
      }
      return;
    }
#endif
    for (int64_t w = 0; w < n; ++w) dst[w] = float_to_bfloat16(static_cast<float>(src[w]));
  }
  // store_bits of a whole vector held in registers.
  static RNNCORE_VMATH_INLINE void store_bits(uint16_t* dst, vec v) {
#if RNNCORE_FUSED_DOT_BF16
    if constexpr (std::is_same_v<S, float> && W == 16) {
      __m512 x;
      std::memcpy(&x, &v, sizeof x);
      return store_bits16(dst, x, __mmask16(0xFFFF));
    }
#endif
    store_bits(dst, reinterpret_cast<const S*>(&v), W);
  }
#if RNNCORE_FUSED_DOT_BF16
  // vcvtneps2bf16 rounds every float32 as float_to_bfloat16 does (nearest even, NaN quieted)
  // but the subnormal ones, which it takes as zero: a vector holding one takes the integer
  // rounding (nine vector operations, against the instruction and two tests).
  static RNNCORE_VMATH_INLINE void store_bits16(uint16_t* dst, __m512 x, __mmask16 m) {
    const __mmask16 all = 0xFFFF;
    const __m512i xi = _mm512_castps_si512(x);
    const __mmask16 subnormal =
        _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(xi, _mm512_set1_epi32(0x7F800000)), xi,
                                    _mm512_set1_epi32(0x007FFFFF));
    if (__builtin_expect(subnormal == 0, 1)) {
      _mm256_mask_storeu_epi16(dst, m, (__m256i)_mm512_cvtneps_pbh(x));
      return;
    }
    const __m512i one = _mm512_set1_epi32(1), hi = _mm512_maskz_srli_epi32(all, xi, 16);
    const __m512i r =
        _mm512_maskz_srli_epi32(all,
                                _mm512_add_epi32(_mm512_add_epi32(xi, _mm512_set1_epi32(0x7FFF)),
                                                 _mm512_and_si512(hi, one)),
                                16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(xi, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __m512i q = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(dst, m, _mm512_maskz_cvtepi32_epi16(all, q));
  }
#endif

  static int64_t time_in(const Dir& a, int64_t s, int64_t T) { return a.flip_in ? T - 1 - s : s; }
  static int64_t time_out(const Dir& a, int64_t s, int64_t T) { return a.flip_out ? T - 1 - s : s; }

  // Step s's rows of x' (at input time), of the state output and of the training state (at
  // output time; null without one).
  struct StepRows {
    const S* x;
    S* y;
    S* z;
  };
  static StepRows step_rows(const Problem& p, const Dir& a, int64_t s) {
    const int64_t tout = time_out(a, s, p.T);
    return {a.xp ? static_cast<const S*>(a.xp) + time_in(a, s, p.T) * p.N * a.xp_ld : nullptr,
            a.y ? static_cast<S*>(a.y) + tout * p.N * a.y_ld : nullptr,
            a.z ? static_cast<S*>(a.z) + tout * p.N * a.z_ld : nullptr};
  }

  // Packs the recurrent weight's panels [b0, b1) (the rows of every gate for their units)
  // and sets up their units for step 0. The reset-before GRU packs the z and r rows first,
  // then the candidate rows, as two sets of panels.
  static void pack(const Problem& p, const Dir& a, S* ws, int64_t b0, int64_t b1) {
    const int64_t H = p.H;
    const Buffers bf = buffers(p, ws);
    const int64_t kx = kext(p, a);
    if (p.fused_projection || p.lazy_projection) {  // W's panels, in the sets of R's
      if (dot_panels(a)) {                          // W's bfloat16 bits (W_bits), as pairs
        pack_sets(p, p.I, reinterpret_cast<uint16_t*>(bf.w_panels),
                  [&](const auto& gates, uint16_t* out) {
                    pack_pairs(a.W_bits, H, p.I, gates, b0, b1, out);
                  });
      } else if (half_w(a) && a.R_bfloat16) {
        if constexpr (kHalfPanels)
          pack_sets(p, p.I, reinterpret_cast<BFloat16Elem*>(bf.w_panels),
                    [&](const auto& gates, BFloat16Elem* out) {
                      pack_panels(reinterpret_cast<const BFloat16Elem*>(a.W_bits), H, p.I, gates,
                                  b0, b1, out);
                    });
      } else if (half_w(a)) {
        if constexpr (kHalfPanels)
          pack_sets(p, p.I, reinterpret_cast<uint16_t*>(bf.w_panels),
                    [&](const auto& gates, uint16_t* out) {
                      pack_panels(a.W_bits, H, p.I, gates, b0, b1, out);
                    });
      } else {
        pack_sets(p, p.I, bf.w_panels, [&](const auto& gates, S* out) {
          pack_panels(static_cast<const S*>(a.W), H, p.I, gates, b0, b1, out);
        });
      }
    }
    if (dot_panels(a)) {
      pack_sets(p, kx, reinterpret_cast<uint16_t*>(bf.panels), [&](const auto& gates, auto* out) {
        pack_pairs(a.R_narrow, H, H, gates, b0, b1, out);
      });
      return init_units(p, a, bf, std::min(H, b0 * W), std::min(H, b1 * W));
    }
    if constexpr (kHalfPanels) {
      if (half_panels(a)) {
        if (a.R_bfloat16)
          pack_sets(p, kx, reinterpret_cast<BFloat16Elem*>(bf.panels),
                    [&](const auto& gates, auto* out) {
                      pack_panels(reinterpret_cast<const BFloat16Elem*>(a.R_narrow), H, H, gates,
                                  b0, b1, out);
                    });
        else
          pack_sets(p, kx, reinterpret_cast<uint16_t*>(bf.panels),
                    [&](const auto& gates, auto* out) {
                      pack_panels(a.R_narrow, H, H, gates, b0, b1, out);
                    });
        return init_units(p, a, bf, std::min(H, b0 * W), std::min(H, b1 * W));
      }
    }
    pack_sets(p, kx, bf.panels, [&](const auto& gates, auto* out) {
      if (a.R_widen)
        pack_widened(a.R_narrow, H, H, gates, b0, b1, out);
      else
        pack_panels(static_cast<const S*>(a.R), H, H, gates, b0, b1, out);
    });
    init_units(p, a, bf, std::min(H, b0 * W), std::min(H, b1 * W));
  }

  // Calls pack(gates, out) for every gate set of the op (its gate rows, and where its panels
  // start; kx: a panel's extent along k).
  template <class P, class Pack>
  static void pack_sets(const Problem& p, int64_t kx, P* panels, Pack pack) {
    const int64_t nb = (p.H + W - 1) / W;
    switch (p.op) {
      case detail::OpKind::Rnn: {
        static constexpr int gates[1] = {0};
        pack(gates, panels);
        break;
      }
      case detail::OpKind::Lstm: {
        static constexpr int gates[4] = {0, 1, 2, 3};
        pack(gates, panels);
        break;
      }
      case detail::OpKind::Gru:
        if (p.gru.reset_after) {
          static constexpr int gates[3] = {0, 1, 2};
          pack(gates, panels);
        } else {
          static constexpr int zr_gates[2] = {0, 1};
          static constexpr int o_gates[1] = {2};
          pack(zr_gates, panels);
          pack(o_gates, panels + nb * kx * 2 * W);
        }
        break;
    }
  }

  // pack_panels for vdpbf16ps: Bp[b][k/2][g][w][2] (bfloat16 bits of R [*, K], H units a
  // gate), k padded to even.
  template <int G>
  static void pack_pairs(const uint16_t* R, int64_t H, int64_t K, const int (&gates)[G], int64_t b0,
                         int64_t b1, uint16_t* Bp) {
    const int64_t Kp = (K + 1) / 2 * 2;
    for (int64_t b = b0; b < b1; ++b) {
      uint16_t* panel = Bp + b * Kp * G * W;
      const int64_t wv = std::min<int64_t>(W, H - b * W);
      int64_t kv = 0;  // k below kv packed by transposes
      if (kTranspose && wv == W) {
        // Gate by gate (16 rows' streams at a time), the block kAhead on prefetched.
        const int64_t nk = K / 32;
        const auto rows = [&](int64_t j) {
          return R + (gates[j / nk] * H + b * W) * K + j % nk * 32;
        };
        for (int64_t j = 0; j < G * nk; ++j) {
          if (j + kAhead < G * nk) prefetch16(rows(j + kAhead), K * 2);
          const int64_t k = j % nk * 32;
          pairs_block(rows(j), K, panel + (k / 2 * G + j / nk) * W * 2, G * W * 2);
        }
        kv = nk * 32;
      }
      for (int64_t k0 = kv; k0 < Kp; k0 += 16)
        for (int g = 0; g < G; ++g) {
          const uint16_t* rows = R + (gates[g] * H + b * W) * K;
          for (int64_t k = k0; k < std::min(k0 + 16, Kp); k += 2) {
            uint16_t* out = panel + (k / 2 * G + g) * W * 2;
            for (int64_t w = 0; w < wv; ++w) {
              out[2 * w] = rows[w * K + k];
              out[2 * w + 1] = k + 1 < K ? rows[w * K + k + 1] : uint16_t(0);
            }
            for (int64_t w = wv; w < W; ++w) out[2 * w] = out[2 * w + 1] = 0;
          }
        }
    }
  }

  // Phase `phase` of step s for the units of panels [b0, b1); blk holds block(p) elements.
  // Every unit's arithmetic is the same whichever panels share a call.
  static void step(const Problem& p, const Dir& a, S* ws, int64_t s, int phase, int64_t b0,
                   int64_t b1, S* blk, S* xpre, const CarrySlice<S>* carry) {
    const Buffers bf = buffers(p, ws);
    switch (p.op) {
      case detail::OpKind::Rnn: return rnn(p, a, bf, s, b0, b1, blk);
      case detail::OpKind::Lstm: return lstm(p, a, bf, s, b0, b1, blk, xpre, carry);
      case detail::OpKind::Gru:
        if (p.gru.reset_after) return gru_after(p, a, bf, s, b0, b1, blk, xpre);
        if (phase == 0) return gru_before_zr(p, a, bf, s, b0, b1, blk);
        return gru_before_o(p, a, bf, s, b0, b1, blk);
    }
  }

  // Elements of project_step's output per panel: an LSTM or reset-after GRU that projects its
  // steps' rows has a part of each step's products that does not depend on the step before
  // (the GRU's and the bfloat16 pairs' in a block of their own); 0 for the others.
  static int64_t project_block(const Problem& p) {
    const bool one_phase =
        p.op == detail::OpKind::Lstm || (p.op == detail::OpKind::Gru && p.gru.reset_after);
    return p.fused_projection && one_phase ? p.N * p.G * W : 0;
  }
  // That part of step s for panels [b0, b1) into xpre (project_block(p) elements a panel),
  // which step() then takes instead of computing it: run ahead by a thread that would
  // otherwise wait for the step before (fused.cpp). The same arithmetic as in the step.
  static void project_step(const Problem& p, const Dir& a, S* ws, int64_t s, int64_t b0, int64_t b1,
                           S* xpre) {
    const Buffers bf = buffers(p, ws);
    for (int64_t b = b0; b < b1; ++b) {
      S* const out = xpre + (b - b0) * p.N * p.G * W;
      if (p.op == detail::OpKind::Lstm)
        lstm_projection(p, a, bf, s, b, out);
      else
        panel_x<3>(p, a, bf, s, b, 0, nullptr, out);
    }
  }
  // Rows of x' [t0, t0 + m) (input time, batch 1, m <= kProjectRows, or kCarryRows where
  // carry_rows) for the units of panels [b0, b1): the source rows times W's panels (float32
  // tiles or bfloat16 pairs), plus the bias (Problem::lazy_projection). A row's sums do not
  // depend on the others of its block.
  static constexpr int64_t kProjectRows = 6;
  static void project_rows(const Problem& p, const Dir& a, S* ws, int64_t t0, int64_t m, int64_t b0,
                           int64_t b1) {
    const Buffers bf = buffers(p, ws);
    const int64_t G = p.G;
    alignas(64) S out[std::max(kProjectRows, kCarryRows) * 4 * W];
    for (int64_t b = b0; b < b1; ++b) {
      if (m == kCarryRows && carry_rows(p, a)) {  // a whole block: the carried sums' bits
        carry_complete(p, a, ws, t0, b, 0, out);
        continue;
      }
      const auto product = [&](auto g) {
        constexpr int kG = decltype(g)::value;
#if RNNCORE_FUSED_DOT_BF16
        if (dot_panels(a))
          return block_product_dot<kG, false>(
              reinterpret_cast<const Pair*>(a.x_bits + t0 * a.x_ld), a.x_ld / 2, 0, m, p.I / 2,
              reinterpret_cast<const Pair*>(reinterpret_cast<const uint16_t*>(bf.w_panels) +
                                            b * p.I * kG * W),
              out);
#endif
        if constexpr (kHalfPanels) {
          if (half_w(a) && a.R_bfloat16)
            return block_product<kG, BFloat16Elem>(
                static_cast<const S*>(a.x) + t0 * a.x_ld, a.x_ld, m, p.I,
                reinterpret_cast<const BFloat16Elem*>(bf.w_panels) + b * p.I * kG * W, out);
          if (half_w(a))
            return block_product<kG, uint16_t>(
                static_cast<const S*>(a.x) + t0 * a.x_ld, a.x_ld, m, p.I,
                reinterpret_cast<const uint16_t*>(bf.w_panels) + b * p.I * kG * W, out);
        }
        block_product<kG>(static_cast<const S*>(a.x) + t0 * a.x_ld, a.x_ld, m, p.I,
                          bf.w_panels + b * p.I * kG * W, out);
      };
      if (G == 4)
        product(std::integral_constant<int, 4>{});
      else
        product(std::integral_constant<int, 3>{});
      store_rows(p, a, t0, m, b, out);
    }
  }
  // Rows [t0, t0 + m) of x' for panel b's units: the sums `out` ([r][g][w]) plus the bias.
  static void store_rows(const Problem& p, const Dir& a, int64_t t0, int64_t m, int64_t b,
                         const S* out) {
    const int64_t H = p.H, G = p.G, u0 = b * W, wv = std::min<int64_t>(W, H - u0);
    S* const xp = static_cast<S*>(const_cast<void*>(a.xp));
    const S* const bias = static_cast<const S*>(a.bias);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < G; ++g) {
        S* const dst = xp + (t0 + r) * a.xp_ld + g * H + u0;
        const S* const src = out + (r * G + g) * W;
        if (bias)
          for (int64_t w = 0; w < wv; ++w) dst[w] = src[w] + bias[g * H + u0 + w];
        else if (wv == W)  // (a constant size: inlined, not a call to memcpy per row)
          std::memcpy(dst, src, sizeof(S) * W);
        else
          for (int64_t w = 0; w < wv; ++w) dst[w] = src[w];
      }
  }

  // FusedOps::carry_rows: an LSTM's inference at batch 1 on pairs whose steps take the
  // one-row path (lstm), x' filled by the steps (carry_product's sums, in blocks of
  // kCarryRows rows, kCarryGates gates of a pair of k a unit).
  static constexpr int64_t kCarryRows = 8;
  static constexpr int kCarryGates = 2;
  static int64_t carry_units(const Problem& p) { return p.I / 2 * (4 / kCarryGates); }
  static int64_t carry_rows(const Problem& p, const Dir& a) {
#if RNNCORE_FUSED_DOT_BF16
    if (p.lazy_projection && p.op == detail::OpKind::Lstm && p.N == 1 && p.H % W == 0 &&
        p.I % 2 == 0 && dot_panels(a) && a.x_bits && !a.z && !a.z_bits)
      return kCarryRows;
#endif
    (void)p, (void)a;
    return 0;
  }
  static void carry_complete(const Problem& p, const Dir& a, S* ws, int64_t t0, int64_t b,
                             int64_t k0, S* acc) {
#if RNNCORE_FUSED_DOT_BF16
    constexpr int G = 4;
    const Buffers bf = buffers(p, ws);
    if (k0 < carry_units(p))
      carry_product<G, kCarryRows, kCarryGates>(
          nullptr, 0, nullptr, nullptr, reinterpret_cast<const Pair*>(a.x_bits + t0 * a.x_ld),
          a.x_ld / 2, w_pairs<G>(p, bf, b), p.I / 2, acc, k0, carry_units(p));
    store_rows(p, a, t0, kCarryRows, b, acc);
#else
    (void)p, (void)a, (void)ws, (void)t0, (void)b, (void)k0, (void)acc;
#endif
  }
#if RNNCORE_FUSED_DOT_BF16
  // Panel b of W's pairs (lazy_projection on vdpbf16ps).
  template <int G>
  static const Pair* w_pairs(const Problem& p, const Buffers& bf, int64_t b) {
    return reinterpret_cast<const Pair*>(reinterpret_cast<const uint16_t*>(bf.w_panels) +
                                         b * p.I * G * W);
  }
#endif

  // Panel b's part of step s's products from the source rows: W's panels times them (float32,
  // from zero: the step's product with R accumulates onto it), or as bfloat16 pairs (the
  // source's rows as they are, an even I).
  static void lstm_projection(const Problem& p, const Dir& a, const Buffers& bf, int64_t s,
                              int64_t b, S* out) {
    constexpr int G = 4;
    const int64_t N = p.N, tin = time_in(a, s, p.T);
#if RNNCORE_FUSED_DOT_BF16
    if (dot_panels(a)) {
      block_product_dot<G, false>(
          reinterpret_cast<const Pair*>(a.x_bits + tin * N * a.x_ld), a.x_ld / 2, 0, N, p.I / 2,
          reinterpret_cast<const Pair*>(reinterpret_cast<const uint16_t*>(bf.w_panels) +
                                        b * p.I * G * W),
          out);
      return;
    }
#endif
    block_product<G>(static_cast<const S*>(a.x) + tin * N * a.x_ld, a.x_ld, N, p.I,
                     bf.w_panels + b * p.I * G * W, out);
  }

  // Gates [g0, g1) of the rows of x' (the input projection, x the step's) that the units of
  // panels [b0, b1) read, asked of L1 before the product that precedes their use: the rows'
  // parts sit H apart, a stride the hardware prefetcher does not follow (at batch 1 the
  // LSTM's epilogue spent a third of its time waiting on them). Not when they would crowd
  // the product's panel chunk (~24 KiB) out of L1: large batches measured slower with them.
  static void prefetch_x(const Problem& p, const Dir& a, const S* x, int g0, int g1, int64_t b0,
                         int64_t b1) {
    const int64_t u0 = b0 * W, u1 = std::min(b1 * W, p.H);
    if (!x || p.N * (g1 - g0) * (u1 - u0) * int64_t(sizeof(S)) > 16384) return;
    for (int64_t n = 0; n < p.N; ++n)
      for (int g = g0; g < g1; ++g) {
        const uintptr_t row = reinterpret_cast<uintptr_t>(x + n * a.xp_ld + g * p.H);
        const uintptr_t last = row + static_cast<uintptr_t>(u1) * sizeof(S) - 1;
        for (uintptr_t q = (row + static_cast<uintptr_t>(u0) * sizeof(S)) & ~uintptr_t(63);
             q <= last; q += 64)
          __builtin_prefetch(reinterpret_cast<const void*>(q));
      }
  }

  // Step s + 1's rows of x' when x' outgrows L2 (null otherwise, or at the last step): at
  // large batches x' (T·N·G·H) lives in memory, and a step's epilogue waited on its rows
  // (half the LSTM's epilogue at N = 32). Each row's units are asked of L2 a step ahead by
  // the thread that will most likely run them (its home chunk), a few lines at a time.
  static const S* next_x(const Problem& p, const Dir& a, int64_t s) {
    if (!a.xp || s + 1 >= p.T || p.T * p.N * a.xp_ld * int64_t(sizeof(S)) <= (int64_t(1) << 20))
      return nullptr;
    return step_rows(p, a, s + 1).x;
  }
  // Units [u0, u0 + W) of gates [g0, g1) of row n of those rows.
  static void prefetch_next_x(const S* xn, const Dir& a, int64_t n, int64_t H, int64_t u0, int g0,
                              int g1) {
    if (!xn) return;
    const S* r = xn + n * a.xp_ld + u0;
    for (int g = g0; g < g1; ++g) {
      __builtin_prefetch(r + g * H, 0, 2);
      __builtin_prefetch(r + g * H + W - 1, 0, 2);
    }
  }

  // ---- single-gate RNN ----------------------------------------------------------------
  // x' of panel b's units for gates [g0, g0 + G) of a step: row n, gate g at
  // p[n * ld + g * gs]. With a fused projection (the GRU's; the LSTM accumulates into its
  // products) the step's source rows times W's panels (the set of gate g0), plus the bias,
  // into xblk; else the step's rows of x' (x).
  struct XPanel {
    const S* p;
    int64_t ld, gs;
  };
  template <int G>
  static XPanel panel_x(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t b,
                        int g0, const S* x, S* xblk) {
    const int64_t H = p.H, u0 = b * W, wv = std::min<int64_t>(W, H - u0);
    if (!p.fused_projection) return {x ? x + g0 * H + u0 : nullptr, a.xp_ld, H};
    const int64_t nb = (H + W - 1) / W;
    // The reset-before GRU's candidate rows are a second set, after the z and r panels.
    const S* set =
        bf.w_panels +
        (g0 == 2 && p.op == detail::OpKind::Gru && !p.gru.reset_after ? nb * p.I * 2 * W : 0);
    const S* src = static_cast<const S*>(a.x) + time_in(a, s, p.T) * p.N * a.x_ld;
    block_product<G>(src, a.x_ld, p.N, p.I, set + b * p.I * G * W, xblk);
    if (const S* bias = static_cast<const S*>(a.bias))
      for (int64_t n = 0; n < p.N; ++n)
        for (int g = 0; g < G; ++g)
          for (int64_t w = 0; w < wv; ++w) xblk[(n * G + g) * W + w] += bias[(g0 + g) * H + u0 + w];
    return {xblk, G * W, W};
  }

  static void rnn(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t b0,
                  int64_t b1, S* blk) {
    constexpr int G = 1;
    const int64_t N = p.N, H = p.H;
    const Rows hp = prev_state(p, a, bf, s), A = operand(a, bf, hp, s, H);
    const Operand op = product_operand(p, a, A.data, A.ld, s, blk);
    const auto [x, y, z] = step_rows(p, a, s);
    const S* xn = next_x(p, a, s);
    prefetch_x(p, a, x, 0, 1, b0, b1);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      panel_product<G>(p, a, bf, b * G, op, N, blk);
      const XPanel xs = panel_x<G>(p, a, bf, s, b, 0, x, blk + block_base(p));
      for (int64_t n = 0; n < N; ++n) {
        S* v = blk + n * G * W;
        const S* xr = xs.p + n * xs.ld;
        prefetch_next_x(xn, a, n, H, u0, 0, 1);
        for (int64_t w = 0; w < wv; ++w) v[w] += xr[w];
        if (z) std::memcpy(z + n * a.z_ld + u0, v, static_cast<size_t>(wv) * sizeof(S));
        act(p.gate_act[0], v);
        store_h(a, bf, y, n, u0, wv, v, s, H);
      }
    }
  }

  // ---- LSTM -------------------------------------------------------------------------
  // The cell entering step s: the initial cell (or zeros), else the previous step's.
  static Rows prev_cell(const Problem& p, const Dir& a, const Buffers& bf, int64_t s) {
    if (s == 0) return a.c0 ? Rows{static_cast<const S*>(a.c0), a.c0_ld} : Rows{bf.zeros, p.H};
    return cell(p, a, bf, s - 1);
  }
  static Rows cell(const Problem& p, const Dir& a, const Buffers& bf, int64_t s) {
    if (!a.c) return {bf.extra[s & 1], p.H};
    return {static_cast<const S*>(a.c) + time_out(a, s, p.T) * p.N * a.c_ld, a.c_ld};
  }

  // xpre: project_step's output for these panels, or null.
  static void lstm(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t b0,
                   int64_t b1, S* blk, S* xpre, [[maybe_unused]] const CarrySlice<S>* carry) {
    constexpr int G = 4;
    const int64_t N = p.N, H = p.H;
    const S* P = static_cast<const S*>(a.peephole);
    const int64_t oi = p.lstm_i, of = p.lstm_f, oz = p.lstm_z, oo = p.lstm_o;
    alignas(64) S phi[W];
    const Rows cprev = prev_cell(p, a, bf, s), c = cell(p, a, bf, s);
    // Outputs in bfloat16 (y_bits): the unmasked operand of a later step is the previous
    // step's output rows as they are in inference, the very pairs to_pairs would make of
    // them, and in training the float32 state that store_h keeps in hm (as a mask's h̃).
    const bool bits = a.y_bits != nullptr;
    const Operand op = [&] {
      if (bits && s > 0 && !a.mask && !a.z_bits)
        return product_operand(p, a, nullptr, a.y_ld, s, blk,
                               a.y_bits + time_out(a, s - 1, p.T) * N * a.y_ld);
      const Rows A = a.mask || (bits && s > 0) ? Rows{bf.hm[s & 1], H} : prev_state(p, a, bf, s);
      return product_operand(p, a, A.data, A.ld, s, blk);
    }();
    // Named copies, not a structured binding: C++17 lambdas cannot capture those (Clang).
    const StepRows rows = step_rows(p, a, s);
    const S* const x = rows.x;
    S* const y = rows.y;
    S* const z = rows.z;
    uint16_t* const yb = bits ? a.y_bits + time_out(a, s, p.T) * N * a.y_ld : nullptr;
    uint16_t* const cb = a.c_bits ? a.c_bits + time_out(a, s, p.T) * N * a.c_ld : nullptr;
    uint16_t* const zb = a.z_bits ? a.z_bits + time_out(a, s, p.T) * N * a.z_ld : nullptr;
    const S* const xn = next_x(p, a, s);
    prefetch_x(p, a, x, 0, G, b0, b1);
    // A fused projection: the step's source rows times W's panels (lstm_projection).
    const bool fused = p.fused_projection, pairs = fused && dot_panels(a);
    S* xblk = blk + block_base(p);  // pairs: panel b's projection (or its place in xpre)
    const S* const bias = static_cast<const S*>(a.bias);
    // Where the passes find panel b's product: blk, or (batched) its place in rows_of.
    S* vb = blk;
    // In passes over the rows, so that each activation runs once over all of them (a call
    // per row and gate is a short chain that nothing overlaps). Full panels (all of them
    // when W divides H) get loops of a constant length.
    auto gates = [&](auto full, int64_t n, int64_t b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      const int64_t L = decltype(full)::value ? int64_t(W) : wv;
      S* v = vb + n * G * W;
      const S* cp = cprev.data + n * cprev.ld + u0;
      if (fused) {
        if (pairs)
          for (int g = 0; g < G; ++g)
            for (int64_t w = 0; w < L; ++w) v[g * W + w] += xblk[n * G * W + g * W + w];
        if (bias)
          for (int g = 0; g < G; ++g)
            for (int64_t w = 0; w < L; ++w) v[g * W + w] += bias[g * H + u0 + w];
      } else {
        const S* xr = x + n * a.xp_ld + u0;
        prefetch_next_x(xn, a, n, H, u0, 0, G);
        for (int g = 0; g < G; ++g)
          for (int64_t w = 0; w < L; ++w) v[g * W + w] += xr[g * H + w];
      }
      if (P)
        for (int g = 0; g < G; ++g)
          for (int64_t w = 0; w < L; ++w) v[g * W + w] += P[g * H + u0 + w] * cp[w];
      if (z)
        for (int g = 0; g < G; ++g)
          std::memcpy(z + n * a.z_ld + g * H + u0, v + g * W, static_cast<size_t>(L) * sizeof(S));
      if (zb)
        for (int g = 0; g < G; ++g) store_bits(zb + n * a.z_ld + g * H + u0, v + g * W, L);
    };
    // The cell, then its activation in the (spent) input gate's place. Full panels in
    // vectors: element loops into phi compiled to scalar stores that the next vector
    // load of phi waited on (a failed store forward; a third of the LSTM's epilogue).
    auto cells = [&](auto full, int64_t n, int64_t b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      S* v = vb + n * G * W;
      const S* cp = cprev.data + n * cprev.ld + u0;
      S* cr = const_cast<S*>(c.data) + n * c.ld + u0;
      if constexpr (decltype(full)::value) {
        const vec cn = load(v + of * W) * load(cp) + load(v + oi * W) * load(v + oz * W);
        store(cr, cn);
        store(v + oi * W, cn);
      } else {
        for (int64_t w = 0; w < wv; ++w) {
          cr[w] = v[of * W + w] * cp[w] + v[oi * W + w] * v[oz * W + w];
          phi[w] = cr[w];
        }
        for (int64_t w = wv; w < W; ++w) phi[w] = S(0);
        std::memcpy(v + oi * W, phi, sizeof phi);
      }
      if (cb) store_bits(cb + n * a.c_ld + u0, cr, wv);
    };
    auto outputs = [&](auto full, int64_t n, int64_t b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      const S* v = vb + n * G * W;
      if constexpr (decltype(full)::value) {
        store(phi, load(v + oi * W) * load(v + oo * W));
        store_h(a, bf, y, n, u0, W, phi, s, H, yb);
      } else {
        for (int64_t w = 0; w < wv; ++w) phi[w] = v[oi * W + w] * v[oo * W + w];
        store_h(a, bf, y, n, u0, wv, phi, s, H, yb);
      }
    };
    // The usual layer's epilogue in one pass over the rows (lstm_rows), training state
    // included.
    [[maybe_unused]] const bool one_pass =
        !P && p.gate_act[oi] == Activation::Sigmoid && p.gate_act[of] == Activation::Sigmoid &&
        p.gate_act[oo] == Activation::Sigmoid && p.gate_act[oz] == Activation::Tanh &&
        p.cell_act == Activation::Tanh;
    if (N == 1 && !fused && H % W == 0) {
      // One row: each panel's epilogue alone is a chain of dependent activations that the
      // next panel's product (hundreds of instructions) hides from the core. The products
      // of up to kBatch panels first, then their epilogues as rows of one pass.
      alignas(64) S rows_of[kBatch * G * W];
      const std::true_type full;
      for (int64_t bg = b0; bg < b1; bg += kBatch) {
        const int64_t be = std::min(b1, bg + kBatch);
        for (int64_t b = bg; b < be; ++b) {
#if RNNCORE_FUSED_DOT_BF16
          if (carry && carry[b - b0].k1 > carry[b - b0].k0) {  // (op: pairs, no split)
            const CarrySlice<S>& sl = carry[b - b0];
            carry_product<G, kCarryRows, kCarryGates>(
                op.pairs, (H + 1) / 2,
                reinterpret_cast<const Pair*>(reinterpret_cast<const uint16_t*>(bf.panels) +
                                              b * G * kext(p, a) * W),
                rows_of + (b - bg) * G * W,
                reinterpret_cast<const Pair*>(a.x_bits + sl.t0 * a.x_ld), a.x_ld / 2,
                w_pairs<G>(p, bf, sl.b), p.I / 2, sl.acc, sl.k0, sl.k1);
            continue;
          }
#endif
          panel_product<G>(p, a, bf, b * G, op, 1, rows_of + (b - bg) * G * W);
        }
#if RNNCORE_FUSED_ROWS
        if constexpr (kRows) {
          if (one_pass) {
            lstm_rows(p, a, bf, s, 0, 0, bg * W, W, be - bg, x, xn, nullptr, nullptr, cprev, c, y,
                      yb, {z, zb, cb}, rows_of);
            continue;
          }
        }
#endif
        for (int64_t b = bg; b < be; ++b) {
          vb = rows_of + (b - bg) * G * W;
          gates(full, 0, b);
        }
        act_gates4(p.gate_act, rows_of, be - bg);
        for (int64_t b = bg; b < be; ++b) {
          vb = rows_of + (b - bg) * G * W;
          cells(full, 0, b);
        }
        act_rows(p.cell_act, rows_of + oi * W, be - bg, G * W);
        for (int64_t b = bg; b < be; ++b) {
          vb = rows_of + (b - bg) * G * W;
          outputs(full, 0, b);
        }
      }
      return;
    }
    for (int64_t b = b0; b < b1; ++b) {
      S* const pre = xpre ? xpre + (b - b0) * N * G * W : nullptr;
      if (fused && !pairs) {
        // float32 sums: the projection's part first, from zero, then the product with R
        // onto it (so that the first part can run ahead of the step, project_step).
        vb = pre ? pre : blk;
        if (!pre) lstm_projection(p, a, bf, s, b, vb);
        panel_product<G>(p, a, bf, b * G, op, N, vb, true);
      } else {
        vb = blk;
        panel_product<G>(p, a, bf, b * G, op, N, blk);
        if (pairs) {
          xblk = pre ? pre : blk + block_base(p);
          if (!pre) lstm_projection(p, a, bf, s, b, xblk);
        }
      }
#if RNNCORE_FUSED_ROWS
      if constexpr (kRows) {
        if (one_pass && H - b * W >= W) {
          lstm_rows(p, a, bf, s, 0, 1, b * W, 0, N, x, xn, pairs ? xblk : nullptr,
                    fused ? bias : nullptr, cprev, c, y, yb, {z, zb, cb}, vb);
          continue;
        }
      }
#endif
      const auto passes = [&](auto full) {
        for (int64_t n = 0; n < N; ++n) gates(full, n, b);
        act_gates4(p.gate_act, vb, N);
        for (int64_t n = 0; n < N; ++n) cells(full, n, b);
        act_rows(p.cell_act, vb + oi * W, N, G * W);
        for (int64_t n = 0; n < N; ++n) outputs(full, n, b);
      };
      if (H - b * W >= W)
        passes(std::true_type{});
      else
        passes(std::false_type{});
    }
  }

#if RNNCORE_FUSED_ROWS
  // The training forward's outputs of lstm_rows, where wanted: the step's rows of the
  // training state (float32 or bfloat16 bits) and of the bfloat16 cell.
  struct Training {
    S* z;
    uint16_t* zb;
    uint16_t* cb;
  };
  // The epilogue of full panels of an LSTM with sigmoid gates, tanh cell gate and cell
  // activation and no peephole: each row's four gate vectors go from the
  // product's block to h and c in registers, rather than through the passes' five loops over
  // the block. The same operations in the same order as the passes (the same bits). Block
  // row j (at vb + j·4W) is batch row n0 + j·dn of units u0 + j·du .. + 15: the rows of a
  // panel (dn 1, du 0), or at batch 1 the panels of a batch (dn 0, du W). x: the step's rows
  // of x' (no fused projection), else xb: the fused bfloat16 projection's block (rows as
  // vb's), and bias when fused.
  static void lstm_rows(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t n0,
                        int64_t dn, int64_t u0, int64_t du, int64_t count, const S* x, const S* xn,
                        const S* xb, const S* bias, Rows cprev, Rows c, S* y, uint16_t* yb,
                        Training tr, S* vb) {
    const Units at{n0, dn, u0, du};
    int64_t j = 0;
    for (; j + 4 <= count; j += 4)
      lstm_rows_of<4>(p, a, bf, s, at, j, x, xn, xb, bias, cprev, c, y, yb, tr, vb);
    for (; j < count; ++j)
      lstm_rows_of<1>(p, a, bf, s, at, j, x, xn, xb, bias, cprev, c, y, yb, tr, vb);
  }
  struct Units {
    int64_t n0, dn, u0, du;
    int64_t n(int64_t j) const { return n0 + j * dn; }
    int64_t u(int64_t j) const { return u0 + j * du; }
  };
  // Block rows j0 .. j0 + R - 1 side by side: each activation's chain of dependent
  // instructions overlaps the other rows' (one row alone leaves the core waiting on them).
  template <int R>
  static RNNCORE_VMATH_INLINE void lstm_rows_of(const Problem& p, const Dir& a, const Buffers& bf,
                                                int64_t s, Units at, int64_t j0, const S* x,
                                                const S* xn, const S* xb, const S* bias, Rows cprev,
                                                Rows c, S* y, uint16_t* yb, Training tr, S* vb) {
    constexpr int G = 4;
    const int64_t H = p.H;
    // Gates i, f, z, o by name: indexing a register array by the descriptor's gate order (a
    // runtime offset) kept it on the stack, every gate stored and loaded again.
    const int64_t off[G] = {p.lstm_i, p.lstm_f, p.lstm_z, p.lstm_o};
    vec g[R][G];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t j = j0 + r, n = at.n(j), u0 = at.u(j);
      const S* v = vb + j * G * W;
#pragma GCC unroll 4
      for (int k = 0; k < G; ++k) g[r][k] = load(v + off[k] * W);
      if (xb) {
#pragma GCC unroll 4
        for (int k = 0; k < G; ++k) g[r][k] += load(xb + j * G * W + off[k] * W);
      } else if (x) {
        const S* xr = x + n * a.xp_ld + u0;
        prefetch_next_x(xn, a, n, H, u0, 0, G);
#pragma GCC unroll 4
        for (int k = 0; k < G; ++k) g[r][k] += load(xr + off[k] * H);
      }
      if (bias) {
#pragma GCC unroll 4
        for (int k = 0; k < G; ++k) g[r][k] += load(bias + off[k] * H + u0);
      }
      if (tr.z) {
#pragma GCC unroll 4
        for (int k = 0; k < G; ++k) store(tr.z + n * a.z_ld + off[k] * H + u0, g[r][k]);
      }
      if (tr.zb) {
#pragma GCC unroll 4
        for (int k = 0; k < G; ++k) store_bits(tr.zb + n * a.z_ld + off[k] * H + u0, g[r][k]);
      }
    }
    vec gi[R], gf[R], gz[R], go[R], cn[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) gi[r] = vsigmoid(g[r][0]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) gf[r] = vsigmoid(g[r][1]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) gz[r] = vtanh(g[r][2]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) go[r] = vsigmoid(g[r][3]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t n = at.n(j0 + r), u0 = at.u(j0 + r);
      cn[r] = gf[r] * load(cprev.data + n * cprev.ld + u0) + gi[r] * gz[r];
      store(const_cast<S*>(c.data) + n * c.ld + u0, cn[r]);
      if (tr.cb) store_bits(tr.cb + n * a.c_ld + u0, cn[r]);
    }
    alignas(64) S phi[R][W];
    for (int r = 0; r < R; ++r) store(phi[r], vtanh(cn[r]) * go[r]);
    for (int r = 0; r < R; ++r) store_h(a, bf, y, at.n(j0 + r), at.u(j0 + r), W, phi[r], s, H, yb);
  }
  // gru_after's epilogue of full panels with sigmoid z and r, tanh candidate and no training
  // state, block rows as lstm_rows's (at), each row's three gate vectors in registers, four
  // rows side by side; the same operations in the same order as gru_after_rows. x' of block
  // row j: xp.p + n·xp.ld (+ its units when x_units: the step's rows of x'), gates xp.gs apart.
  static void gru_rows(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, Units at,
                       int64_t count, XPanel xp, bool x_units, const S* xn, const S* b2, Rows hp,
                       S* y, S* vb) {
    int64_t j = 0;
    for (; j + 4 <= count; j += 4)
      gru_rows_of<4>(p, a, bf, s, at, j, xp, x_units, xn, b2, hp, y, vb);
    for (; j < count; ++j) gru_rows_of<1>(p, a, bf, s, at, j, xp, x_units, xn, b2, hp, y, vb);
  }
  template <int R>
  static RNNCORE_VMATH_INLINE void gru_rows_of(const Problem& p, const Dir& a, const Buffers& bf,
                                               int64_t s, Units at, int64_t j0, XPanel xp,
                                               bool x_units, const S* xn, const S* b2, Rows hp,
                                               S* y, S* vb) {
    constexpr int G = 3;
    const int64_t H = p.H;
    // Gates z and r by name, as lstm_rows_of's (their order is the descriptor's).
    const int64_t off[2] = {p.gru_z, p.gru_r};
    vec g[R][G];
    const S* xr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t j = j0 + r, n = at.n(j), u0 = at.u(j);
      const S* v = vb + j * G * W;
      xr[r] = xp.p + n * xp.ld + (x_units ? u0 : 0);
      prefetch_next_x(xn, a, n, H, u0, 0, G);
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) g[r][k] = load(v + off[k] * W) + load(xr[r] + off[k] * xp.gs);
      g[r][2] = load(v + 2 * W);
      if (b2) g[r][2] += load(b2 + u0);
    }
    vec gz[R], gr[R], q[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) gz[r] = vsigmoid(g[r][0]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) gr[r] = vsigmoid(g[r][1]);
    for (int r = 0; r < R; ++r) q[r] = load(xr[r] + 2 * xp.gs) + gr[r] * g[r][2];
    for (int r = 0; r < R; ++r) q[r] = vtanh(q[r]);
    alignas(64) S o[R][W];
    for (int r = 0; r < R; ++r) {
      const int64_t j = j0 + r;
      const vec h = load(hp.data + at.n(j) * hp.ld + at.u(j));
      if (p.gru.flip_z)
        store(o[r], (S(1) - gz[r]) * h + gz[r] * q[r]);
      else
        store(o[r], gz[r] * h + (S(1) - gz[r]) * q[r]);
    }
    for (int r = 0; r < R; ++r) store_h(a, bf, y, at.n(j0 + r), at.u(j0 + r), W, o[r], s, H);
  }
  // The activations of lstm_rows and gru_rows, by vmath's vector forms.
#if defined(__AVX512F__)
  using Native = __m512;
#else
  using Native = __m256;
#endif
  static Native native(vec v) {
    Native r;
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
  static vec of_native(Native v) {
    vec r;
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
#if defined(__AVX512F__)
  static vec vsigmoid(vec v) { return of_native(vmath::v16::sigmoid(native(v))); }
  static vec vtanh(vec v) { return of_native(vmath::v16::tanh(native(v))); }
#else
  static vec vsigmoid(vec v) { return of_native(vmath::v8::sigmoid(native(v))); }
  static vec vtanh(vec v) { return of_native(vmath::v8::tanh(native(v))); }
#endif
#endif

  // ---- GRU ----------------------------------------------------------------------------
  static void blend(const Problem& p, const S* zg, const S* hp, S* o, int64_t wv) {
    if (p.gru.flip_z)
      for (int64_t w = 0; w < wv; ++w) o[w] = (S(1) - zg[w]) * hp[w] + zg[w] * o[w];
    else
      for (int64_t w = 0; w < wv; ++w) o[w] = zg[w] * hp[w] + (S(1) - zg[w]) * o[w];
  }

  // xpre: project_step's output for these panels, or null.
  static void gru_after(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t b0,
                        int64_t b1, S* blk, S* xpre) {
    constexpr int G = 3;
    const int64_t N = p.N, H = p.H;
    const auto x_of = [&](int64_t b, const S* x) {
      if (xpre) return XPanel{xpre + (b - b0) * N * G * W, G * W, W};
      return panel_x<G>(p, a, bf, s, b, 0, x, blk + block_base(p));
    };
    const S* b2 = static_cast<const S*>(a.b2);
    const Rows hp = prev_state(p, a, bf, s), A = operand(a, bf, hp, s, H);
    const Operand op = product_operand(p, a, A.data, A.ld, s, blk);
    const auto [x, y, z] = step_rows(p, a, s);
    const S* xn = next_x(p, a, s);
    prefetch_x(p, a, x, 0, G, b0, b1);
#if RNNCORE_FUSED_ROWS
    if constexpr (kRows) {
      const Activation act_z = p.gate_act[p.gru_z], act_r = p.gate_act[p.gru_r],
                       act_o = p.gate_act[2];
      // The usual layer's epilogue in one pass (gru_rows); at batch 1 over the panels of a
      // batch whose products come first, as the LSTM's.
      const bool one_pass = !z && act_z == Activation::Sigmoid && act_r == Activation::Sigmoid &&
                            act_o == Activation::Tanh;
      if (one_pass && N == 1 && !p.fused_projection && x && H % W == 0) {
        alignas(64) S rows_of[kBatch * G * W];
        for (int64_t bg = b0; bg < b1; bg += kBatch) {
          const int64_t be = std::min(b1, bg + kBatch);
          for (int64_t b = bg; b < be; ++b)
            panel_product<G>(p, a, bf, b * G, op, 1, rows_of + (b - bg) * G * W);
          gru_rows(p, a, bf, s, {0, 0, bg * W, W}, be - bg, {x, a.xp_ld, H}, true, xn, b2, hp, y,
                   rows_of);
        }
        return;
      }
      if (one_pass) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t u0 = b * W;
          panel_product<G>(p, a, bf, b * G, op, N, blk);
          const XPanel xp = x_of(b, x);
          if (H - u0 >= W && xp.p) {
            gru_rows(p, a, bf, s, {0, 1, u0, 0}, N, xp, false, xn, b2, hp, y, blk);
            continue;
          }
          gru_after_rows(p, a, bf, s, b, N, xp, xn, b2, hp, y, z, blk);
        }
        return;
      }
    }
#endif
    for (int64_t b = b0; b < b1; ++b) {
      panel_product<G>(p, a, bf, b * G, op, N, blk);
      gru_after_rows(p, a, bf, s, b, N, x_of(b, x), xn, b2, hp, y, z, blk);
    }
  }

  // gru_after's epilogue of panel b, row by row.
  static void gru_after_rows(const Problem& p, const Dir& a, const Buffers& bf, int64_t s,
                             int64_t b, int64_t N, XPanel xp, const S* xn, const S* b2, Rows hp,
                             S* y, S* z, S* blk) {
    constexpr int G = 3;
    const int64_t H = p.H, u0 = b * W, wv = std::min<int64_t>(W, H - u0);
    const int64_t zo = p.gru_z, ro = p.gru_r;
    const Activation act_z = p.gate_act[zo], act_r = p.gate_act[ro], act_o = p.gate_act[2];
    const int64_t xs = xp.gs;
    for (int64_t n = 0; n < N; ++n) {
      S* v = blk + n * G * W;
      const S* xr = xp.p + n * xp.ld;
      prefetch_next_x(xn, a, n, H, u0, 0, G);
      for (int g = 0; g < 2; ++g)
        for (int64_t w = 0; w < wv; ++w) v[g * W + w] += xr[g * xs + w];
      S* q = v + 2 * W;
      if (b2)
        for (int64_t w = 0; w < wv; ++w) q[w] += b2[u0 + w];
      if (z) {
        S* zr = z + n * a.z_ld + u0;
        for (int g = 0; g < 3; ++g)
          std::memcpy(zr + g * H, v + g * W, static_cast<size_t>(wv) * sizeof(S));
        std::memcpy(zr + 3 * H, xr + 2 * xs, static_cast<size_t>(wv) * sizeof(S));
      }
      act_zr(act_z, act_r, zo, v);
      const S* rg = v + ro * W;
      for (int64_t w = 0; w < wv; ++w) q[w] = xr[2 * xs + w] + rg[w] * q[w];
      act(act_o, q);
      blend(p, v + zo * W, hp.data + n * hp.ld + u0, q, wv);
      store_h(a, bf, y, n, u0, wv, q, s, H);
    }
  }

  // Reset-before, phase 0: z and r of the units, and u = r ⊙ h̃ (the candidate product's
  // left operand) into extra[1], z into extra[0].
  static void gru_before_zr(const Problem& p, const Dir& a, const Buffers& bf, int64_t s,
                            int64_t b0, int64_t b1, S* blk) {
    const int64_t N = p.N, H = p.H;
    S* zbuf = bf.extra[0];
    S* ubuf = bf.extra[1];
    const int64_t zo = p.gru_z, ro = p.gru_r;
    const Activation act_z = p.gate_act[zo], act_r = p.gate_act[ro];
    const Rows hp = prev_state(p, a, bf, s), A = operand(a, bf, hp, s, H);
    const Operand op = product_operand(p, a, A.data, A.ld, s, blk);
    const auto [x, y, z] = step_rows(p, a, s);
    const S* xn = next_x(p, a, s);
    prefetch_x(p, a, x, 0, 2, b0, b1);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      panel_product<2>(p, a, bf, b * 2, op, N, blk);
      const XPanel xp = panel_x<2>(p, a, bf, s, b, 0, x, blk + block_base(p));
      for (int64_t n = 0; n < N; ++n) {
        S* v = blk + n * 2 * W;
        const S* xr = xp.p + n * xp.ld;
        prefetch_next_x(xn, a, n, H, u0, 0, 2);
        for (int g = 0; g < 2; ++g)
          for (int64_t w = 0; w < wv; ++w) v[g * W + w] += xr[g * xp.gs + w];
        if (z)
          for (int g = 0; g < 2; ++g)
            std::memcpy(z + n * a.z_ld + g * H + u0, v + g * W,
                        static_cast<size_t>(wv) * sizeof(S));
        act_zr(act_z, act_r, zo, v);
        std::memcpy(zbuf + n * H + u0, v + zo * W, static_cast<size_t>(wv) * sizeof(S));
        const S* hm = A.data + n * A.ld + u0;
        for (int64_t w = 0; w < wv; ++w) ubuf[n * H + u0 + w] = v[ro * W + w] * hm[w];
      }
    }
  }

  // Reset-before, phase 1: the candidate from u of every unit, and the blend.
  static void gru_before_o(const Problem& p, const Dir& a, const Buffers& bf, int64_t s, int64_t b0,
                           int64_t b1, S* blk) {
    const int64_t N = p.N, H = p.H, nb = (H + W - 1) / W;
    const S* zbuf = bf.extra[0];
    const S* ubuf = bf.extra[1];
    const Activation act_o = p.gate_act[2];
    const Rows hp = prev_state(p, a, bf, s);
    const Operand op = product_operand(p, a, ubuf, H, s, blk);
    const auto [x, y, z] = step_rows(p, a, s);
    const S* xn = next_x(p, a, s);
    prefetch_x(p, a, x, 2, 3, b0, b1);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t u0 = b * W, wv = std::min<int64_t>(W, H - u0);
      panel_product<1>(p, a, bf, nb * 2 + b, op, N, blk);
      const XPanel xp = panel_x<1>(p, a, bf, s, b, 2, x, blk + block_base(p));
      for (int64_t n = 0; n < N; ++n) {
        S* v = blk + n * W;
        const S* xr = xp.p + n * xp.ld;
        prefetch_next_x(xn, a, n, H, u0, 2, 3);
        for (int64_t w = 0; w < wv; ++w) v[w] += xr[w];
        if (z) std::memcpy(z + n * a.z_ld + 2 * H + u0, v, static_cast<size_t>(wv) * sizeof(S));
        act(act_o, v);
        blend(p, zbuf + n * H + u0, hp.data + n * hp.ld + u0, v, wv);
        store_h(a, bf, y, n, u0, wv, v, s, H);
      }
    }
  }

  // ---- the input projection of bfloat16 storage by vdpbf16ps -----------------------
  // Columns of a group of the projection's packed B: 4 panels, so that its tile is the
  // steps' 6 rows × 4 vectors (24 accumulators) rather than 8 rows × 1.
  static constexpr int kPairPanels = 4;
  // Packs groups [q0, q1) of B [n, K] (bfloat16 bits; a group is rows q·4W .. q·4W + 4W - 1)
  // as pairs of k: out[q][k/2][g][w][2], K padded to even, rows past n zero.
  static void pack_pairs_rows(const uint16_t* B, int64_t n, int64_t K, uint16_t* out, int64_t q0,
                              int64_t q1) {
    constexpr int G = kPairPanels;
    const int64_t Kp = (K + 1) / 2 * 2;
    for (int64_t q = q0; q < q1; ++q) {
      uint16_t* group = out + q * Kp * G * W;
      int64_t kv = 0;  // k below kv packed by transposes (whole groups)
      if (kTranspose && (q + 1) * G * W <= n)
        for (; kv + 32 <= K; kv += 32)
          for (int g = 0; g < G; ++g)
            pairs_block(B + (q * G + g) * W * K + kv, K, group + (kv / 2 * G + g) * W * 2,
                        G * W * 2);
      for (int64_t k0 = kv; k0 < Kp; k0 += 16)
        for (int g = 0; g < G; ++g) {
          const int64_t j0 = (q * G + g) * W,
                        wv = std::max<int64_t>(0, std::min<int64_t>(W, n - j0));
          for (int64_t k = k0; k < std::min(k0 + 16, Kp); k += 2) {
            uint16_t* o = group + (k / 2 * G + g) * W * 2;
            for (int64_t w = 0; w < wv; ++w) {
              const uint16_t* row = B + (j0 + w) * K;
              o[2 * w] = row[k];
              o[2 * w + 1] = k + 1 < K ? row[k + 1] : uint16_t(0);
            }
            for (int64_t w = wv; w < W; ++w) o[2 * w] = o[2 * w + 1] = 0;
          }
        }
    }
  }

  // C[r, j] = sum_k A[r, k] B[j, k] (+ bias[j]) for rows [0, M) and the columns of groups
  // [q0, q1) (packed by pack_pairs_rows); A's rows are bfloat16 pairs (K2 of them, lda2
  // apart). scratch: M * 4W elements.
  static void gemm_pairs(const void* A, int64_t lda2, int64_t M, int64_t K2, const uint16_t* packed,
                         int64_t n, int64_t q0, int64_t q1, const S* bias, S* C, int64_t ldc,
                         S* scratch) {
#if RNNCORE_FUSED_DOT_BF16
    if constexpr (kDotBf16) {
      constexpr int G = kPairPanels;
      const Pair* Ap = static_cast<const Pair*>(A);
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t j0 = q * G * W, wv = std::min<int64_t>(G * W, n - j0);
        block_product_dot<G, false>(Ap, lda2, 0, M, K2,
                                    reinterpret_cast<const Pair*>(packed + q * K2 * 2 * G * W),
                                    scratch);
        for (int64_t r = 0; r < M; ++r) {
          S* c = C + r * ldc + j0;
          const S* v = scratch + r * G * W;
          if (bias)
            for (int64_t w = 0; w < wv; ++w) c[w] = v[w] + bias[j0 + w];
          else
            for (int64_t w = 0; w < wv; ++w) c[w] = v[w];
        }
      }
      return;
    }
#endif
    (void)A, (void)lda2, (void)M, (void)K2, (void)packed, (void)n, (void)q0, (void)q1, (void)bias;
    (void)C, (void)ldc, (void)scratch;
  }

  // ---- general product with a packed right operand (the backward steps) --------------
  // Row by row of B, whole vectors (panel by panel, element by element, an LSTM's R at H = 256
  // took 80 us, half of a T=1 gradient call).
  static void pack_columns(const S* B, int64_t K, int64_t n, S* out) {
    const int64_t full = n / W, nb = (n + W - 1) / W;
    for (int64_t k = 0; k < K; ++k) {
      const S* row = B + k * n;
      for (int64_t b = 0; b < full; ++b) store(out + (b * K + k) * W, load(row + b * W));
      for (int64_t b = full; b < nb; ++b)
        for (int w = 0; w < W; ++w) {
          const int64_t j = b * W + w;
          out[(b * K + k) * W + w] = j < n ? row[j] : S(0);
        }
    }
  }

  // Two column panels of M rows at once: 2 × M accumulation chains, where one panel's 8
  // barely cover the FMA latency. Each element's arithmetic is tile<1, 8>'s (one sum in k
  // order). M = 8 with 32 vector registers; with 16 (AVX2) 2 × 8 accumulators spilled to the
  // stack in every k step, and 6 rows fit (12, beside the two panels' vectors and a broadcast).
  static constexpr int kPairRows = kRegs == 16 ? 6 : kProductRows;
  template <int M>
  static void tile_pair(const S* A, int64_t lda, int64_t K, const S* B0, const S* B1, S* out0,
                        S* out1, bool accumulate) {
#if RNNCORE_FMA_BROADCAST
    if constexpr (W == 16 && std::is_same_v<S, float>) {
      if (kMemoryBroadcast)
        return tile_pair_broadcast<M>(A, lda, K, B0, B1, out0, out1, accumulate);
    }
#endif
    const vec zero = {};
    vec acc0[M], acc1[M];  // in registers by the unrolled loops, as tile's
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      acc0[r] = accumulate ? load(out0 + r * W) : zero;
      acc1[r] = accumulate ? load(out1 + r * W) : zero;
    }
    for (int64_t k = 0; k < K; ++k) {
      const vec b0 = load(B0 + k * W), b1 = load(B1 + k * W);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const S a = A[r * lda + k];
        acc0[r] += a * b0;
        acc1[r] += a * b1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      store(out0 + r * W, acc0[r]);
      store(out1 + r * W, acc1[r]);
    }
  }
#if RNNCORE_FMA_BROADCAST
  // tile_pair with A's element taken from memory by each FMA (RNNCORE_FMA_BROADCAST).
  template <int M>
  RNNCORE_TILE static void tile_pair_broadcast(const S* A, int64_t lda, int64_t K, const S* B0,
                                               const S* B1, S* out0, S* out1, bool accumulate) {
    __m512 acc0[M], acc1[M];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      acc0[r] = accumulate ? _mm512_loadu_ps(out0 + r * W) : _mm512_setzero_ps();
      acc1[r] = accumulate ? _mm512_loadu_ps(out1 + r * W) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; ++k) {
      const __m512 b0 = _mm512_loadu_ps(B0 + k * W), b1 = _mm512_loadu_ps(B1 + k * W);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const S* a = A + r * lda + k;
        asm("vfmadd231ps %[a]%{1to16%}, %[b], %[acc]"
            : [acc] "+v"(acc0[r])
            : [b] "v"(b0), [a] "m"(*a));
        asm("vfmadd231ps %[a]%{1to16%}, %[b], %[acc]"
            : [acc] "+v"(acc1[r])
            : [b] "v"(b1), [a] "m"(*a));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      _mm512_storeu_ps(out0 + r * W, acc0[r]);
      _mm512_storeu_ps(out1 + r * W, acc1[r]);
    }
  }
#endif
  template <int M = kPairRows>
  static void pair_tile(int m, const S* A, int64_t lda, int64_t K, const S* B0, const S* B1,
                        S* out0, S* out1, bool accumulate) {
    if constexpr (M > 2) {
      if (m < M) return pair_tile<M - 1>(m, A, lda, K, B0, B1, out0, out1, accumulate);
    }
    tile_pair<M>(A, lda, K, B0, B1, out0, out1, accumulate);
  }

  // block_product<1> of two panels (the same k blocks, so the same bits): the rows of whole
  // row tiles of kProductRows by tile_pair (in tiles of kPairRows rows or as even sizes
  // below it), the last partial one (whose tile<1, m> takes partial sums) one panel after the
  // other.
  static void pair_product(const S* A, int64_t lda, int64_t M, int64_t K, const S* B0, const S* B1,
                           S* out0, S* out1) {
    constexpr int64_t KC = std::max<int64_t>(16, 24576 / (W * static_cast<int64_t>(sizeof(S))));
    const int64_t whole = M / kProductRows * kProductRows;
    const int64_t tiles = (whole + kPairRows - 1) / kPairRows;
    const int64_t base = tiles ? whole / tiles : 0, extra = tiles ? whole % tiles : 0;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K - k0);
      int64_t n0 = 0;
      for (int64_t i = 0; i < tiles; ++i) {
        const int m = static_cast<int>(base + (i < extra));
        pair_tile(m, A + n0 * lda + k0, lda, kc, B0 + k0 * W, B1 + k0 * W, out0 + n0 * W,
                  out1 + n0 * W, k0 > 0);
        n0 += m;
      }
      if (n0 < M) {
        const int m = static_cast<int>(M - n0);
        const S* a = A + n0 * lda + k0;
        tile_rows<1, S>(m, a, lda, kc, B0 + k0 * W, out0 + n0 * W, k0 > 0);
        tile_rows<1, S>(m, a, lda, kc, B1 + k0 * W, out1 + n0 * W, k0 > 0);
      }
    }
  }

  static void matmul(const S* A, int64_t lda, int64_t M, int64_t K, const S* packed, int64_t n,
                     S* C, int64_t ldc, bool accumulate) {
    std::vector<S> blk(static_cast<size_t>(2 * M * W));
    const int64_t nb = (n + W - 1) / W;
    const auto out = [&](int64_t b, const S* v0) {
      const int64_t j0 = b * W, wv = std::min<int64_t>(W, n - j0);
      for (int64_t r = 0; r < M; ++r) {
        S* c = C + r * ldc + j0;
        const S* v = v0 + r * W;
        if (accumulate)
          for (int64_t w = 0; w < wv; ++w) c[w] += v[w];
        else
          for (int64_t w = 0; w < wv; ++w) c[w] = v[w];
      }
    };
    S* blk1 = blk.data() + M * W;
    for (int64_t b = 0; b < nb; b += 2) {
      if (b + 1 < nb) {
        pair_product(A, lda, M, K, packed + b * K * W, packed + (b + 1) * K * W, blk.data(), blk1);
        out(b, blk.data());
        out(b + 1, blk1);
      } else {
        block_product<1>(A, lda, M, K, packed + b * K * W, blk.data());
        out(b, blk.data());
      }
    }
  }
};

}  // namespace
}  // namespace rnncore::cpu
