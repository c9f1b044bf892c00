// bfloat16 storage's gradient products, with products of two bfloat16 exact in float32 and
// float32 sums: on AMX-BF16 tiles (the avx512amx variant) or by vdpbf16ps (the avx512bf16
// variant; same packed operands, 32 × 32 blocks of C by registers). The GEMMs of dX, dW and
// dR take their float32 operands rounded to bfloat16 once (as oneDNN's bfloat16 layers keep
// the gates' gradients): a bfloat16 array is exact, and for the gate gradients dX' and the
// state h̃ that costs 2^-9 of each term, about 1e-3 relative of a sum of many (against the
// float64 reference, 2.8-3.4e-3 at T=100 H=256 rather than 2.3-2.7e-3), at one product per
// pair of k instead of two or three. On AMX, each backward step's product with R keeps dX'
// split into bfloat16 hi + lo (x = hi + lo to 16 significant bits; two tile products): its
// error would compound along the sequence. Included by fused_kernels.hpp where the variant
// has AVX-512 BF16.
#pragma once

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/block_cache.hpp"
#include "cpu/aligned.hpp"
#include "cpu/thread_pool.hpp"

namespace rnncore::cpu {
namespace {

#if RNNCORE_FUSED_AMX
// Configures this thread's tiles: 0-5 (accumulators and left operands) of `rows` rows, 6-7
// (right operands) of 16, all 64 bytes wide. Loading a configuration costs ~130 ns here (10-20
// tile products) and reading the current one ~8 ns, so it is loaded only when the thread's
// differs, and never released: the tiles stay configured between calls (the OS saves a
// thread's tile state at a context switch). The current one is read, not remembered: other
// code on the thread (oneDNN in PyTorch) configures and releases the tiles too.
inline void amx_configure(int rows) {
  struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  static_assert(sizeof(TileConfig) == 64, "the tile configuration's 64 bytes");
  TileConfig want{}, have;
  want.palette = 1;
  for (int t = 0; t < 8; ++t) want.colsb[t] = 64, want.rows[t] = uint8_t(t < 6 ? rows : 16);
  _tile_storeconfig(&have);
  if (std::memcmp(&have, &want, sizeof want) != 0) _tile_loadconfig(&want);
}
#endif

// Half of a core's L2 (256 KiB where the size is unknown): the bfloat16 GEMMs' resident
// operand. Xeon with AMX (2 MiB), gradients of a T=100 N=32 H=256 LSTM, alternating in one
// process: 256 KiB (13 chunks of K for dW and dR, each storing and reloading C) took
// 1.08-1.09 times the time of 1 MiB (4 chunks), 512 KiB 1.04-1.06.
inline int64_t resident_bytes() {
  static const int64_t bytes = [] {
#if defined(_SC_LEVEL2_CACHE_SIZE)  // (glibc)
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
    const long l2 = 0;
#endif
    return l2 >= (int64_t(256) << 10) && l2 <= (int64_t(64) << 20) ? int64_t(l2) / 2
                                                                   : int64_t(256) << 10;
  }();
  return bytes;
}

// This thread's scratch of at least n elements (kept between calls; the tile code using it
// does not nest).
inline uint16_t* thread_scratch(int64_t n) {
  thread_local LineVector<uint16_t> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// n elements for packed tiles, which the packing writes whole (padding included): from the
// block cache and not zeroed, where a zero-filled vector of fresh pages faulted in and
// cleared 512 KiB a call for the projection's W tiles at H = 256 (4% of a bfloat16
// T=100 N=1 LSTM's time). `keep` owns the block.
inline uint16_t* packed_buffer(Tensor& keep, int64_t n) {
  keep = detail::cached_empty({n}, DType::BFloat16);
  return static_cast<uint16_t*>(keep.data());
}

struct Bf16Gemm {
  // Operands are packed by tiles of 1 KiB, contiguous: A by blocks of 16 rows × 32 k
  // (bfloat16, k fastest), B by blocks of 16 pairs of k × 16 columns (each column's pair
  // side by side, as the tile instruction reads it). Block (i, kb) of an operand with KB
  // k-blocks sits at (i * KB + kb) * 512 elements; the lo parts follow all the hi parts.
  static constexpr int64_t kTile = 512;

  // (GCC 12's unmasked forms of these read an uninitialised source: -Wmaybe-uninitialized)
  static constexpr __mmask16 kAll = 0xFFFF;
  static constexpr __mmask8 kAll8 = 0xFF;
  static __m512i widen16(__m256i v) { return _mm512_maskz_cvtepu16_epi32(kAll, v); }
  static __m512i shl(__m512i v, unsigned n) { return _mm512_maskz_slli_epi32(kAll, v, n); }

  static __mmask16 lanes(int64_t c) {
    return __mmask16(c >= 16 ? 0xFFFF : c <= 0 ? 0 : (1u << c) - 1);
  }
  // hi = bfloat16(x) (nearest even), lo = bfloat16(x - hi); lo = 0 where hi is not finite
  // (an infinity keeps its sign instead of turning into NaN).
  static void split(__m512 x, __m256i& hi, __m256i& lo) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    const __m512 hf = _mm512_castsi512_ps(shl(widen16(h), 16));
    const __mmask16 finite =
        _mm512_cmp_ps_mask(_mm512_abs_ps(hf), _mm512_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    hi = h;
    lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, x, hf));
  }

