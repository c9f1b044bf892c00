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

std::string blas_info();

}  // namespace rnncore::cpu
