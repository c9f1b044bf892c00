// A few rows of A against B as stored (AVX-512, float32): C[r, j] = alpha (A[r, :] · B[j, :])
// + beta C[r, j], B row-major [n, K]. The products that BLAS would pack the whole of B for
// (an input projection of T·N <= 16 rows, a step's product with R at a small batch): B is
// read once per 8 rows, as stored. Compiled into the AVX-512 variants of fused_isa.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace rnncore::cpu {
namespace {

struct FewRows {
  // Each dot product is 16 lane sums over k (k in lane k mod 16, FMAs in k order), then
  // lanes l and l + 8 added, l and l + 4, l and l + 2, l and l + 1: the same order for every
  // element whatever tile it falls in, so that the bits do not depend on M, n or on how C
  // is split among threads.
  static constexpr int kRows = 8;  // rows of A a tile takes (B streamed once per kRows)
  template <int M>
  static constexpr int cols() {  // 16 accumulators
    return M == 1 ? 16 : 16 / M;
  }

  // (maskz: the unmasked forms' undefined pass-through trips GCC's uninitialised warning)
  template <int imm>
  static __m512 shuffle_f32x4(__m512 a, __m512 b) {
    return _mm512_maskz_shuffle_f32x4(__mmask16(0xFFFF), a, b, imm);
  }
  template <int imm>
  static __m512 shuffle_ps(__m512 a, __m512 b) {
    return _mm512_maskz_shuffle_ps(__mmask16(0xFFFF), a, b, imm);
  }

  // The lane sums of acc[0..16), accumulator a's in lane 4 (a % 4) + a / 4: a transposing
  // tree (45 instructions for 16 sums, where one sum alone takes 8).
  static __m512 reduce16(const __m512* acc) {
    __m512 s[8], t[4], u[2];
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i)  // [acc 2i: l + (l+8) | acc 2i+1: same], 8 lanes each
      s[i] = _mm512_add_ps(shuffle_f32x4<0x44>(acc[2 * i], acc[2 * i + 1]),
                           shuffle_f32x4<0xEE>(acc[2 * i], acc[2 * i + 1]));
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i)  // 4 accumulators of 4 lanes (l + (l+4)) each
      t[i] = _mm512_add_ps(shuffle_f32x4<_MM_SHUFFLE(2, 0, 2, 0)>(s[2 * i], s[2 * i + 1]),
                           shuffle_f32x4<_MM_SHUFFLE(3, 1, 3, 1)>(s[2 * i], s[2 * i + 1]));
#pragma GCC unroll 16
    for (int i = 0; i < 2; ++i)  // per 128 bits: 2 accumulators of 2 lanes (l + (l+2))
      u[i] = _mm512_add_ps(shuffle_ps<_MM_SHUFFLE(1, 0, 1, 0)>(t[2 * i], t[2 * i + 1]),
                           shuffle_ps<_MM_SHUFFLE(3, 2, 3, 2)>(t[2 * i], t[2 * i + 1]));
    return _mm512_add_ps(shuffle_ps<_MM_SHUFFLE(2, 0, 2, 0)>(u[0], u[1]),
                         shuffle_ps<_MM_SHUFFLE(3, 1, 3, 1)>(u[0], u[1]));
  }

  // acc[r J + j] += A[r, k:k+16] * B_j[k:k+16], the lanes past m's zero.
  template <int M, int J>
  __attribute__((always_inline)) static inline void chunk(__m512* acc, const float* A, int64_t lda,
                                                          const float* const* b, int64_t k,
                                                          __mmask16 m) {
    __m512 bv[J], av[M];
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) bv[j] = _mm512_maskz_loadu_ps(m, b[j] + k);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      av[r] = _mm512_maskz_loadu_ps(m, A + r * lda + k);
      // In a register: folded into the J FMAs as memory operands, the loads of 8 rows (18
      // a 16 FMAs) held the tile to half the FMA rate.
      asm("" : "+v"(av[r]));
    }
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) acc[r * J + j] = _mm512_fmadd_ps(av[r], bv[j], acc[r * J + j]);
  }

  // sums (lane order of reduce16) of rows [0, M) of A against the J rows of B at b[j].
  template <int M, int J>
  __attribute__((noinline)) static void tile(int64_t K, const float* A, int64_t lda,
                                             const float* const* b, float* sums) {
    static_assert(M * J <= 16);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) chunk<M, J>(acc, A, lda, b, k, __mmask16(0xFFFF));
    if (k < K) chunk<M, J>(acc, A, lda, b, k, __mmask16((1u << (K - k)) - 1));
    _mm512_store_ps(sums, reduce16(acc));
  }

  template <int M>
  static void rows(int64_t n, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float beta, float* C, int64_t ldc) {
    constexpr int J = cols<M>();
    alignas(64) float sums[16];
    const float* b[J];
    for (int64_t j0 = 0; j0 < n; j0 += J) {
      const int jn = static_cast<int>(std::min<int64_t>(J, n - j0));
      // (past n: the last row again, its sums not stored)
      for (int j = 0; j < J; ++j) b[j] = B + (j0 + std::min(j, jn - 1)) * ldb;
      tile<M, J>(K, A, lda, b, sums);
      if (jn == J)
        store<M, J>(sums, alpha, beta, C + j0, ldc);
      else
        store<M, J>(sums, alpha, beta, C + j0, ldc, jn);
    }
  }
  // C[r, j] (r < M, j < jn) from a tile's sums (unrolled for whole tiles: a loop over
  // jn took 9% of a T=1 N=8 GRU).
  template <int M, int J>
  static void store(const float* sums, float alpha, float beta, float* C, int64_t ldc, int jn = J) {
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
      for (int j = 0; j < J; ++j) {
        if (j >= jn) break;
        const int a = r * J + j;
        float* c = C + r * ldc + j;
        // (std::fma: contracted by the compiler, alpha s + beta c could round either product)
        const float v = alpha * sums[4 * (a % 4) + a / 4];
        *c = beta == 0.0f ? v : std::fma(beta, *c, v);
      }
  }

  template <int M = kRows>
  static void rows_of(int m, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    if constexpr (M > 1) {
      if (m < M) return rows_of<M - 1>(m, n, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    rows<M>(n, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  // The entry (FusedOps::gemm_nt): every M, by tiles of up to kRows rows, each block of 64
  // rows of B read from memory once for all of them (then from L2).
  static void gemm_nt(int64_t M, int64_t n, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    constexpr int64_t kBlock = 64;
    for (int64_t j0 = 0; j0 < n; j0 += kBlock)
      for (int64_t r0 = 0; r0 < M; r0 += kRows)
        rows_of(static_cast<int>(std::min<int64_t>(kRows, M - r0)), std::min(kBlock, n - j0), K,
                alpha, A + r0 * lda, lda, B + j0 * ldb, ldb, beta, C + r0 * ldc + j0, ldc);
  }
};

}  // namespace
}  // namespace rnncore::cpu