  // hi = bfloat16(x), or split(x) with lo.
  static void convert(__m512 x, __m256i& hi, __m256i* lo) {
    if (lo)
      split(x, hi, *lo);
    else
      hi = (__m256i)_mm512_cvtneps_pbh(x);
  }

  // The columns of an operand [K, n]: one row-major array (float32, or bfloat16 bits Xb),
  // or the pieces of a GemmPiece list side by side, each from a multiple of 16 columns (zero
  // columns between), so that no 16-column block straddles two.
  struct Columns {
    static constexpr int kMax = 2;
    const float* X[kMax];
    const uint16_t* Xb[kMax];
    int64_t ld[kMax], n[kMax], off[kMax];
    int count;
    int64_t width;  // columns in all, padding included
    Columns(const float* x, const uint16_t* xb, int64_t ldx, int64_t cols)
        : X{x}, Xb{xb}, ld{ldx}, n{cols}, off{0}, count(1) {
      width = cols;
    }
    explicit Columns(const GemmPiece<float>* pc, int pieces) : count(pieces) {
      int64_t c = 0;
      for (int q = 0; q < pieces; ++q) {
        X[q] = pc[q].B, Xb[q] = nullptr, ld[q] = pc[q].ldb, n[q] = pc[q].n, off[q] = c;
        c = q + 1 < pieces ? (c + pc[q].n + 15) / 16 * 16 : c + pc[q].n;
      }
      width = c;
    }
    struct Block {
      const float* X;
      const uint16_t* Xb;
      int64_t ld, n, c0;  // the piece, its columns, and the block's first column in it
    };
    Block block(int64_t j) const {
      const int64_t c = j * 16;
      int q = count - 1;
      while (q > 0 && c < off[q]) --q;
      return {X[q], Xb[q], ld[q], n[q], c - off[q]};
    }
  };

  // Row-block i of A [M, K] (k contiguous, lda apart), k-blocks kb0 .. kb0 + KB - 1 of 32,
  // into KB blocks of 16 × 32 (lo null: rounded, hi only).
  static void pack_a_rows(const float* A, int64_t lda, int64_t M, int64_t K, int64_t i, int64_t kb0,
                          int64_t KB, uint16_t* hi, uint16_t* lo) {
    for (int64_t kb = 0; kb < KB; ++kb) {
      uint16_t* th = hi + (i * KB + kb) * kTile;
      const int64_t k0 = (kb0 + kb) * 32;
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t m = i * 16 + r;
        __m256i h0 = _mm256_setzero_si256(), l0 = h0, h1 = h0, l1 = h0;
        if (m < M) {
          const float* row = A + m * lda + k0;
          convert(_mm512_maskz_loadu_ps(lanes(K - k0), row), h0, lo ? &l0 : nullptr);
          convert(_mm512_maskz_loadu_ps(lanes(K - k0 - 16), row + 16), h1, lo ? &l1 : nullptr);
        }
        const __m512i h = _mm512_maskz_inserti64x4(kAll8, _mm512_castsi256_si512(h0), h1, 1);
        _mm512_storeu_si512(th + r * 32, h);
        if (lo)
          _mm512_storeu_si512(lo + (i * KB + kb) * kTile + r * 32,
                              _mm512_maskz_inserti64x4(kAll8, _mm512_castsi256_si512(l0), l1, 1));
      }
    }
  }

