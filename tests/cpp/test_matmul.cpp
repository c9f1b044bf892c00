// The backward steps' product on packed panels (FusedOps::matmul, float32 and float64):
// against a float64 product, and the same bits however the rows and panels are split (the
// threads split them: pairs of panels run together, a lone or partial one alone). And the
// product of a few rows against B as stored (FusedOps::gemm_nt), likewise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/fused.hpp"
#include "cpu/narrow.hpp"

namespace {

using rnncore::cpu::fused_kernels;
using rnncore::cpu::FusedOps;
using rnncore::cpu::kProductRows;

template <class T>
void check(const FusedOps<T>& ops, int64_t M, int64_t K, int64_t n) {
  std::mt19937 gen(static_cast<unsigned>(M * 1000003 + K * 1009 + n));
  std::normal_distribution<double> dist;
  const int64_t lda = K + 3, ldc = n + 5, w = ops.width, panels = (n + w - 1) / w;
  std::vector<T> A(static_cast<size_t>(M * lda)), B(static_cast<size_t>(K * n));
  for (auto& v : A) v = static_cast<T>(dist(gen));
  for (auto& v : B) v = static_cast<T>(dist(gen));
  std::vector<T> packed(static_cast<size_t>(panels * K * w));
  ops.pack_columns(B.data(), K, n, packed.data());
  std::vector<T> C(static_cast<size_t>(M * ldc), T(7)), D(C);
  ops.matmul(A.data(), lda, M, K, packed.data(), n, C.data(), ldc, false);
  // Within the error of a float sum of K terms (K·eps·Σ|a||b|, eps of T).
  const double eps = std::ldexp(1.0, sizeof(T) == 4 ? -24 : -53);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = double(A[r * lda + k]) * double(B[k * n + j]);
        want += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(double(C[r * ldc + j]), want, double(K) * eps * mag + 1e-300)
          << "M " << M << " K " << K << " n " << n << " at " << r << ", " << j;
    }
  // Rows in slices at multiples of kProductRows, each panel on its own, and accumulate on
  // top of the first result: every element's bits as the whole call's.
  for (int64_t r0 = 0; r0 < M; r0 += kProductRows)
    for (int64_t b = 0; b < panels; ++b) {
      const int64_t rows = std::min<int64_t>(kProductRows, M - r0), j0 = b * w;
      ops.matmul(A.data() + r0 * lda, lda, rows, K, packed.data() + b * K * w, std::min(w, n - j0),
                 D.data() + r0 * ldc + j0, ldc, false);
    }
  EXPECT_EQ(std::memcmp(C.data(), D.data(), C.size() * sizeof(T)), 0)
      << "M " << M << " K " << K << " n " << n;
  std::vector<T> E(C);
  ops.matmul(A.data(), lda, M, K, packed.data(), n, E.data(), ldc, true);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(E[r * ldc + j], C[r * ldc + j] + C[r * ldc + j]);
}

TEST(Matmul, MatchesTheFloat64ProductAndSplitsKeepTheBits) {
  const auto& k = fused_kernels();
  // Rows: one, a partial tile, whole tiles and a tail; columns: one, whole, odd and even
  // panel counts with ragged ends; K across the L1 blocking (384).
  for (int64_t M : {1, 7, 8, 9, 16, 19})
    for (int64_t n : {1, 16, 31, 33, 48, 80})
      for (int64_t K : {1, 5, 400}) {
        check(k.f32, M, K, n);
        check(k.f64, M, K, n);
      }
}

