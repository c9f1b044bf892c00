// Pieces shared by the CPU recurrences of rnn.cpp, lstm.cpp and gru.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/problem.hpp"
#include "cpu/blas.hpp"
#include "cpu/directions.hpp"
#include "cpu/fused.hpp"
#include "cpu/narrow.hpp"
#include "cpu/thread_pool.hpp"

namespace rnncore::cpu {

using detail::Problem;

// Time index of processing step s in the input (in) or the outputs (out).
inline int64_t step_time(int64_t s, int64_t T, bool flip) { return flip ? T - 1 - s : s; }

// A row-major matrix in someone's storage: element (n, j) is data[n * ld + j].
template <class T>
struct Rows {
  T* data;
  int64_t ld;
  T* row(int64_t n) const { return data + n * ld; }
};

// Scratch of one direction, allocated once per call: nothing is allocated in the loop.
template <class T>
struct Scratch {
  std::vector<T> buf;
  T* take(int64_t n) {
    T* p = buf.data() + used;
    used += n;
    return p;
  }
  explicit Scratch(int64_t total) : buf(static_cast<size_t>(total), T(0)) {}
  int64_t used = 0;
};

// The state entering step s: the initial state (or zeros) at s = 0, else the previous
// step's output row block.
template <class T>
Rows<const T> previous(const DirectionForward& a, int64_t s, int64_t T_, int64_t N, const T* zeros,
                       int64_t H) {
  if (s == 0)
    return a.h0 ? Rows<const T>{static_cast<const T*>(a.h0), a.h0_ld} : Rows<const T>{zeros, H};
  const int64_t t = step_time(s - 1, T_, a.flip_out);
  return {static_cast<const T*>(a.y) + t * N * a.y_ld, a.y_ld};
}

// h ⊙ m into `out` when there is a mask; otherwise h itself.
template <class T>
Rows<const T> masked(const DirectionForward& a, Rows<const T> h, int64_t N, int64_t H, T* out) {
  if (!a.mask) return h;
  const T* m = static_cast<const T*>(a.mask);
  for (int64_t n = 0; n < N; ++n) {
    const T* hr = h.row(n);
    const T* mr = m + n * a.mask_ld;
    T* o = out + n * H;
    for (int64_t j = 0; j < H; ++j) o[j] = hr[j] * mr[j];
  }
  return {out, H};
}

// C[M, n] = alpha A · op(B) + beta C for B in float16 or bfloat16 storage's bits, read as
// stored: B [n, K] transposed (trans_b; FusedOps::gemm_nt_half, gemm_nt_bfloat16) or B [K, n]
// (gemm_nn_half, gemm_nn_bfloat16), the bits of the float32 product on B widened first; C's
// columns split among the threads as parallel_gemm splits its own.
// With dot (bfloat16, trans_b, AVX-512 BF16: FusedOps::gemm_nt_dot), by vdpbf16ps on A
// rounded to bfloat16, or split into hi + lo.
enum class Dot { No, Rounded, Split };
inline void parallel_gemm_bits(bool trans_b, bool bfloat16, int64_t M, int64_t n, int64_t K,
                               float alpha, const float* A, int64_t lda, const uint16_t* B,
                               int64_t ldb, float beta, float* C, int64_t ldc, Dot dot = Dot::No) {
  const FusedOps<float>& k = fused_kernels().f32;
  const auto f = dot == Dot::Split     ? k.gemm_nt_dot_split
                 : dot == Dot::Rounded ? k.gemm_nt_dot
                 : trans_b             ? (bfloat16 ? k.gemm_nt_bfloat16 : k.gemm_nt_half)
                                       : (bfloat16 ? k.gemm_nn_bfloat16 : k.gemm_nn_half);
  ThreadPool& pool = ThreadPool::instance();
  const int64_t parts = own_gemm_parts(M, n, K, pool.available());
  pool.parallel_for(parts, [&](int64_t part) {
    const auto begin = [&](int64_t i) { return i == parts ? n : n * i / parts / 16 * 16; };
    const int64_t j0 = begin(part), j1 = begin(part + 1);
    f(M, j1 - j0, K, alpha, A, lda, B + (trans_b ? j0 * ldb : j0), ldb, beta, C + j0, ldc);
  });
}

// Whether the kernels read float16 and bfloat16 storage's B as stored (AVX2 or AVX-512).
inline bool gemm_bits_available() { return fused_kernels().f32.gemm_nt_half != nullptr; }

// The recurrent product of one direction's steps, acc[N, rows] = h̃[N, H] · R[row0 + rows, H]ᵀ:
// through BLAS (split as parallel_gemm splits it, whichever threads run the parts), or on
// float16 / bfloat16 storage's R as stored (R_narrow, when R has no float32 copy;
// parallel_gemm_bits). Where the fused kernels multiply bfloat16 pairs (vdpbf16ps), in
// their arithmetic: h̃ rounded to bfloat16 in inference and split into hi + lo in a training
// forward (fused_kernels.hpp), the products then exact in float32 and the sums float32.
template <class T>
class StepProduct {
 public:
  StepProduct(const Problem& p, const DirectionForward& a)
      : H_(p.H),
        R_(static_cast<const T*>(a.R)),
        bits_(a.R ? nullptr : a.R_narrow),
        bfloat16_(a.R_bfloat16) {
    if constexpr (std::is_same_v<T, float>) {
      if (bits_ && bfloat16_ && fused_kernels().f32.gemm_pairs)
        dot_ = a.z || a.z_bits ? Dot::Split : Dot::Rounded;
    }
  }
  void operator()(Rows<const T> h, int64_t N, int64_t row0, int64_t rows, T* acc, int64_t acc_ld) {
    if constexpr (std::is_same_v<T, float>) {
      if (bits_)
        return parallel_gemm_bits(true, bfloat16_, N, rows, H_, 1.0f, h.data, h.ld,
                                  bits_ + row0 * H_, H_, 0.0f, acc, acc_ld, dot_);
    }
    parallel_gemm<T>(false, true, N, rows, H_, T(1), h.data, h.ld, R_ + row0 * H_, H_, T(0), acc,
                     acc_ld);
  }