  // pack_a_rows (hi only) of A given as bfloat16 bits: the same tiles as of the float32
  // values rounded (narrow_rows).
  static void pack_a_rows_bits(const uint16_t* A, int64_t lda, int64_t M, int64_t K, int64_t i,
                               int64_t kb0, int64_t KB, uint16_t* hi) {
    for (int64_t kb = 0; kb < KB; ++kb) {
      uint16_t* th = hi + (i * KB + kb) * kTile;
      const int64_t k0 = (kb0 + kb) * 32, left = K - k0;
      const __mmask32 m = left >= 32 ? ~__mmask32(0) : left <= 0 ? 0 : (__mmask32(1) << left) - 1;
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t row = i * 16 + r;
        _mm512_storeu_si512(th + r * 32, row < M ? _mm512_maskz_loadu_epi16(m, A + row * lda + k0)
                                                 : _mm512_setzero_si512());
      }
    }
  }

  // dst [rows, n] (ldd apart) = src [rows, n] (lds apart) rounded to bfloat16 as the packing
  // rounds (nearest even; FusedOps::narrow_rows_bf16).
  static void narrow_rows(const float* src, int64_t lds, int64_t rows, int64_t n, uint16_t* dst,
                          int64_t ldd) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 m = lanes(n - c);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + r * lds + c));
        _mm256_mask_storeu_epi16(dst + r * ldd + c, m, h);
      }
  }

  // Rows 2q and 2q+1 of X [K, n] (ld apart, columns c0 .. c0+15) as 16 pairs (32-bit lanes
  // by column), rounded to bfloat16 (Xb: X's bfloat16 bits instead); rows past K are zero.
  static __m512i pairs_of_rows(const float* X, const uint16_t* Xb, int64_t ld, int64_t K, int64_t n,
                               int64_t c0, int64_t k) {
    const __mmask16 m = lanes(n - c0);
    __m256i h0 = _mm256_setzero_si256(), h1 = h0;
    if (Xb) {
      if (k < K) h0 = _mm256_maskz_loadu_epi16(m, Xb + k * ld + c0);
      if (k + 1 < K) h1 = _mm256_maskz_loadu_epi16(m, Xb + (k + 1) * ld + c0);
      return _mm512_or_si512(widen16(h0), shl(widen16(h1), 16));
    }
    if (k < K) h0 = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, X + k * ld + c0));
    if (k + 1 < K)
      h1 = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, X + (k + 1) * ld + c0));
    // interleave: lane c = (row k, column c) | (row k + 1, column c) << 16
    return _mm512_or_si512(widen16(h0), shl(widen16(h1), 16));
  }

  // Column-blocks [j0, j1) of B [K, n] (row-major; Columns: up to two arrays side by side),
  // k-blocks kb0 .. kb0 + KB - 1, into KB blocks of 16 pairs × 16 each. The blocks side by
  // side in the inner loop: each row is read in (j1 - j0) adjacent lines at a time, where one
  // block's 64 bytes a row, rows a page apart, left the prefetchers idle.
  static void pack_b(const Columns& B, int64_t K, int64_t j0, int64_t j1, int64_t kb0, int64_t KB,
                     uint16_t* out) {
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int64_t q = 0; q < 16; ++q)
        for (int64_t j = j0; j < j1; ++j) {
          const Columns::Block b = B.block(j);
          _mm512_storeu_si512(
              out + (j * KB + kb) * kTile + q * 32,
              pairs_of_rows(b.X, b.Xb, b.ld, K, b.n, b.c0, (kb0 + kb) * 32 + 2 * q));
        }
  }
  // Column blocks a packing task of B takes (pack_b).
  static constexpr int64_t kPackColumns = 4;

  // r[i] lane j = r[j] lane i (16 × 16, 32-bit lanes).
  static void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int a = 0; a < 16; a += 2) {
      t[a] = _mm512_maskz_unpacklo_epi32(kAll, r[a], r[a + 1]);
      t[a + 1] = _mm512_maskz_unpackhi_epi32(kAll, r[a], r[a + 1]);
    }
    // u[4g + c], 128-bit lane l: column 4l + c of rows 4g .. 4g + 3
    for (int g = 0; g < 16; g += 4) {
      u[g] = _mm512_maskz_unpacklo_epi64(kAll8, t[g], t[g + 2]);
      u[g + 1] = _mm512_maskz_unpackhi_epi64(kAll8, t[g], t[g + 2]);
      u[g + 2] = _mm512_maskz_unpacklo_epi64(kAll8, t[g + 1], t[g + 3]);
      u[g + 3] = _mm512_maskz_unpackhi_epi64(kAll8, t[g + 1], t[g + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i x = _mm512_maskz_shuffle_i32x4(kAll, u[c], u[4 + c], 0x88);
      const __m512i y = _mm512_maskz_shuffle_i32x4(kAll, u[c], u[4 + c], 0xDD);
      const __m512i x2 = _mm512_maskz_shuffle_i32x4(kAll, u[8 + c], u[12 + c], 0x88);
      const __m512i y2 = _mm512_maskz_shuffle_i32x4(kAll, u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_maskz_shuffle_i32x4(kAll, x, x2, 0x88);
      r[4 + c] = _mm512_maskz_shuffle_i32x4(kAll, y, y2, 0x88);
      r[8 + c] = _mm512_maskz_shuffle_i32x4(kAll, x, x2, 0xDD);
      r[12 + c] = _mm512_maskz_shuffle_i32x4(kAll, y, y2, 0xDD);
    }
  }

  // Row-block i of A = Xᵀ for X [K, M] (row-major; Columns as pack_b's), k-blocks kb0 ..
  // kb0 + KB - 1: the pairs of rows of X, transposed so that each of the block's 16 rows holds
  // its pairs. Row-blocks [i0, i1) side by side in the inner loop, as pack_b's column blocks.
  static void pack_a_cols(const Columns& X, int64_t K, int64_t i0, int64_t i1, int64_t kb0,
                          int64_t KB, uint16_t* out) {
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int64_t i = i0; i < i1; ++i) {
        const Columns::Block b = X.block(i);
        __m512i h[16];
        for (int64_t q = 0; q < 16; ++q)
          h[q] = pairs_of_rows(b.X, b.Xb, b.ld, K, b.n, b.c0, (kb0 + kb) * 32 + 2 * q);
        transpose16(h);
        uint16_t* t = out + (i * KB + kb) * kTile;
        for (int r = 0; r < 16; ++r) _mm512_storeu_si512(t + r * 32, h[r]);
      }
  }

#if RNNCORE_FUSED_AMX
  // Cp[32 × 32 block (bi, bj)] = (or += with accumulate) the products of the KB k-blocks
  // packed.
  static void block(const uint16_t* A, const uint16_t* B, int64_t KB, int64_t bi, int64_t bj,
                    bool accumulate, float* Cp, int64_t ldp) {
    float* c = Cp + bi * 32 * ldp + bj * 32;
    const int64_t sc = ldp * 4;
    if (!accumulate) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    } else {
      _tile_loadd(0, c, sc);
      _tile_loadd(1, c + 16, sc);
      _tile_loadd(2, c + 16 * ldp, sc);
      _tile_loadd(3, c + 16 * ldp + 16, sc);
    }
    const int64_t a0 = (2 * bi * KB) * kTile, a1 = a0 + KB * kTile;
    const int64_t b0 = (2 * bj * KB) * kTile, b1 = b0 + KB * kTile;
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t o = kb * kTile;
      _tile_loadd(4, A + a0 + o, 64);
      _tile_loadd(5, A + a1 + o, 64);
      _tile_loadd(6, B + b0 + o, 64);
      _tile_loadd(7, B + b1 + o, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    _tile_stored(1, c + 16, sc);
    _tile_stored(2, c + 16 * ldp, sc);
    _tile_stored(3, c + 16 * ldp + 16, sc);
  }

#else
  // The same block by vdpbf16ps: passes of 8 rows × both column blocks (16 accumulators),
  // each pair of k of A broadcast against the 16 columns' pairs of B. Per element the sum
  // runs over k in the same order whatever the threads.
  static void block(const uint16_t* A, const uint16_t* B, int64_t KB, int64_t bi, int64_t bj,
                    bool accumulate, float* Cp, int64_t ldp) {
    constexpr int R = 8;
    const uint16_t* B0 = B + 2 * bj * KB * kTile;
    const uint16_t* B1 = B0 + KB * kTile;
    for (int64_t half = 0; half < 2; ++half) {
      const uint16_t* Ab = A + (2 * bi + half) * KB * kTile;
      for (int r0 = 0; r0 < 16; r0 += R) {
        float* c = Cp + (bi * 32 + half * 16 + r0) * ldp + bj * 32;
        __m512 acc[R][2];
        for (int r = 0; r < R; ++r) {
          acc[r][0] = accumulate ? _mm512_loadu_ps(c + r * ldp) : _mm512_setzero_ps();
          acc[r][1] = accumulate ? _mm512_loadu_ps(c + r * ldp + 16) : _mm512_setzero_ps();
        }
        for (int64_t kb = 0; kb < KB; ++kb) {
          const uint16_t* a = Ab + kb * kTile + r0 * 32;
          const uint16_t* b0 = B0 + kb * kTile;
          const uint16_t* b1 = B1 + kb * kTile;
          for (int q = 0; q < 16; ++q) {
            const __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + q * 32);
            const __m512bh x1 = (__m512bh)_mm512_loadu_si512(b1 + q * 32);
            for (int r = 0; r < R; ++r) {
              uint32_t pair;
              std::memcpy(&pair, a + r * 32 + 2 * q, sizeof pair);
              const __m512bh y = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
              acc[r][0] = _mm512_dpbf16_ps(acc[r][0], y, x0);
              acc[r][1] = _mm512_dpbf16_ps(acc[r][1], y, x1);
            }
          }
        }
        for (int r = 0; r < R; ++r) {
          _mm512_storeu_ps(c + r * ldp, acc[r][0]);
          _mm512_storeu_ps(c + r * ldp + 16, acc[r][1]);
        }
      }
    }
  }