// The kernels' own GEMMs (few_rows.hpp): C = alpha op(A) op(B) + beta C against a float64
// product; C's other elements untouched and not read with beta 0 (NaN there); every
// element's bits the same in any block of rows and columns (the threads split the columns).
// NT: A [M, K] · B [n, K]ᵀ; NN: A [M, K] · B [K, n]; TN: A [K, M]ᵀ · B [K, n].
enum class Op { NT, NN, TN };
void check_gemm(const FusedOps<float>& ops, Op op, int64_t M, int64_t n, int64_t K, float beta) {
  std::mt19937 gen(static_cast<unsigned>(M * 1000003 + K * 1009 + n + 7 * int(op)));
  std::normal_distribution<float> dist;
  const auto f = op == Op::NT ? ops.gemm_nt : op == Op::NN ? ops.gemm_nn : ops.gemm_tn;
  const int64_t lda = (op == Op::TN ? M : K) + 3, ldb = (op == Op::NT ? K : n) + 1, ldc = n + 2;
  std::vector<float> A(static_cast<size_t>((op == Op::TN ? K : M) * lda)),
      B(static_cast<size_t>((op == Op::NT ? n : K) * ldb)), C(static_cast<size_t>(M * ldc));
  const auto a = [&](int64_t r, int64_t k) { return op == Op::TN ? k * lda + r : r * lda + k; };
  const auto b = [&](int64_t k, int64_t j) { return op == Op::NT ? j * ldb + k : k * ldb + j; };
  for (auto& v : A) v = dist(gen);
  for (auto& v : B) v = dist(gen);
  for (auto& v : C) v = beta == 0.0f ? std::nanf("") : dist(gen);
  const std::vector<float> C0(C);
  const float alpha = 1.5f;
  f(M, n, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  const double eps = std::ldexp(1.0, -24);
  const std::string what = std::string(op == Op::NT   ? "NT"
                                       : op == Op::NN ? "NN"
                                                      : "TN") +
                           " M " + std::to_string(M) + " n " + std::to_string(n) + " K " +
                           std::to_string(K);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = double(A[a(r, k)]) * double(B[b(k, j)]);
        want += t;
        mag += std::fabs(t);
      }
      const double c0 = beta == 0.0f ? 0.0 : double(C0[r * ldc + j]);
      want = alpha * want + beta * c0;
      ASSERT_NEAR(double(C[r * ldc + j]), want,
                  (double(K) + 2) * eps * (alpha * mag + std::fabs(c0)))
          << what << " at " << r << ", " << j;
    }
    for (int64_t j = n; j < ldc; ++j)  // the padding: untouched
      ASSERT_EQ(std::memcmp(&C[r * ldc + j], &C0[r * ldc + j], sizeof(float)), 0) << what;
  }
  for (int64_t r0 : {int64_t(0), M / 3})
    for (int64_t j0 : {int64_t(0), n / 2, n - 1}) {
      const int64_t r1 = std::min(M, r0 + 5), j1 = std::min(n, j0 + 17);
      std::vector<float> D(C0);
      f(r1 - r0, j1 - j0, K, alpha, A.data() + a(r0, 0), lda, B.data() + b(0, j0), ldb, beta,
        D.data() + r0 * ldc + j0, ldc);
      for (int64_t r = r0; r < r1; ++r)
        ASSERT_EQ(std::memcmp(&C[r * ldc + j0], &D[r * ldc + j0], (j1 - j0) * sizeof(float)), 0)
            << what << " rows from " << r0 << " columns from " << j0;
    }
}

TEST(GemmNT, MatchesTheFloat64ProductAndSplitsKeepTheBits) {
  const auto& ops = fused_kernels().f32;
  if (!ops.gemm_nt) GTEST_SKIP() << "no gemm_nt on " << fused_kernels().isa;
  // Rows: one, every tile height and two row groups; columns across tiles of 2 to 16 and the
  // blocks of 64; K with and without a partial vector.
  for (int64_t M : {1, 2, 3, 5, 6, 7, 8, 9, 16})
    for (int64_t n : {1, 3, 16, 17, 65, 130})
      for (int64_t K : {1, 15, 16, 33, 256})
        for (float beta : {0.0f, 1.0f, 0.5f}) check_gemm(ops, Op::NT, M, n, K, beta);
}

// gemm_nt and gemm_nn on float16 and bfloat16 storage's bits: the bits of gemm_nt and gemm_nn
// on B widened first, C's padding untouched; B's last row ends the allocation (a partial
// vector read past it would show under ASan).
TEST(GemmBits, GiveTheBitsOfTheWidenedProduct) {
  const auto& ops = fused_kernels().f32;
  if (!ops.gemm_nt_half) GTEST_SKIP() << "no gemm_nt_half on " << fused_kernels().isa;
  for (bool nn : {false, true})
    for (bool bf16 : {false, true})
      for (int64_t M : {1, 2, 5, 16})
        for (int64_t n : {1, 17, 130})
          for (int64_t K : {1, 7, 16, 33, 256})
            for (float beta : {0.0f, 0.5f}) {
              std::mt19937 gen(static_cast<unsigned>(M * 1009 + n * 31 + K + bf16 + 2 * nn));
              std::normal_distribution<float> dist;
              const int64_t lda = K + 3, ldc = n + 2, ldb = nn ? n : K;
              std::vector<float> A(static_cast<size_t>(M * lda)), Bw(static_cast<size_t>(n * K));
              std::vector<uint16_t> B(static_cast<size_t>(n * K));
              for (auto& v : A) v = dist(gen);
              for (size_t i = 0; i < B.size(); ++i) {
                const float v = dist(gen) * (i % 5 == 0 ? 1e-6f : 1.0f);  // float16 subnormals
                B[i] = bf16 ? rnncore::cpu::float_to_bfloat16(v) : rnncore::cpu::float_to_half(v);
                Bw[i] = bf16 ? rnncore::cpu::bfloat16_to_float(B[i])
                             : rnncore::cpu::half_to_float(B[i]);
              }
              std::vector<float> C(static_cast<size_t>(M * ldc));
              for (auto& v : C) v = beta == 0.0f ? std::nanf("") : dist(gen);
              std::vector<float> D(C);
              (nn ? ops.gemm_nn : ops.gemm_nt)(M, n, K, 1.5f, A.data(), lda, Bw.data(), ldb, beta,
                                               C.data(), ldc);
              const auto f = nn ? (bf16 ? ops.gemm_nn_bfloat16 : ops.gemm_nn_half)
                                : (bf16 ? ops.gemm_nt_bfloat16 : ops.gemm_nt_half);
              f(M, n, K, 1.5f, A.data(), lda, B.data(), ldb, beta, D.data(), ldc);
              ASSERT_EQ(std::memcmp(C.data(), D.data(), C.size() * sizeof(float)), 0)
                  << (nn ? "NN " : "NT ") << (bf16 ? "bfloat16" : "float16") << " M " << M << " n "
                  << n << " K " << K;
            }
}