 private:
  int64_t H_;
  const T* R_;
  const uint16_t* bits_;
  bool bfloat16_;
  Dot dot_ = Dot::No;
};

// The gradients' GEMMs, C[M, n] = op(A) B (op(A) = Aᵀ, A [K, M], with trans_a): for bfloat16
// storage, with the operands rounded to bfloat16 where the CPU multiplies bfloat16 (AMX tiles
// or vdpbf16ps: FusedOps::tile_gemm), else parallel_gemm.
// A few rows of A or a short K (blas.hpp's kFewRows32, kShortK): the float32 GEMM on the
// operands rounded to bfloat16, the same products as the tiles' (exact in float32) summed in
// float32, where the tiles' blocks of 32 would be mostly padding (T=1 N=1 GRU gradients: 32
// times the multiplications, and their packing, for K = 1). B of a few rows' product is W or
// R, already bfloat16.
// B_bits: B in float16 / bfloat16 storage's bits, read as stored (B null; not with trans_a,
// nor where the tiles run). A_bits: A as bfloat16 bits (dX' of bfloat16 storage where
// dxp_bits_wanted), read in A's place by the tiles (A null).
template <class T>
void gradient_gemm(const Problem& p, bool trans_a, int64_t M, int64_t n, int64_t K, const T* A,
                   int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                   const uint16_t* B_bits = nullptr, const uint16_t* A_bits = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    const auto tiles = fused_kernels().f32.tile_gemm;
    const bool bfloat16 = p.storage == DType::BFloat16;
    if (!B && B_bits && !trans_a && !(bfloat16 && tiles))
      return parallel_gemm_bits(false, bfloat16, M, n, K, 1.0f, A, lda, B_bits, ldb, 0.0f, C, ldc);
    if (bfloat16 && tiles) {
      if (!(trans_a ? K <= kShortK : M <= kFewRows32))
        return tiles(trans_a, M, n, K, A, lda, B, ldb, C, ldc, A_bits);
      std::vector<float> widened;  // A's bits as values (never with dxp_bits_wanted's sizes)
      if (A_bits) {
        const int64_t rows = trans_a ? K : M, cols = trans_a ? M : K;
        widened.resize(static_cast<size_t>(rows * lda));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            widened[r * lda + c] = bfloat16_to_float(A_bits[r * lda + c]);
        A = widened.data();
      }
      const auto rounded = [](const float* src, int64_t rows, int64_t cols, int64_t ld) {
        std::vector<float> out(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            out[r * cols + c] = bfloat16_to_float(float_to_bfloat16(src[r * ld + c]));
        return out;
      };
      const std::vector<float> a = rounded(A, trans_a ? K : M, trans_a ? M : K, lda);
      if (!trans_a && !B)
        return parallel_gemm_bits(false, true, M, n, K, 1.0f, a.data(), K, B_bits, ldb, 0.0f, C,
                                  ldc);
      if (!trans_a)
        return parallel_gemm<float>(false, false, M, n, K, 1.0f, a.data(), K, B, ldb, 0.0f, C, ldc);
      const std::vector<float> b = rounded(B, K, n, ldb);
      return parallel_gemm<float>(true, false, M, n, K, 1.0f, a.data(), M, b.data(), n, 0.0f, C,
                                  ldc);
    }
  }
  parallel_gemm<T>(trans_a, false, M, n, K, T(1), A, lda, B, ldb, T(0), C, ldc);
}

// dW and dR as one product of dX' and [source | h̃] where the bfloat16 tiles run, so that dX'
// (13 MB at T=100 N=32 H=256) is packed once for both: the single-gate RNN and the LSTM,
// whose dR is one GEMM. The same bits as the two products apart.
inline bool joint_input_gradient(const Problem& p) {
  return p.storage == DType::BFloat16 && p.dtype == DType::Float32 &&
         fused_kernels().f32.tile_gemm_pieces &&
         (p.op == detail::OpKind::Lstm || p.op == detail::OpKind::Rnn) && p.has_input_weight &&
         p.I > 0 && p.T * p.N > kShortK;
}

// dR = dX'ᵀ h̃ [M = G*H, H] of one direction over all T*N rows, with dW = dX'ᵀ source where
// a.dW is set (joint_input_gradient).
template <class T>
void recurrent_gradient(const Problem& p, const DirectionBackward& a, int64_t M, const T* hm_all) {
  const int64_t K = p.T * p.N;
  const T* dxp = static_cast<const T*>(a.dxp);
  const GemmPiece<T> dR{hm_all, p.H, p.H, static_cast<T*>(a.dR), p.H};
  if constexpr (std::is_same_v<T, float>) {
    if (a.dW) {
      const GemmPiece<float> pieces[2] = {
          {static_cast<const float*>(a.source), p.I, p.I, static_cast<float*>(a.dW), p.I}, dR};
      return fused_kernels().f32.tile_gemm_pieces(true, M, K, dxp, a.dxp_ld, pieces, 2, a.dxp_bits);
    }
  }
  gradient_gemm<T>(p, true, M, p.H, K, dxp, a.dxp_ld, hm_all, p.H, dR.C, p.H, nullptr, a.dxp_bits);
}

// dX' kept as the bfloat16 its gradient GEMMs round it to (DirectionBackward::dxp_bits):
// bfloat16 storage where those GEMMs run on tiles (the sizes gradient_gemm gives them), and an
// input weight (else dX' is the source gradient itself). Then dX' of all steps is written
// and read in 16 bits rather than 32 (13 MB of float32 at T=100 N=32 H=256, written once and
// read by two GEMMs' packing), with the same bits: the tiles round it so anyway.
inline bool dxp_bits_wanted(const Problem& p) {
  const auto& k = fused_kernels().f32;
  return p.storage == DType::BFloat16 && p.dtype == DType::Float32 && p.has_input_weight &&
         k.tile_gemm && k.tile_gemm_pieces && k.narrow_rows_bf16 &&
         p.T * p.N > std::max(kShortK, kFewRows32);
}

// Step s's rows of dX' (at input time tin): in dX' itself, or with dxp_bits in the one step's
// float32 rows that dxp then is (the step's product with R and the bias gradient read them).
template <class T>
T* step_dx(const DirectionBackward& a, int64_t tin, int64_t N) {
  return static_cast<T*>(a.dxp) + (a.dxp_bits ? 0 : tin * N * a.dxp_ld);
}

// After the step: its `rows` rows of dX' (K columns) into dxp_bits, where kept there.
template <class T>
void keep_step_dx(const DirectionBackward& a, const T* dx, int64_t tin, int64_t N, int64_t rows,
                  int64_t K) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.dxp_bits)
      fused_kernels().f32.narrow_rows_bf16(dx, a.dxp_ld, rows, K, a.dxp_bits + tin * N * a.dxp_ld,
                                           a.dxp_ld);
  } else {
    (void)a, (void)dx, (void)tin, (void)N, (void)rows, (void)K;
  }
}