#endif

  // C[M, n] = op(A) B, op(A) = A [M, K] or (trans_a) Aᵀ for A [K, M]; B [K, n]; row-major;
  // both operands rounded to bfloat16 (A_bits: A's bfloat16 bits, read in A's place).
  static void gemm(bool trans_a, int64_t M, int64_t n, int64_t K, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float* C, int64_t ldc, const uint16_t* A_bits) {
    const GemmPiece<float> piece{B, ldb, n, C, ldc};
    gemm_pieces(trans_a, M, K, A, lda, &piece, 1, A_bits);
  }

  // C_q [M, n_q] = op(A) B_q for the pieces q (at most Columns::kMax): one product of op(A)
  // and the pieces side by side, so that op(A) is packed once for all of them (dX' for the
  // LSTM's dW and dR). Each element's sums are those of its piece's product alone.
  static void gemm_pieces(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda,
                          const GemmPiece<float>* pc, int pieces, const uint16_t* A_bits) {
    const Columns Bc(pc, pieces);
    const int64_t n = Bc.width;
    if (M == 0 || n == 0) return;
    if (K == 0) {
      for (int q = 0; q < pieces; ++q)
        for (int64_t m = 0; m < M; ++m)
          std::fill(pc[q].C + m * pc[q].ldc, pc[q].C + m * pc[q].ldc + pc[q].n, 0.0f);
      return;
    }
    // Aᵀ B with fewer columns than rows: computed as (Bᵀ A)ᵀ, so that the transposed
    // operand (the costlier to pack) is the smaller one.
    const bool swap = trans_a && n < M;
    const Columns Ac(A, A_bits, lda, M);
    const int64_t Mc = swap ? n : M, Nc = swap ? M : n;
    const int64_t MB = (Mc + 31) / 32 * 2, NB = (Nc + 31) / 32 * 2, KB = (K + 31) / 32;
    // C itself takes the tiles when it is made of whole blocks; else a padded copy does.
    const bool direct = !swap && pieces == 1 && M % 32 == 0 && n % 32 == 0;
    const int64_t ldp = direct ? pc[0].ldc : NB * 16;
    LineVector<float> Cpad(direct ? 0 : static_cast<size_t>(MB * 16 * ldp));
    float* Cp = direct ? pc[0].C : Cpad.data();
    // K in chunks, packed and multiplied in turn: the packed rows of the resident (smaller)
    // operand stay in half of L2 while the other operand's 32-wide blocks stream past
    // them, claimed by the threads; and the packed copies take memory of a chunk, not of
    // the whole operands. Each chunk after the first loads and stores C once more.
    const bool rows_resident = MB <= NB;
    const int64_t resident = rows_resident ? MB : NB, streamed = rows_resident ? NB : MB;
    const int64_t tile_bytes = kTile * 2;
    const int64_t KC =
        std::max<int64_t>(1, std::min<int64_t>(KB, resident_bytes() / (resident * tile_bytes)));
    Tensor Ap, Bp;
    uint16_t* const Ah = packed_buffer(Ap, MB * KC * kTile);
    uint16_t* const Bh = packed_buffer(Bp, NB * KC * kTile);
    ThreadPool& pool = ThreadPool::instance();
    for (int64_t kb0 = 0; kb0 < KB; kb0 += KC) {
      const int64_t kc = std::min(KB - kb0, KC);
      // Packing tasks: A's row blocks (by kPackColumns when transposed) and B's.
      const bool cols = swap || trans_a;
      const int64_t mbt = cols ? (MB + kPackColumns - 1) / kPackColumns : MB;
      const int64_t nbt = (NB + kPackColumns - 1) / kPackColumns;
      pool.parallel_for(mbt + nbt, [&](int64_t t) {
        if (t < mbt) {
          const int64_t i0 = t * kPackColumns, i1 = std::min(MB, i0 + kPackColumns);
          if (cols)
            pack_a_cols(swap ? Bc : Ac, K, i0, i1, kb0, kc, Ah);
          else if (A_bits)
            pack_a_rows_bits(A_bits, lda, Mc, K, t, kb0, kc, Ah);
          else
            pack_a_rows(A, lda, Mc, K, t, kb0, kc, Ah, nullptr);
        } else {
          const int64_t j0 = (t - mbt) * kPackColumns, j1 = std::min(NB, j0 + kPackColumns);
          pack_b(swap ? Ac : Bc, K, j0, j1, kb0, kc, Bh);
        }
      });
      pool.parallel_for(streamed / 2, [&](int64_t st) {
#if RNNCORE_FUSED_AMX
        amx_configure(16);
#endif
        for (int64_t r = 0; r < resident / 2; ++r) {
          const int64_t bi = rows_resident ? r : st, bj = rows_resident ? st : r;
          block(Ah, Bh, kc, bi, bj, kb0 > 0, Cp, ldp);
        }
      });
    }
    const float* cp = Cp;
    if (direct) return;
    if (!swap) {
      for (int q = 0; q < pieces; ++q)
        for (int64_t m = 0; m < M; ++m)
          std::memcpy(pc[q].C + m * pc[q].ldc, cp + m * ldp + Bc.off[q],
                      static_cast<size_t>(pc[q].n) * sizeof(float));
      return;
    }
    // Cp holds Cᵀ [n, M] (padded: whole 16 × 16 blocks to read)
    pool.parallel_for((M + 15) / 16, [&](int64_t b) {
      const int64_t m0 = b * 16;
      for (int q = 0; q < pieces; ++q)
        for (int64_t j0 = 0; j0 < pc[q].n; j0 += 16) {
          __m512i r[16];
          for (int i = 0; i < 16; ++i)
            r[i] = _mm512_loadu_si512(cp + (Bc.off[q] + j0 + i) * ldp + m0);
          transpose16(r);
          for (int64_t m = m0; m < std::min(M, m0 + 16); ++m)
            _mm512_mask_storeu_epi32(pc[q].C + m * pc[q].ldc + j0, lanes(pc[q].n - j0), r[m - m0]);
        }
    });
  }

