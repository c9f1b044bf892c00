// BLAS glue. The library is chosen by CMake: scipy-openblas32 (symbols prefixed
// scipy_), a system OpenBLAS / CBLAS, or Accelerate on Apple.
#include "cpu/blas.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "cpu/fused.hpp"
#include "cpu/thread_pool.hpp"

#if defined(RNNCORE_BLAS_ACCELERATE)
#define ACCELERATE_NEW_LAPACK
#include <Accelerate/Accelerate.h>
#else
#include <cblas.h>
#endif

#if defined(RNNCORE_BLAS_SCIPY_OPENBLAS)
#define RNNCORE_CBLAS(name) scipy_cblas_##name
#define RNNCORE_OPENBLAS(name) scipy_openblas_##name
#else
#define RNNCORE_CBLAS(name) cblas_##name
#define RNNCORE_OPENBLAS(name) openblas_##name
#endif

namespace rnncore::cpu {
namespace {

template <class T>
void scale(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    T* row = C + i * ldc;
    if (beta == T(0))
      std::memset(row, 0, static_cast<size_t>(N) * sizeof(T));
    else
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
  }
}

void blas_call(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  RNNCORE_CBLAS(sgemm)
  (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
   lda, B, ldb, beta, C, ldc);
}

void blas_call(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  RNNCORE_CBLAS(dgemm)
  (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
   lda, B, ldb, beta, C, ldc);
}

// A BLAS call with every size and leading dimension below 2^31 (the BLAS takes 32-bit
// ints). Larger problems are halved along the offending axis: K (accumulating with beta =
// 1 after the first half), or the rows of the operand whose leading dimension is too long
// (a single row needs no leading dimension). Splitting changes nothing at BLAS sizes.
template <class T>
void gemm_any(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  constexpr int64_t kMax = INT_MAX;
  // Rows of A, B and C as stored, and the axis of the product each runs along.
  const int64_t a_rows = ta ? K : M, b_rows = tb ? N : K;
  const auto fits = [&](int64_t ld, int64_t rows) { return ld <= kMax || rows == 1; };
  if (K > kMax || (!fits(lda, a_rows) && ta) || (!fits(ldb, b_rows) && !tb)) {
    const int64_t k = K / 2;
    gemm_any(ta, tb, M, N, k, alpha, A, lda, B, ldb, beta, C, ldc);
    gemm_any(ta, tb, M, N, K - k, alpha, ta ? A + k * lda : A + k, lda, tb ? B + k : B + k * ldb,
             ldb, T(1), C, ldc);
    return;
  }
  if (M > kMax || (!fits(lda, a_rows) && !ta) || !fits(ldc, M)) {
    const int64_t m = M / 2;
    gemm_any(ta, tb, m, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    gemm_any(ta, tb, M - m, N, K, alpha, ta ? A + m : A + m * lda, lda, B, ldb, beta, C + m * ldc,
             ldc);
    return;
  }
  if (N > kMax || (!fits(ldb, b_rows) && tb)) {
    const int64_t n = N / 2;
    gemm_any(ta, tb, M, n, K, alpha, A, lda, B, ldb, beta, C, ldc);
    gemm_any(ta, tb, M, N - n, K, alpha, A, lda, tb ? B + n * ldb : B + n, ldb, beta, C + n, ldc);
    return;
  }
  // A single stored row may report its own length as its leading dimension.
  const auto ld = [&](int64_t v, int64_t cols) { return static_cast<int>(v <= kMax ? v : cols); };
  blas_call(ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
            ld(lda, ta ? M : K), B, ld(ldb, tb ? K : N), beta, C, ld(ldc, N));
}

}  // namespace

constexpr int64_t kFewRows = 4;

// A·Bᵀ of 2 to 32 rows of A against a large B by the kernels' gemm_nt, which reads B as
// stored: OpenBLAS packs the whole of B for them (T=1 N=8 H=256 GRU: packing W for the
// projection took 16% of the call). [M×256]·[768×256]ᵀ on one core, AVX-512: M = 8 30 us
// against OpenBLAS's 126, 16 60 against 152, 32 120 against 210; [32×1024]·[4096×1024]ᵀ
// 3.3 ms against 5.5. Also one row: the per-step products of float16 and bfloat16 storage
// read R and W in 16 bits by the same kernel (gemm_nt_half, gemm_nt_bfloat16), so that they
// remain the float32 operation on the widened arrays, bit for bit (OpenBLAS's GEMV took as
// long: H=256 GRU at T=1 N=1). Likewise A·B of 1 to 32 rows (gemm_nn, and gemm_nn_half and
// gemm_nn_bfloat16 on 16-bit B: the backward's dX'·W and dX'·R at a small batch) and AᵀB
// over at most 32 k
// (gemm_tn: dW and dR of T·N <= 32 rows, where OpenBLAS ran at a fifth of the FMA peak).
template <class T>
auto own_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  const auto& ops = fused_kernels().ops<T>();
  using F = decltype(ops.gemm_nt);
  if (K == 0) return F(nullptr);
  if (!ta && tb) return own_gemm_nt(M, N, K) ? ops.gemm_nt : nullptr;
  if (!ta && !tb) return own_gemm_nn(M, N, K) ? ops.gemm_nn : nullptr;
  if (ta && !tb) return K <= kShortK && M * N >= kLargeB ? ops.gemm_tn : nullptr;
  return F(nullptr);
}

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale(M, N, beta, C, ldc);
  if (const auto f = own_gemm<T>(ta, tb, M, N, K))
    return f(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // A few rows of A against a large B: OpenBLAS packs the whole of B for them (the
  // projection of T·N = 2 rows packed an LSTM's W, 1 MiB, for a third of the call), where
  // one row at a time streams B as it is stored.
  if (M <= kFewRows && N * K >= kLargeB) {
    for (int64_t i = 0; i < M; ++i)
      gemm_any(ta, tb, 1, N, K, alpha, ta ? A + i : A + i * lda, lda, B, ldb, beta, C + i * ldc,
               ldc);
    return;
  }
  gemm_any(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

GemmSplit gemm_split(int64_t M, int64_t N, int64_t K) {
  // About 2^22 multiply-adds a part or more (a BLAS call and a claim cost a few us), parts
  // of at least 16 rows (columns) starting at multiples of 16, and at most 4 of them:
  // enough for the threads of a small machine to share the work dynamically; more parts
  // cost a single thread 5-10% (each packs its share again, at smaller sizes). The longer
  // side of C is split, so that each part packs only its own share of the other operand.
  GemmSplit s;
  s.by_rows = M >= N;
  const int64_t side = s.by_rows ? M : N;
  // (in double: the product of the sizes may not fit 64 bits)
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const int64_t by_work = work >= 4.0 * (1 << 22) ? 4 : static_cast<int64_t>(work) >> 22;
  s.parts = std::max<int64_t>(1, std::min<int64_t>({4, by_work, side / 16}));
  s.side = side;
  if (M <= kFewRows && N * K >= kLargeB && s.parts < 2 && N >= 32) {
    // A few rows against a large B stream it from memory, not compute: halves by columns
    // (each core reads half of B, which then stays in its L2 from call to call).
    s.by_rows = false;
    s.side = N;
    s.parts = 2;
  }
  return s;
}

template <class T>
void parallel_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                   int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (const auto f = own_gemm<T>(ta, tb, M, N, K)) {
    // Columns split among the threads: each core reads its share of B (which then stays in
    // its L2 from call to call). Free to follow the threads: the bits do not depend on it.
    ThreadPool& pool = ThreadPool::instance();
    const int64_t parts = own_gemm_parts(M, N, K, pool.available());
    pool.parallel_for(parts, [&](int64_t part) {
      const auto begin = [&](int64_t i) { return i == parts ? N : N * i / parts / 16 * 16; };
      const int64_t j0 = begin(part), j1 = begin(part + 1);
      f(M, j1 - j0, K, alpha, A, lda, tb ? B + j0 * ldb : B + j0, ldb, beta, C + j0, ldc);
    });
    return;
  }
  const GemmSplit sp = gemm_split(M, N, K);
  ThreadPool::instance().parallel_for(sp.parts, [&](int64_t part) {
    const int64_t i0 = sp.begin(part), i1 = sp.begin(part + 1);
    if (sp.by_rows)
      gemm<T>(ta, tb, i1 - i0, N, K, alpha, ta ? A + i0 : A + i0 * lda, lda, B, ldb, beta,
              C + i0 * ldc, ldc);
    else
      gemm<T>(ta, tb, M, i1 - i0, K, alpha, A, lda, tb ? B + i0 * ldb : B + i0, ldb, beta, C + i0,
              ldc);
  });
}

template void parallel_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                   int64_t, const float*, int64_t, float, float*, int64_t);
template void parallel_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                    int64_t, const double*, int64_t, double, double*, int64_t);

void claim_blas_threads() {
#if defined(RNNCORE_BLAS_SCIPY_OPENBLAS)
  scipy_openblas_set_num_threads(1);
#endif
}

std::string blas_info() {
#if defined(RNNCORE_BLAS_ACCELERATE)
  return "Accelerate";
#elif defined(RNNCORE_BLAS_OPENBLAS) || defined(RNNCORE_BLAS_SCIPY_OPENBLAS)
  std::string name = RNNCORE_BLAS_NAME;
#if defined(RNNCORE_BLAS_SCIPY_OPENBLAS)
  return name + " (" + RNNCORE_OPENBLAS(get_config)() +
         "; single-threaded calls, rnncore's thread pool splits the work)";
#else
  return name + " (" + RNNCORE_OPENBLAS(get_config)() + ", " +
         std::to_string(RNNCORE_OPENBLAS(get_num_threads)()) + " threads)";
#endif
#else
  return RNNCORE_BLAS_NAME;
#endif
}

}  // namespace rnncore::cpu