// The state entering step s of a backward pass, from forward outputs (at output time).
template <class T>
Rows<const T> previous_fwd(const void* h0, int64_t h0_ld, const void* fwd, int64_t fwd_ld,
                           int64_t s, int64_t T_, int64_t N, bool flip_out, const T* zeros,
                           int64_t H) {
  if (s == 0) return h0 ? Rows<const T>{static_cast<const T*>(h0), h0_ld} : Rows<const T>{zeros, H};
  const int64_t t = step_time(s - 1, T_, flip_out);
  return {static_cast<const T*>(fwd) + t * N * fwd_ld, fwd_ld};
}

// out[n, :] = h[n, :] (⊙ mask[n, :]), dense [N, H].
template <class T>
void store_masked(const DirectionBackward& a, Rows<const T> h, int64_t N, int64_t H, T* out) {
  const T* m = static_cast<const T*>(a.mask);
  for (int64_t n = 0; n < N; ++n) {
    const T* hr = h.row(n);
    T* o = out + n * H;
    if (m) {
      const T* mr = m + n * a.mask_ld;
      for (int64_t j = 0; j < H; ++j) o[j] = hr[j] * mr[j];
    } else {
      std::memcpy(o, hr, static_cast<size_t>(H) * sizeof(T));
    }
  }
}