// bfloat16 B by vdpbf16ps (gemm_nt_dot): A rounded to bfloat16 (and with split its remainder
// too), the products exact and the sums float32: against the float64 sum of the same
// products, and each element's bits whatever the rows and columns of its call.
TEST(GemmDot, MultiplyTheRoundedOperandsAndKeepTheBitsOfEachElement) {
  const auto& ops = fused_kernels().f32;
  if (!ops.gemm_nt_dot) GTEST_SKIP() << "no vdpbf16ps on " << fused_kernels().isa;
  using rnncore::cpu::bfloat16_to_float;
  using rnncore::cpu::float_to_bfloat16;
  const auto round = [](float v) { return bfloat16_to_float(float_to_bfloat16(v)); };
  for (bool split : {false, true})
    for (int64_t M : {1, 3, 4, 5, 9})
      for (int64_t n : {1, 17, 130})
        for (int64_t K : {1, 2, 31, 32, 33, 256})
          for (float beta : {0.0f, 0.5f}) {
            std::mt19937 gen(static_cast<unsigned>(M * 1009 + n * 31 + K + 7 * split));
            std::normal_distribution<float> dist;
            const int64_t lda = K + 3, ldc = n + 2;
            std::vector<float> A(static_cast<size_t>(M * lda));
            std::vector<uint16_t> B(static_cast<size_t>(n * K));
            for (auto& v : A) v = dist(gen);
            for (auto& v : B) v = float_to_bfloat16(dist(gen));
            std::vector<float> C(static_cast<size_t>(M * ldc));
            for (auto& v : C) v = beta == 0.0f ? std::nanf("") : dist(gen);
            const std::vector<float> C0(C);
            const auto f = split ? ops.gemm_nt_dot_split : ops.gemm_nt_dot;
            f(M, n, K, 1.5f, A.data(), lda, B.data(), K, beta, C.data(), ldc);
            for (int64_t r = 0; r < M; ++r)
              for (int64_t j = 0; j < n; ++j) {
                double want = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const float a = A[static_cast<size_t>(r * lda + k)], hi = round(a);
                  const double b = bfloat16_to_float(B[static_cast<size_t>(j * K + k)]);
                  const double x = (split ? double(hi) + round(a - hi) : double(hi)) * b;
                  want += x;
                  mag += std::fabs(x);
                }
                const size_t i = static_cast<size_t>(r * ldc + j);
                want = 1.5 * want + (beta == 0.0f ? 0.0 : double(beta) * C0[i]);
                // (a float32 sum of K products, then the alpha and beta roundings)
                const double tol =
                    std::ldexp(1.0, -24) * ((K + 2) * 1.5 * mag + 2 * std::fabs(want));
                ASSERT_NEAR(C[i], want, tol) << "split " << split << " M " << M << " n " << n
                                             << " K " << K << " r " << r << " j " << j;
                // The element alone: one row, its column alone.
                float one = beta == 0.0f ? std::nanf("") : C0[i];
                f(1, 1, K, 1.5f, A.data() + r * lda, lda, B.data() + j * K, K, beta, &one, 1);
                ASSERT_EQ(std::memcmp(&one, &C[i], sizeof one), 0)
                    << "split " << split << " M " << M << " n " << n << " K " << K;
              }
          }
}

TEST(GemmNNAndTN, MatchTheFloat64ProductAndSplitsKeepTheBits) {
  const auto& ops = fused_kernels().f32;
  if (!ops.gemm_nn) GTEST_SKIP() << "no gemm_nn on " << fused_kernels().isa;
  // Rows: one, every tile height (4 and 8) with tails, and several row tiles; columns across
  // the tiles' 16 to 48 lanes with ragged ends; K from one to a long one.
  for (Op op : {Op::NN, Op::TN})
    for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 17, 40})
      for (int64_t n : {1, 7, 16, 33, 48, 49, 130})
        for (int64_t K : {1, 2, 8, 31, 300})
          for (float beta : {0.0f, 1.0f, 0.5f}) check_gemm(ops, op, M, n, K, beta);
}

}  // namespace
