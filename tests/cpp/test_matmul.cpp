// The backward steps' product on packed panels (FusedOps::matmul, float32 and float64):
// against a float64 product, and the same bits however the rows and panels are split (the
// threads split them: pairs of panels run together, a lone or partial one alone).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fused.hpp"

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

}  // namespace