// x[n, :] *= mask[n, :] when there is a mask.
template <class T>
void apply_mask(const DirectionBackward& a, T* x, int64_t N, int64_t H) {
  if (!a.mask) return;
  const T* m = static_cast<const T*>(a.mask);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < H; ++j) x[n * H + j] *= m[n * a.mask_ld + j];
}

// dst rows (ld) = src [N, H] dense; a no-op for a null destination.
template <class T>
void copy_rows(const T* src, int64_t N, int64_t H, void* dst, int64_t ld) {
  if (!dst) return;
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(static_cast<T*>(dst) + n * ld, src + n * H, static_cast<size_t>(H) * sizeof(T));
}

template <class T>
void rnn_forward(const Problem& p, const DirectionForward& a);
template <class T>
void lstm_forward(const Problem& p, const DirectionForward& a);
template <class T>
void gru_forward(const Problem& p, const DirectionForward& a);
// A slice of the batch rows of one direction's BPTT: rows are independent until the
// weight gradients, so the threads of the pool claim slices and no thread waits for
// another inside the time loop. Slices start at multiples of kProductRows (so a row's
// products are tiled the same whatever the slicing) and sum dP per group of kProductRows
// rows (summed in group order afterwards): the bits do not depend on how many slices
// there are. The DirectionBackward pointers are offset to the slice's first row; time
// steps are still p.N rows apart. hm_all and side are [T, N, H] buffers of the whole
// batch (offset likewise) that the reduction after the loop reads.
template <class T>
struct BackwardSlice {
  int64_t rows;
  T* hm_all;  // h̃ (masked previous state) of every step, at input time
  T* side;    // GRU: u = r ⊙ h̃ (reset-before) or δq (reset-after)
  T* dP;      // LSTM: the peephole gradient [4H] of each kProductRows rows, zeroed
  // R packed for the per-step product δa R (null: use BLAS). GRU reset-before packs its
  // two products separately: packed_R = R[0:2H], packed_Ro = R[2H:3H].
  const T* packed_R;
  const T* packed_Ro;
  bool tiles;  // packed by FusedOps::pack_tiles (bfloat16 storage on AMX), not pack_columns
  T* db;       // the bias gradient [G*H] of each kProductRows rows, zeroed; null: none wanted
};

