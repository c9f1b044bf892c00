// The only door to BLAS: row-major GEMM in float and double, and what library is behind it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace rnncore::cpu {

// C[M, N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X or X^T.
// Degenerate sizes (M, N or K zero) are handled here, not passed to BLAS.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// The shapes the kernels' own GEMMs take where they exist (blas.cpp): a few rows of A (2 to
// kFewRows32 of them, with NT or NN), or a short K (up to kShortK, with TN).
constexpr int64_t kFewRows32 = 32, kShortK = 32, kLargeB = int64_t(1) << 16;

// Whether the kernels' own gemm_nt (gemm_nn) takes A [M, K] · B [N, K]ᵀ (B [K, N]): 1 to
// kFewRows32 rows against a B of kLargeB elements or more (smaller products are the BLAS's).
inline bool own_gemm_nt(int64_t M, int64_t N, int64_t K) {
  return M >= 1 && M <= kFewRows32 && N * K >= kLargeB;
}
inline bool own_gemm_nn(int64_t M, int64_t N, int64_t K) { return own_gemm_nt(M, N, K); }

// How many blocks of columns (of 64 and more) the threads share of those GEMMs: none below
// 2^17 multiply-adds, whose few us on the caller cost less than waking a thread (a GRU of
// H = 128 at T=1 N=1: 13 against 10 us a call).
inline int64_t own_gemm_parts(int64_t M, int64_t N, int64_t K, int64_t threads) {
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (work < double(int64_t(1) << 17)) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(threads, N / 64));
}

// How parallel_gemm splits C: `parts` blocks of rows (by_rows) or columns, part i starting
// at begin(i). A function of the shape alone, never of the threads: BLAS may sum a block
// in another order (another kernel) when its size changes, so the split must not change
// with the thread count or with whether the pool is free.
struct GemmSplit {
  bool by_rows;
  int64_t parts, side;
  int64_t begin(int64_t i) const {
    return i >= parts ? side : std::min(side, (side * i / parts + 8) / 16 * 16);
  }
};
GemmSplit gemm_split(int64_t M, int64_t N, int64_t K);

// gemm with C split as gemm_split says, each part a single-threaded BLAS call claimed by a
// thread of the pool: BLAS's own threads would fight the pool's (and spin on the cores it
// needs).
template <class T>
void parallel_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                   int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Makes the BLAS single-threaded where the library is rnncore's own copy (the
// scipy-openblas32 wheel); a system BLAS shared with the application is left alone.
void claim_blas_threads();

std::string blas_info();

}  // namespace rnncore::cpu