#if RNNCORE_FUSED_AMX
  // ---- the input projection of bfloat16 storage: x' = x Wᵀ + bias ---------------------
  // Row-block i (16 rows, zeros past `rows`) of X [rows, K] of bfloat16 bits (K apart),
  // into KB tiles of 16 × 32 (k fastest); transposed as 32-bit lanes (pairs of k) they are
  // B tiles: 16 pairs × 16 columns, column c being X's row i·16 + c.
  static void pack_bits(const uint16_t* X, int64_t rows, int64_t K, int64_t i, int64_t KB,
                        bool transposed, uint16_t* out) {
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t k0 = kb * 32;
      const __mmask32 m = K - k0 >= 32 ? ~__mmask32(0) : (__mmask32(1) << (K - k0)) - 1;
      __m512i r[16];
      for (int64_t q = 0; q < 16; ++q) {
        const int64_t row = i * 16 + q;
        r[q] = row < rows ? _mm512_maskz_loadu_epi16(m, X + row * K + k0) : _mm512_setzero_si512();
      }
      if (transposed) transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(out + (i * KB + kb) * kTile + q * 32, r[q]);
    }
  }

  // C [M, n] (n apart) = x [M, K] · w [n, K]ᵀ (+ bias [n]) for bfloat16 x and w (bits): exact
  // products, float32 sums (as vdpbf16ps's). w's tiles are packed once and stay in L2; each
  // task takes 32 rows of x (packed in L1) past all of them, 32 × 32 of C per pass, the
  // accumulators starting from the bias (a tile load of stride 0 repeats its row). Every
  // element's sum runs in one fixed order: the bits do not depend on the threads.
  static void project(int64_t M, int64_t n, int64_t K, const uint16_t* x, const uint16_t* w,
                      const float* bias, float* C) {
    if (M <= 0 || n <= 0) return;
    const int64_t KB = (K + 31) / 32, NB2 = (n + 31) / 32;
    Tensor Bt;
    uint16_t* const Bp = packed_buffer(Bt, 2 * NB2 * KB * kTile);
    std::vector<float> bias_pad(static_cast<size_t>(NB2 * 32), 0.0f);
    if (bias) std::copy(bias, bias + n, bias_pad.begin());
    ThreadPool& pool = ThreadPool::instance();
    pool.parallel_for(2 * NB2, [&](int64_t j) { pack_bits(w, n, K, j, KB, true, Bp); });
    pool.parallel_for((M + 31) / 32, [&](int64_t t) {
      uint16_t* A = thread_scratch(2 * KB * kTile);
      pack_bits(x + t * 32 * K, M - t * 32, K, 0, KB, false, A);
      pack_bits(x + t * 32 * K, M - t * 32, K, 1, KB, false, A);
      alignas(64) float edge[32 * 32];
      amx_configure(16);
      const int64_t rows = std::min<int64_t>(32, M - t * 32);
      for (int64_t bj = 0; bj < NB2; ++bj) {
        const int64_t cols = std::min<int64_t>(32, n - bj * 32);
        const bool direct = rows == 32 && cols == 32;
        float* c = direct ? C + t * 32 * n + bj * 32 : edge;
        const int64_t sc = (direct ? n : 32) * 4;
        if (bias) {
          const float* b = bias_pad.data() + bj * 32;
          _tile_loadd(0, b, 0);
          _tile_loadd(1, b + 16, 0);
          _tile_loadd(2, b, 0);
          _tile_loadd(3, b + 16, 0);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        const uint16_t* b0 = Bp + 2 * bj * KB * kTile;
        const uint16_t* b1 = b0 + KB * kTile;
        for (int64_t kb = 0; kb < KB; ++kb) {
          const int64_t o = kb * kTile;
          _tile_loadd(4, A + o, 64);
          _tile_loadd(5, A + KB * kTile + o, 64);
          _tile_loadd(6, b0 + o, 64);
          _tile_loadd(7, b1 + o, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, sc);
        _tile_stored(1, c + 16, sc);
        _tile_stored(2, c + 16 * (sc / 4), sc);
        _tile_stored(3, c + 16 * (sc / 4) + 16, sc);
        if (!direct)
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(C + (t * 32 + r) * n + bj * 32, edge + r * 32,
                        static_cast<size_t>(cols) * sizeof(float));
      }
    });
  }

  // ---- the backward steps' product with R (bfloat16 storage: R exact in bfloat16) -------
  // B [K, n] as tiles of its values, which are bfloat16 (R of bfloat16 storage): exact.
  static void pack_tiles(const float* B, int64_t K, int64_t n, uint16_t* out) {
    const int64_t KB = (K + 31) / 32;
    pack_b(Columns(B, nullptr, n, n), K, 0, (n + 15) / 16, 0, KB, out);
  }

  // C[M, n] (+)= A[M, K] B for B packed by pack_tiles, A split into hi + lo per 16 rows: two
  // tile products per pair of k. Each row's sums involve only that row, so a row's bits do
  // not depend on the other rows of the call (the slices of the backward).
  static void matmul_tiles(const float* A, int64_t lda, int64_t M, int64_t K,
                           const uint16_t* packed, int64_t n, float* C, int64_t ldc,
                           bool accumulate) {
    if (M <= 0 || n <= 0) return;
    const int64_t KB = (K + 31) / 32, NB = (n + 15) / 16;
    uint16_t* Ah = thread_scratch(2 * KB * kTile);
    uint16_t* Al = Ah + KB * kTile;
    alignas(64) float edge[4][16 * 16];  // column blocks narrower than 16
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int rows = static_cast<int>(std::min<int64_t>(16, M - m0));
      pack_a_rows(A + m0 * lda, lda, rows, K, 0, 0, KB, Ah, Al);
      amx_configure(rows);
      float* c = C + m0 * ldc;
      for (int64_t j0 = 0; j0 < NB; j0 += 4) {
        const int64_t nb = std::min<int64_t>(4, NB - j0);
        // Where tile t of this pass reads and writes C: in place when 16 columns wide.
        float* at[4];
        int64_t st[4];
        for (int64_t t = 0; t < nb; ++t) {
          const int64_t col = (j0 + t) * 16, w = std::min<int64_t>(16, n - col);
          if (w == 16) {
            at[t] = c + col, st[t] = ldc * 4;
          } else {
            at[t] = edge[t], st[t] = 64;
            for (int r = 0; r < rows; ++r)
              for (int64_t x = 0; x < 16; ++x)
                edge[t][r * 16 + x] = accumulate && x < w ? c[r * ldc + col + x] : 0.0f;
          }
        }
        if (accumulate) {  // (an edge block without accumulate: its scratch holds zeros)
          _tile_loadd(0, at[0], st[0]);
          if (nb > 1) _tile_loadd(1, at[1], st[1]);
          if (nb > 2) _tile_loadd(2, at[2], st[2]);
          if (nb > 3) _tile_loadd(3, at[3], st[3]);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        const uint16_t* b = packed + j0 * KB * kTile;
        for (int64_t kb = 0; kb < KB; ++kb) {
          const int64_t o = kb * kTile;
          _tile_loadd(4, Ah + o, 64);
          _tile_loadd(5, Al + o, 64);
          _tile_loadd(6, b + o, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(0, 5, 6);
          if (nb > 1) {
            _tile_loadd(7, b + KB * kTile + o, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(1, 5, 7);
          }
          if (nb > 2) {
            _tile_loadd(6, b + 2 * KB * kTile + o, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
          }
          if (nb > 3) {
            _tile_loadd(7, b + 3 * KB * kTile + o, 64);
            _tile_dpbf16ps(3, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, at[0], st[0]);
        if (nb > 1) _tile_stored(1, at[1], st[1]);
        if (nb > 2) _tile_stored(2, at[2], st[2]);
        if (nb > 3) _tile_stored(3, at[3], st[3]);
        for (int64_t t = 0; t < nb; ++t)
          if (at[t] == edge[t]) {
            const int64_t col = (j0 + t) * 16, w = n - col;
            for (int r = 0; r < rows; ++r)
              for (int64_t x = 0; x < w; ++x) c[r * ldc + col + x] = edge[t][r * 16 + x];
          }
      }
    }
  }
#endif
};

}  // namespace
}  // namespace rnncore::cpu