// Each row of dX'_s [rows, K] added to the bias-gradient sum of its group of kProductRows
// rows, while the step's rows are in cache (a pass over all of dX' afterwards reads it
// from memory once more).
template <class T>
void add_bias_rows(const BackwardSlice<T>& sl, const T* dx, int64_t ld, int64_t K) {
  if (!sl.db) return;
  for (int64_t n = 0; n < sl.rows; ++n) {
    T* __restrict sum = sl.db + n / kProductRows * K;
    const T* __restrict row = dx + n * ld;
    for (int64_t k = 0; k < K; ++k) sum[k] += row[k];
  }
}

// C[M, n] = A[M, K] B[K, n] (+= with accumulate): the packed fused kernel when the
// operand was packed (as AMX tiles with `tiles`), float16 / bfloat16 storage's bits as stored
// when B has no float32 copy (B null, B_bits: parallel_gemm_bits), else BLAS. Big enough products
// (a backward slice that runs alone, batch 1) are split into chunks of column panels that the
// pool's threads claim; inside a pool job the pool is busy and the caller runs every chunk. Each
// column's arithmetic is the same whichever chunk it is in.
template <class T>
void step_product(const T* A, int64_t lda, int64_t M, int64_t K, const T* B, const T* packed,
                  bool tiles, int64_t n, T* C, int64_t ldc, bool accumulate,
                  const uint16_t* B_bits = nullptr, bool bfloat16 = false) {
  if (packed) {
    const auto& ops = fused_kernels().ops<T>();
    const int64_t w = tiles ? kTileColumns : ops.width, panels = (n + w - 1) / w;
    // A panel's share of the packed operand, and the product of panels [b0, b0 + columns/w).
    const auto part = [&](int64_t b0, int64_t j0, int64_t columns) {
      if (tiles)
        ops.matmul_tiles(A, lda, M, K,
                         reinterpret_cast<const uint16_t*>(packed) + b0 * tiles_size(K, w), columns,
                         C + j0, ldc, accumulate);
      else
        ops.matmul(A, lda, M, K, packed + b0 * K * w, columns, C + j0, ldc, accumulate);
    };
    // About 64k multiply-adds a chunk or more: below that a claim costs more than it saves.
    // Tiles convert A at each call: without threads to share chunks (inside the backward's
    // slices), one call for every column converts it once, not once per chunk.
    const int64_t chunks = std::min<int64_t>({panels, 8, std::max<int64_t>(1, (M * K * n) >> 16)});
    if (chunks < 2 || (tiles && ThreadPool::instance().available() < 2)) return part(0, 0, n);
    ThreadPool::instance().parallel_for(chunks, [&](int64_t i) {
      const int64_t b0 = panels * i / chunks, b1 = panels * (i + 1) / chunks;
      const int64_t j0 = b0 * w, j1 = std::min(n, b1 * w);
      if (j1 > j0) part(b0, j0, j1 - j0);
    });
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (!B && B_bits)
      return parallel_gemm_bits(false, bfloat16, M, n, K, 1.0f, A, lda, B_bits, n,
                                accumulate ? 1.0f : 0.0f, C, ldc);
  }
  parallel_gemm<T>(false, false, M, n, K, T(1), A, lda, B, n, accumulate ? T(1) : T(0), C, ldc);
}

