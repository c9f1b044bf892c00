// The only door to BLAS: row-major GEMM in float and double, and what library is behind it.
#pragma once

#include <cstdint>
#include <string>

namespace rnncore::cpu {

// C[M, N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X or X^T.
// Degenerate sizes (M, N or K zero) are handled here, not passed to BLAS.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// gemm with the rows of C split over the thread pool, each part a single-threaded BLAS
// call: BLAS's own threads would fight the pool's (and spin on the cores it needs).
template <class T>
void parallel_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                   int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Makes the BLAS single-threaded where the library is rnncore's own copy (the
// scipy-openblas32 wheel); a system BLAS shared with the application is left alone.
void claim_blas_threads();

std::string blas_info();

}  // namespace rnncore::cpu