// A direction's R in float16 / bfloat16 storage's bits, `offset` elements on, where R has no
// float32 copy (else null).
inline const uint16_t* R_bits(const DirectionInputs& a, int64_t offset = 0) {
  return !a.R && a.R_narrow ? a.R_narrow + offset : nullptr;
}

// h̃ entering step s + 1 for dR: h_s = o ⊙ φ (φ null: h_s = o) of batch row n, masked,
// from the activations backward step s has computed anyway (the single-gate RNN and the
// LSTM; the first step's h̃ is stored by end_step).
template <class T>
void store_next_state(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl,
                      int64_t s, int64_t n, const T* __restrict o, const T* __restrict phi) {
  if (s + 1 >= p.T) return;
  const int64_t H = p.H;
  T* __restrict h = sl.hm_all + step_time(s + 1, p.T, a.flip_in) * p.N * H + n * H;
  if (phi)
    for (int64_t j = 0; j < H; ++j) h[j] = o[j] * phi[j];
  else
    std::memcpy(h, o, static_cast<size_t>(H) * sizeof(T));
  if (a.mask) {
    const T* __restrict m = static_cast<const T*>(a.mask) + n * a.mask_ld;
    for (int64_t j = 0; j < H; ++j) h[j] *= m[j];
  }
}

// The end of backward step s of the single-gate RNN and the LSTM: at the first step the
// h̃ it entered with (the initial state or zeros, masked), and dh of the step before =
// (dX'_s R) ⊙ mask, with dX'_s [rows, K].
template <class T>
void end_step(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl, int64_t s,
              const T* zeros, const T* dx, int64_t K, T* dh_next) {
  const int64_t N = sl.rows, H = p.H;
  if (s == 0) {
    const Rows<const T> hp =
        a.h0 ? Rows<const T>{static_cast<const T*>(a.h0), a.h0_ld} : Rows<const T>{zeros, H};
    store_masked(a, hp, N, H, sl.hm_all + step_time(0, p.T, a.flip_in) * p.N * H);
  }
  add_bias_rows(sl, dx, a.dxp_ld, K);
  step_product<T>(dx, a.dxp_ld, N, K, static_cast<const T*>(a.R), sl.packed_R, sl.tiles, H, dh_next,
                  H, false, R_bits(a), a.R_bfloat16);
  apply_mask(a, dh_next, N, H);
}

template <class T>
void rnn_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl);
template <class T>
void lstm_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl);
template <class T>
void gru_backward(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl);
// After every slice: dR (and GRU db2) as GEMMs / sums over all steps and rows.
template <class T>
void rnn_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all,
                         const T* side);
template <class T>
void lstm_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all,
                          const T* side);
template <class T>
void gru_backward_reduce(const Problem& p, const DirectionBackward& a, const T* hm_all,
                         const T* side);

// The entry points of one cell file (rnn.cpp, lstm.cpp, gru.cpp), instantiated there for T.
#define RNNCORE_INSTANTIATE_CELL(cell, T)                                                     \
  template void cell##_forward<T>(const Problem&, const DirectionForward&);                   \
  template void cell##_backward<T>(const Problem&, const DirectionBackward&,                  \
                                   const BackwardSlice<T>&);                                  \
  template void cell##_backward_reduce<T>(const Problem&, const DirectionBackward&, const T*, \
                                          const T*);

}  // namespace rnncore::cpu
