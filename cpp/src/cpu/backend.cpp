// The CPU backend: the contract's wrapper around the cells (projection, mask broadcast,
// directions, input gradients), the fused forward kernels (fused.hpp), BPTT in rnn.cpp,
// lstm.cpp and gru.cpp, BLAS for the big products, and work split into chunks fixed by the
// problem's shape that the pool's threads claim.
#include "core/backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "core/block_cache.hpp"
#include "cpu/aligned.hpp"
#include "cpu/fused.hpp"
#include "cpu/narrow.hpp"
#include "cpu/recurrence.hpp"
#include "cpu/thread_pool.hpp"

namespace rnncore::cpu {
namespace {

template <class T>
void project_impl(const Problem& p, const T* source, int64_t K, const T* W, const T* bias, T* xp) {
  const int64_t rows = p.T * p.N, cols = p.D * p.gh();
  if (bias)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(xp + r * cols, bias, static_cast<size_t>(cols) * sizeof(T));
  if (W) {
    parallel_gemm<T>(false, true, rows, cols, K, T(1), source, K, W, K, bias ? T(1) : T(0), xp,
                     cols);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      T* o = xp + r * cols;
      const T* s = source + r * cols;
      if (bias)
        for (int64_t j = 0; j < cols; ++j) o[j] += s[j];
      else
        std::memcpy(o, s, static_cast<size_t>(cols) * sizeof(T));
    }
  }
}

template <class T>
void run_direction(const Problem& p, const DirectionForward& a) {
  switch (p.op) {
    case detail::OpKind::Rnn: return rnn_forward<T>(p, a);
    case detail::OpKind::Lstm: return lstm_forward<T>(p, a);
    case detail::OpKind::Gru: return gru_forward<T>(p, a);
  }
}

template <class T>
void run_slice(const Problem& p, const DirectionBackward& a, const BackwardSlice<T>& sl) {
  switch (p.op) {
    case detail::OpKind::Rnn: return rnn_backward<T>(p, a, sl);
    case detail::OpKind::Lstm: return lstm_backward<T>(p, a, sl);
    case detail::OpKind::Gru: return gru_backward<T>(p, a, sl);
  }
}

template <class T>
void reduce(const Problem& p, const DirectionBackward& a, const T* hm_all, const T* side) {
  switch (p.op) {
    case detail::OpKind::Rnn: return rnn_backward_reduce<T>(p, a, hm_all, side);
    case detail::OpKind::Lstm: return lstm_backward_reduce<T>(p, a, hm_all, side);
    case detail::OpKind::Gru: return gru_backward_reduce<T>(p, a, hm_all, side);
  }
}

// `base` moved `elems` elements of `es` bytes on; null stays null.
template <class P>
P advance(P base, int64_t elems, int64_t es) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char, char>;
  return base ? static_cast<P>(static_cast<Byte*>(base) + elems * es) : nullptr;
}

// The direction's arguments moved to batch row n0 (every per-row array).
DirectionBackward from_row(const DirectionBackward& a, int64_t n0, int64_t es) {
  DirectionBackward v = a;
  const std::pair<const void**, int64_t> inputs[] = {{&v.z, a.z_ld},
                                                     {&v.h_fwd, a.h_fwd_ld},
                                                     {&v.c_fwd, a.c_fwd_ld},
                                                     {&v.h0, a.h0_ld},
                                                     {&v.c0, a.c0_ld},
                                                     {&v.mask, a.mask_ld},
                                                     {&v.dy, a.dy_ld},
                                                     {&v.dh_final, a.dh_final_ld},
                                                     {&v.dc_final, a.dc_final_ld},
                                                     {&v.dc_steps, a.dc_steps_ld}};
  const std::pair<void**, int64_t> outputs[] = {
      {&v.dxp, a.dxp_ld}, {&v.dh0, a.dh0_ld}, {&v.dc0, a.dc0_ld}};
  for (auto [ptr, ld] : inputs) *ptr = advance(*ptr, n0 * ld, es);
  for (auto [ptr, ld] : outputs) *ptr = advance(*ptr, n0 * ld, es);
  if (v.z_bits) v.z_bits += n0 * a.z_ld;
  if (v.c_bits) v.c_bits += n0 * a.c_fwd_ld;
  if (v.dy_bits) v.dy_bits += n0 * a.dy_ld;
  if (v.dxp_bits) v.dxp_bits += n0 * a.dxp_ld;
  return v;
}

// RNNCORE_CPU_PATH=blas keeps float32 on the BLAS-per-step path (tests compare the two).
bool blas_path_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("RNNCORE_CPU_PATH");
    return v && std::strcmp(v, "blas") == 0;
  }();
  return forced;
}

// BPTT with the batch rows of each direction split into slices that the pool's threads
// claim (no synchronisation inside the time loop), then the weight-gradient reductions
// over all rows. The packed kernels give every row the same bits however the rows are
// sliced (see BackwardSlice), so the slices follow the threads a call can have now: one
// per thread (a group of kProductRows rows or more each: even 8 rows a step are bound by
// their products, not by streaming R), or every row in one slice when the call runs alone.
// The BLAS path (RNNCORE_CPU_PATH=blas) slices by the shape alone, 8 rows a slice: BLAS
// may sum another way for another row count.
constexpr int64_t kUnpackedBackwardRows = 16;
bool packs_R(const Problem& p) {
  return !blas_path_forced() && p.N > 1 && p.T * p.N > kUnpackedBackwardRows;
}
template <class T>
void backward_impl(const Problem& p, const DirectionBackward* dirs, T* dbias) {
  ThreadPool& pool = ThreadPool::instance();
  const int64_t N = p.N, H = p.H, TNH = p.T * p.N * p.H;
  const int64_t groups = (N + kProductRows - 1) / kProductRows;
  // Not at batch 1, nor for a few rows in all: there the BLAS's products on R as stored are
  // the faster, without the packing (alternating runs, H=256 GRU / LSTM gradients: T=100 N=1
  // 0.88 / 0.90 of the time, T=1 N=1 48 / 59 us against 112 / 154, T=4 N=4 0.89 / 0.90; at
  // T=100 N=2 1.17 / 1.16, T=16 N=8 1.5 / 1.5 of it).
  const bool pack_R = packs_R(p);
  // (Without packed R the slices follow the shape alone, as on the BLAS path.)
  const int64_t threads = pack_R ? pool.available() : 8 * p.D;
  const int64_t per_dir = std::max<int64_t>(
      1, std::min<int64_t>(std::max<int64_t>(1, threads / p.D), N / kProductRows));
  const int64_t slices = per_dir * p.D;
  // h̃ of every step, written by the slices before the reductions read it.
  Tensor hm_buf = detail::cached_empty({p.D * TNH}, p.dtype);
  T* const hm_all = hm_buf.ptr<T>();
  // GRU: r ⊙ h̃ or δq of every step, as fully written.
  Tensor side_buf;
  if (p.op == detail::OpKind::Gru) side_buf = detail::cached_empty({p.D * TNH}, p.dtype);
  T* const side = side_buf.ptr<T>();  // null without one
  std::vector<T> dP(p.op == detail::OpKind::Lstm ? static_cast<size_t>(p.D * groups * 4 * H) : 0,
                    T(0));
  // The bias gradient, dX''s column sums, by the slices per group of kProductRows rows (each
  // in step order, last step first), summed in group order afterwards: bits that do not
  // depend on the slicing.
  const int64_t GH = p.gh();
  std::vector<T> db(dbias ? static_cast<size_t>(p.D * groups * GH) : 0, T(0));
  // R packed once per direction for the per-step products: for bfloat16 storage on AMX as
  // tiles (R's values are bfloat16), else as the fused kernels' column panels. A tile
  // product costs the same for 1 row as for 16: below a group of kProductRows rows the
  // float32 panels are faster (measured at N = 1: 8.6 against 7.1 ms, LSTM T=100 H=256).
  const auto& ops = fused_kernels().ops<T>();
  const bool tiles = p.storage == DType::BFloat16 && ops.matmul_tiles && N >= kProductRows;
  LineVector<T> packed[2], packed_o[2];
  const auto pack = [&](const T* B, int64_t K, LineVector<T>& out) {
    if (tiles) {  // (uint16_t tiles in a T buffer)
      out.resize(static_cast<size_t>((tiles_size(K, H) * 2 + sizeof(T) - 1) / sizeof(T)));
      ops.pack_tiles(B, K, H, reinterpret_cast<uint16_t*>(out.data()));
    } else {
      out.resize(static_cast<size_t>(packed_columns_size<T>(K, H)));
      ops.pack_columns(B, K, H, out.data());
    }
  };
  if (pack_R)
    for (int64_t d = 0; d < p.D; ++d) {
      const T* R = static_cast<const T*>(dirs[d].R);
      const bool split = p.op == detail::OpKind::Gru && !p.gru.reset_after;
      pack(R, split ? 2 * H : p.G * H, packed[d]);
      if (split) pack(R + 2 * H * H, H, packed_o[d]);
    }
  // A single slice runs on the caller, leaving the pool to its per-step products.
  pool.parallel_for(slices, [&](int64_t k) {
    const int64_t d = k / per_dir, part = k % per_dir;
    const int64_t n0 = groups * part / per_dir * kProductRows;
    const int64_t n1 = std::min(N, groups * (part + 1) / per_dir * kProductRows);
    BackwardSlice<T> sl{n1 - n0,
                        hm_all + d * TNH + n0 * H,
                        side ? side + d * TNH + n0 * H : nullptr,
                        dP.empty() ? nullptr : dP.data() + (d * groups + n0 / kProductRows) * 4 * H,
                        packed[d].empty() ? nullptr : packed[d].data(),
                        packed_o[d].empty() ? nullptr : packed_o[d].data(),
                        tiles,
                        db.empty() ? nullptr : db.data() + (d * groups + n0 / kProductRows) * GH};
    run_slice<T>(p, from_row(dirs[d], n0, sizeof(T)), sl);
  });
  if (dbias)
    for (int64_t d = 0; d < p.D; ++d)
      for (int64_t j = 0; j < GH; ++j) {
        T sum = T(0);
        for (int64_t g = 0; g < groups; ++g) sum += db[(d * groups + g) * GH + j];
        dbias[d * GH + j] = sum;
      }
  for (int64_t d = 0; d < p.D; ++d) {
    reduce<T>(p, dirs[d], hm_all + d * TNH, side ? side + d * TNH : nullptr);
    if (dirs[d].dP) {
      T* out = static_cast<T*>(dirs[d].dP);
      for (int64_t j = 0; j < 4 * H; ++j) {
        T sum = T(0);
        for (int64_t g = 0; g < groups; ++g) sum += dP[(d * groups + g) * 4 * H + j];
        out[j] = sum;
      }
    }
  }
}

// W_bits: float16 / bfloat16 storage's W as stored, where W has no float32 copy. dxp_bits:
// dX' as bfloat16 bits (dxp_bits_wanted; dxp unused).
template <class T>
void input_gradients_impl(const Problem& p, const T* dxp, const T* source, const T* W, T* dsource,
                          T* dW, const uint16_t* W_bits, const uint16_t* dxp_bits) {
  const int64_t rows = p.T * p.N, cols = p.D * p.gh(), I = p.I;
  if (dsource && (W || W_bits))
    gradient_gemm<T>(p, false, rows, I, cols, dxp, cols, W, I, dsource, I, W_bits, dxp_bits);
  if (dW) gradient_gemm<T>(p, true, cols, I, rows, dxp, cols, source, I, dW, I, nullptr, dxp_bits);
}

// Runs f(dirs[d]) for every direction, the two of a bidirectional layer claimed by two
// threads of the pool when the work pays for a thread (about a million multiply-adds).
template <class Dir, class F>
void for_each_direction(const Problem& p, const Dir* dirs, F&& f) {
  const bool threaded = p.D == 2 && p.T * p.N * p.G * p.H * p.H >= (int64_t(1) << 20);
  if (!threaded) {
    for (int64_t d = 0; d < p.D; ++d) f(dirs[d]);
    return;
  }
  ThreadPool::instance().parallel_for(p.D, [&](int64_t d) { f(dirs[d]); });
}

template <class Dir>
void run_all(const Problem& p, const Dir* dirs) {
  for_each_direction(p, dirs, [&p](const Dir& a) {
    if (p.dtype == DType::Float32)
      run_direction<float>(p, a);
    else
      run_direction<double>(p, a);
  });
}

template <class T>
void broadcast_mask(const detail::ForwardArrays& a, int64_t N, int64_t DH, T* out) {
  const T* src = static_cast<const T*>(a.mask);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < DH; ++j)
      out[n * DH + j] = src[(a.mask_rows == 1 ? 0 : n) * a.mask_cols + (a.mask_cols == 1 ? 0 : j)];
}

// The mask broadcast to [N, D*H] (the contract's first step for a mask), or nothing.
Tensor broadcast_mask(const Problem& p, const detail::ForwardArrays& a) {
  if (!p.has_mask) return Tensor();
  Tensor out = detail::cached_empty({p.N, p.dh()}, p.dtype);
  if (p.dtype == DType::Float32)
    broadcast_mask(a, p.N, p.dh(), out.ptr<float>());
  else
    broadcast_mask(a, p.N, p.dh(), out.ptr<double>());
  return out;
}

// W_bits: float16 or bfloat16 storage's W as the caller gave it (W then null), read as stored.
void project(const Problem& p, const void* source, const void* W, const void* bias, void* xp,
             const uint16_t* W_bits = nullptr, bool W_bfloat16 = false) {
  if (p.has_input_weight && !W) {
    const int64_t rows = p.T * p.N, cols = p.D * p.gh();
    float* out = static_cast<float*>(xp);
    for (int64_t r = 0; r < rows; ++r)
      if (bias)
        std::memcpy(out + r * cols, bias, static_cast<size_t>(cols) * sizeof(float));
      else
        std::fill(out + r * cols, out + (r + 1) * cols, 0.0f);
    // bfloat16 where the CPU multiplies pairs: by them (the source's values are bfloat16).
    const Dot dot = W_bfloat16 && fused_kernels().f32.gemm_nt_dot ? Dot::Rounded : Dot::No;
    if (p.I > 0)
      parallel_gemm_bits(true, W_bfloat16, rows, cols, p.I, 1.0f, static_cast<const float*>(source),
                         p.I, W_bits, p.I, 1.0f, out, cols, dot);
    return;
  }
  if (p.dtype == DType::Float32)
    project_impl(p, static_cast<const float*>(source), p.I, static_cast<const float*>(W),
                 static_cast<const float*>(bias), static_cast<float*>(xp));
  else
    project_impl(p, static_cast<const double*>(source), p.I, static_cast<const double*>(W),
                 static_cast<const double*>(bias), static_cast<double*>(xp));
}

void input_gradients(const Problem& p, const void* dxp, const void* source, const void* W,
                     void* dsource, void* dW, const uint16_t* W_bits, const uint16_t* dxp_bits) {
  if (p.dtype == DType::Float32)
    input_gradients_impl(p, static_cast<const float*>(dxp), static_cast<const float*>(source),
                         static_cast<const float*>(W), static_cast<float*>(dsource),
                         static_cast<float*>(dW), W_bits, dxp_bits);
  else
    input_gradients_impl(p, static_cast<const double*>(dxp), static_cast<const double*>(source),
                         static_cast<const double*>(W), static_cast<double*>(dsource),
                         static_cast<double*>(dW), nullptr, nullptr);
}

// Direction d's view of the layer's inputs: weights, initial state and cell, mask (already
// broadcast), peephole, and the time flips.
void direction_inputs(const Problem& p, const detail::ForwardArrays& in, const void* mask,
                      int64_t d, DirectionInputs& a) {
  const int64_t H = p.H, DH = p.dh(), es = dtype_size(p.dtype);
  const auto off = [es](const void* base, int64_t elems) { return advance(base, elems, es); };
  a.R = off(in.recurrent_weight, d * p.gh() * H);
  a.h0 = off(in.init_state, d * H);
  a.h0_ld = DH;
  a.c0 = off(in.init_cell, d * H);
  a.c0_ld = DH;
  a.mask = off(mask, d * H);
  a.mask_ld = DH;
  a.peephole = off(in.peephole, d * 4 * H);
  // Unidirectional reverse: read flipped, write in processing order. Backward half:
  // read flipped, write flipped back to input time.
  a.flip_in = d == 1 || p.reverse;
  a.flip_out = d == 1;
}

// The contract's wrapper ("How every forward operation is built"): project + bias,
// broadcast the mask, then per direction the core recurrence with its time flips, writing
// straight into the concatenated outputs.
// r16: the caller's 16-bit R (float16 or bfloat16 storage), for the fused forward's panels;
// projected: x' already computed (the bfloat16 projection by vdpbf16ps), or null.
// x_bits, W_bits: bfloat16 storage's source and W as the caller gave them, for an LSTM that
// projects each step's rows itself on pairs (then projected is null).
struct NarrowR {
  const uint16_t* bits = nullptr;
  DType dtype = DType::Float32;
  const void* projected = nullptr;
  const uint16_t* x_bits = nullptr;
  const uint16_t* W_bits = nullptr;
  // A bfloat16 LSTM on pairs: the caller's state, cell and training state outputs, which the
  // steps write in bfloat16 (those arrays of `in` are then null).
  uint16_t* y_bits = nullptr;
  uint16_t* c_bits = nullptr;
  uint16_t* z_bits = nullptr;
  bool widen = false;  // float16 bits packed into float32 panels (f16_widened_panels)
};

// Whether the fused forward projects each step's rows itself (from 16 batch rows, where a
// step's products are bound by arithmetic rather than by streaming W's panels from L2): x'
// (T·N·GH) is then never written and read back, OpenBLAS makes no copies of x and W, and
// the projection runs in the register tiles of the step's product with R (A/B, T=100 N=32
// H=256 inference, 2 threads: the LSTM 4 of 4 pairs faster, by 11-37%, N=64 3 of 3; the GRU
// 0.89-0.92 of the time at N = 16, 32 and 64). Not the single-gate RNN: one gate's panel
// makes a tile of 8 accumulators, slower than OpenBLAS's GEMM (1.07-1.08 of the time).
bool fuse_projection(const Problem& p) {
  // Up to 16 MiB of R's and W's float32 panels, which every step streams: beyond that (GRU
  // and LSTM at H = I = 1024) the steps stream W from memory too, 1.04-1.05 of the time of
  // one GEMM beforehand; at H = 512 (8 MiB) 0.86-0.97.
  const double panels = 4.0 * static_cast<double>(p.G * p.H) * static_cast<double>(p.H + p.I);
  return p.op != detail::OpKind::Rnn && p.dtype == DType::Float32 && p.has_input_weight &&
         p.I > 0 && p.N >= 2 * kProductRows && panels <= 16.0 * (1 << 20) && !blas_path_forced();
}

// Batch 1 (an LSTM or a reset-after GRU, from an R and W whose float32 panels fit 16 MiB):
// the fused forward fills x' itself, by blocks of 6 steps' rows and a chunk's panels in the
// step's register tiles, ahead of the steps that read them and in the time the pool's threads
// would otherwise wait for a step (Problem::lazy_projection), rather than by a GEMM
// beforehand. For any thread count (the bits of x' are the tiles' either way).
bool lazy_projection(const Problem& p) {
  const double panels = 4.0 * static_cast<double>(p.G * p.H) * static_cast<double>(p.H + p.I);
  const bool op =
      p.op == detail::OpKind::Lstm || (p.op == detail::OpKind::Gru && p.gru.reset_after);
  return op && p.dtype == DType::Float32 && p.N == 1 && p.has_input_weight && p.I > 0 &&
         panels <= 16.0 * (1 << 20) && !blas_path_forced();
}

// Batch 1, a few steps and an R that stays in L2 (float32 or float64 storage): each step's
// product with R is a matrix-vector product that the BLAS streams from R as stored, where
// the fused kernels first pack R (more work than the steps) and wake the pool's threads.
// N=1 H=256, called back to back / 200 us apart: LSTM T=1 38 / 41 us against 60 / 94
// (fused), T=4 120 / 123 against 204-214; GRU T=1 37 / 32 against 48 / 82. An R of 16 MiB
// (LSTM, H = 1024) that one thread streams from memory every step is the slower (T=4: 18.6
// against 4.1 ms).
// float16 and bfloat16 storage (off vdpbf16ps) take the same path on their widened arrays,
// so that they remain the float32 operation rounded once.
// A small batch (2 to 16 rows in all) takes it too where the products of a few rows read R
// as stored (FusedOps::gemm_nt): H=256 GRU / LSTM, alternating runs, T=1 N=8 62 / 83 us
// against 74 / 101 (fused), T=1 N=2 36 / 46 against 59 / 73, T=4 N=2 72 / 95 against 82 /
// 101; T=1 N=16 90 / 121 against 96 / 126, T=4 N=4 91 / 122 against 98 / 122.
constexpr int64_t kPerStepBlasSteps = 4, kPerStepBlasBytes = int64_t(1) << 20, kPerStepRows = 16;
bool per_step_blas(const Problem& p) {
  const int64_t r_bytes = p.G * p.H * p.H * dtype_size(p.dtype);
  const bool rows = p.N == 1 || (p.dtype == DType::Float32 && fused_kernels().f32.gemm_nt &&
                                 p.T * p.N <= kPerStepRows);
  return rows && p.T <= kPerStepBlasSteps && r_bytes <= kPerStepBlasBytes;
}

// fused: the fused kernels, else each step by BLAS calls (run_all).
void forward_op(const Problem& problem, const detail::ForwardArrays& in, NarrowR r16, bool fused) {
  Problem p = problem;
  p.fused_projection =
      fused && (r16.x_bits || (fuse_projection(p) && !r16.projected)) && !(r16.x_bits && p.N == 1);
  p.lazy_projection = fused && !p.fused_projection && !r16.projected && lazy_projection(p);
  const int64_t H = p.H, D = p.D, DH = p.dh(), dgh = D * p.gh();
  const void* xp = in.source;
  Tensor xbuf;
  if (p.fused_projection) {
    xp = nullptr;
  } else if (p.lazy_projection) {
    xbuf = detail::cached_empty({p.T, p.N, dgh}, p.dtype);  // (filled by the steps' threads)
    xp = xbuf.data();
  } else if (r16.projected) {
    xp = r16.projected;
  } else if (p.has_input_weight || p.has_bias) {
    xbuf = detail::cached_empty({p.T, p.N, dgh}, p.dtype);
    project(p, in.source, in.input_weight, in.bias, xbuf.data(), r16.W_bits,
            r16.dtype == DType::BFloat16);
    xp = xbuf.data();
  }
  Tensor mask = broadcast_mask(p, in);
  const int64_t es = dtype_size(p.dtype);
  const auto off = [es](auto base, int64_t elems) { return advance(base, elems, es); };
  DirectionForward dirs[2];
  for (int64_t d = 0; d < D; ++d) {
    DirectionForward& a = dirs[d];
    direction_inputs(p, in, mask.data(), d, a);
    a.R_narrow = r16.bits ? r16.bits + d * p.gh() * H : nullptr;
    a.R_bfloat16 = r16.dtype == DType::BFloat16;
    a.R_widen = r16.widen && a.R_narrow;
    a.xp = off(xp, d * p.gh());
    a.xp_ld = dgh;
    if (p.fused_projection || p.lazy_projection) {
      a.x = in.source;
      a.x_bits = r16.x_bits;
      a.x_ld = p.I;
      a.W = off(in.input_weight, d * p.gh() * p.I);
      a.W_bits = r16.W_bits ? r16.W_bits + d * p.gh() * p.I : nullptr;
      a.bias = off(in.bias, d * p.gh());
    }
    a.b2 = p.gru.reset_after ? off(in.secondary_bias, d * H) : nullptr;
    a.y = off(in.state, d * H);
    a.y_ld = DH;
    a.c = off(in.cell, d * H);
    a.c_ld = DH;
    a.y_bits = r16.y_bits ? r16.y_bits + d * H : nullptr;
    a.c_bits = r16.c_bits ? r16.c_bits + d * H : nullptr;
    a.z_bits = r16.z_bits ? r16.z_bits + d * p.ZG * H : nullptr;
    a.z = off(in.z_state, d * p.ZG * H);
    a.z_ld = D * p.ZG * H;
  }
  if (fused)
    fused_forward(p, dirs);
  else
    run_all(p, dirs);
}

void forward_op(const Problem& p, const detail::ForwardArrays& in) {
  forward_op(p, in, NarrowR{}, !blas_path_forced() && !per_step_blas(p));
}

// bfloat16 storage's arrays as the caller gave them, for an LSTM whose steps widen their rows
// themselves (DirectionBackward::z_bits, c_bits, dy_bits; the float32 arrays then null).
struct RowBits {
  const uint16_t* z = nullptr;   // training state
  const uint16_t* c = nullptr;   // the forward's cell output
  const uint16_t* dy = nullptr;  // source_gradient
};

// BPTT per direction into dX', then the input-side gradients from dX'. R_bits, W_bits:
// float16 / bfloat16 storage's R and W as the caller gave them, read as stored where in.fwd
// has no float32 copy.
void backward_op(const Problem& p, const detail::BackwardArrays& in, RowBits bits = {},
                 const uint16_t* R_bits = nullptr, const uint16_t* W_bits = nullptr) {
  const int64_t H = p.H, D = p.D, DH = p.dh(), GH = p.gh(), dgh = D * GH;
  Tensor mask = broadcast_mask(p, in.fwd);
  // dX' of every step; without an input weight it is the source gradient itself. Kept as
  // bfloat16 bits (dxp_bits_wanted), dxp holds one step's rows.
  Tensor dxbuf, dxbits;
  void* dxp = in.dsource;
  uint16_t* dxp_bits = nullptr;
  if (dxp_bits_wanted(p)) {
    dxbits = detail::cached_empty({p.T, p.N, dgh}, DType::BFloat16);
    dxp_bits = static_cast<uint16_t*>(dxbits.data());
    dxbuf = detail::cached_empty({p.N, dgh}, p.dtype);
    dxp = dxbuf.data();
  } else if (p.has_input_weight) {
    dxbuf = detail::cached_empty({p.T, p.N, dgh}, p.dtype);
    dxp = dxbuf.data();
  }
  const int64_t es = dtype_size(p.dtype);
  const auto off = [es](auto base, int64_t elems) { return advance(base, elems, es); };
  const bool joint = in.dW && joint_input_gradient(p);  // dW with dR, per direction
  DirectionBackward dirs[2];
  for (int64_t d = 0; d < D; ++d) {
    DirectionBackward& a = dirs[d];
    direction_inputs(p, in.fwd, mask.data(), d, a);
    a.R_narrow = R_bits ? R_bits + d * GH * H : nullptr;
    a.R_bfloat16 = p.storage == DType::BFloat16;
    // A per-row array of this direction: its columns of [.., N, D*H], row stride D*H.
    const auto rows = [&](auto base, int64_t& ld) {
      ld = DH;
      return off(base, d * H);
    };
    a.z = off(in.z_state, d * p.ZG * H);
    a.z_ld = D * p.ZG * H;
    a.z_bits = bits.z ? bits.z + d * p.ZG * H : nullptr;
    a.c_bits = bits.c ? bits.c + d * H : nullptr;
    a.dy_bits = bits.dy ? bits.dy + d * H : nullptr;
    a.h_fwd = rows(in.h_fwd, a.h_fwd_ld);
    a.c_fwd = rows(in.c_fwd, a.c_fwd_ld);
    a.dy = rows(in.dy, a.dy_ld);
    a.dh_final = rows(in.dh_final, a.dh_final_ld);
    a.dc_final = rows(in.dc_final, a.dc_final_ld);
    a.dc_steps = rows(in.dc_steps, a.dc_steps_ld);
    a.dxp = off(dxp, d * GH);
    a.dxp_ld = dgh;
    a.dxp_bits = dxp_bits ? dxp_bits + d * GH : nullptr;
    a.dR = off(in.dR, d * GH * H);
    a.source = joint ? in.fwd.source : nullptr;
    a.dW = joint ? off(in.dW, d * GH * p.I) : nullptr;
    a.dP = off(in.dP, d * 4 * H);
    a.db2 = p.gru.reset_after ? off(in.db2, d * H) : nullptr;
    a.dh0 = rows(in.dh0, a.dh0_ld);
    a.dc0 = rows(in.dc0, a.dc0_ld);
  }
  if (p.dtype == DType::Float32)
    backward_impl<float>(p, dirs, static_cast<float*>(in.dbias));
  else
    backward_impl<double>(p, dirs, static_cast<double*>(in.dbias));
  input_gradients(p, dxp, in.fwd.source, in.fwd.input_weight,
                  p.has_input_weight ? in.dsource : nullptr, joint ? nullptr : in.dW, W_bits,
                  dxp_bits);
}

// ---- float16 and bfloat16 storage (contract: storage types) ------------------------------
// Every 16-bit array is widened to float32, the float32 op runs, and its outputs are
// narrowed into the caller's arrays: the arithmetic, and the state carried from step to
// step, are float32.
bool narrow_storage(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

class Widened {
 public:
  explicit Widened(DType storage) : bfloat16_(storage == DType::BFloat16) {}
  // A float32 copy of n 16-bit elements at p (null stays null).
  const void* in(const void* p, int64_t n) {
    if (!p) return nullptr;
    Tensor t = detail::cached_empty({n}, DType::Float32);
    if (bfloat16_)
      widen_bfloat16(static_cast<const uint16_t*>(p), t.ptr<float>(), n);
    else
      widen_half(static_cast<const uint16_t*>(p), t.ptr<float>(), n);
    keep_.push_back(std::move(t));
    return keep_.back().data();
  }
  // A float32 array of n elements narrowed into p by finish() (null stays null).
  void* out(void* p, int64_t n) {
    if (!p) return nullptr;
    keep_.push_back(detail::cached_empty({n}, DType::Float32));
    outputs_.push_back({p, keep_.size() - 1, n});
    return keep_.back().data();
  }
  void finish() {
    for (const Output& o : outputs_) {
      const float* src = keep_[o.tensor].ptr<float>();
      if (bfloat16_)
        narrow_bfloat16(src, static_cast<uint16_t*>(o.dst), o.n);
      else
        narrow_half(src, static_cast<uint16_t*>(o.dst), o.n);
    }
  }

 private:
  struct Output {
    void* dst;
    size_t tensor;
    int64_t n;
  };
  bool bfloat16_;
  std::deque<Tensor> keep_;
  std::vector<Output> outputs_;
};

// Element counts of the arrays of a problem (docs/semantics.md, "Shapes").
struct Sizes {
  int64_t source, W, R, bias, nh, seq, z, peephole, b2;
  explicit Sizes(const Problem& p)
      : source(p.T * p.N * (p.has_input_weight ? p.I : p.D * p.gh())),
        W(p.D * p.gh() * p.I),
        R(p.D * p.gh() * p.H),
        bias(p.D * p.gh()),
        nh(p.N * p.dh()),
        seq(p.T * p.N * p.dh()),
        z(p.T * p.N * p.D * p.ZG * p.H),
        peephole(p.D * 4 * p.H),
        b2(p.dh()) {}
};

// skip_R: the fused forward reads R in 16 bits; skip_projection: x' is computed from the
// 16-bit source and input weight; skip_W: from the 16-bit input weight. Arrays skipped stay
// null.
detail::ForwardArrays widen_inputs(const Problem& p, const detail::ForwardArrays& a, Widened& w,
                                   bool skip_R = false, bool skip_projection = false,
                                   bool skip_W = false) {
  const Sizes n(p);
  detail::ForwardArrays f = a;
  f.source = skip_projection ? nullptr : w.in(a.source, n.source);
  f.input_weight = skip_projection || skip_W ? nullptr : w.in(a.input_weight, n.W);
  f.recurrent_weight = skip_R ? nullptr : w.in(a.recurrent_weight, n.R);
  f.bias = w.in(a.bias, n.bias);
  f.init_state = w.in(a.init_state, n.nh);
  f.init_cell = w.in(a.init_cell, n.nh);
  f.mask = w.in(a.mask, a.mask_rows * a.mask_cols);
  f.peephole = w.in(a.peephole, n.peephole);
  f.secondary_bias = w.in(a.secondary_bias, n.b2);
  return f;
}

// x' = source · Wᵀ + bias of bfloat16 storage by vdpbf16ps, or AMX tiles: the products of
// two bfloat16 are exact in float32 and the sums float32, as in the float32 GEMM on the
// widened arrays (bias: widened).
Tensor project_pairs(const Problem& p, const detail::ForwardArrays& a, const void* bias) {
  const FusedOps<float>& k = fused_kernels().f32;
  const int64_t M = p.T * p.N, K = p.I, K2 = (K + 1) / 2, n = p.D * p.gh();
  const int64_t GW = k.pair_columns, nq = (n + GW - 1) / GW;  // groups of columns
  Tensor out = detail::cached_empty({p.T, p.N, n}, DType::Float32);
  const uint16_t* x = static_cast<const uint16_t*>(a.source);
  // With AMX, tiles from 32 rows (a tile product costs the same for fewer rows).
  if (k.project_tiles && M >= 32) {
    k.project_tiles(M, n, K, x, static_cast<const uint16_t*>(a.input_weight),
                    static_cast<const float*>(bias), out.ptr<float>());
    return out;
  }
  std::vector<uint16_t> padded;  // an odd K: rows padded with a zero to whole pairs
  if (K % 2) {
    padded.assign(static_cast<size_t>(M * K2 * 2), 0);
    for (int64_t r = 0; r < M; ++r)
      std::memcpy(padded.data() + r * K2 * 2, x + r * K, static_cast<size_t>(K) * 2);
    x = padded.data();
  }
  // (pack_pairs_rows writes every element, padding included: no zero-fill pass first)
  std::unique_ptr<uint16_t[]> packed(new uint16_t[static_cast<size_t>(nq * K2 * 2 * GW)]);
  ThreadPool& pool = ThreadPool::instance();
  const uint16_t* Wb = static_cast<const uint16_t*>(a.input_weight);
  pool.parallel_for(nq, [&](int64_t q) { k.pack_pairs_rows(Wb, n, K, packed.get(), q, q + 1); });
  // Tiles of 48 rows and 4 groups (256 columns): a tile's rows stay in L1 across its groups.
  constexpr int64_t RB = 48, CB = 4;
  const int64_t rb = (M + RB - 1) / RB, cb = (nq + CB - 1) / CB;
  float* C = out.ptr<float>();
  const float* bf = static_cast<const float*>(bias);
  pool.parallel_for(rb * cb, [&](int64_t t) {
    const int64_t r0 = t / cb * RB, q0 = t % cb * CB, m = std::min(RB, M - r0);
    std::vector<float> scratch(static_cast<size_t>(RB * GW));
    k.gemm_pairs(x + r0 * K2 * 2, K2, m, K2, packed.get(), n, q0, std::min(nq, q0 + CB), bf,
                 C + r0 * n, n, scratch.data());
  });
  return out;
}

// Batch rows from which a float16 forward's fused steps multiply float32 panels of R widened
// once per call (forward_narrow). Xeon with AMX, 2 threads, H = 256, alternating processes:
// LSTM N=32 12.5-12.8 against 13.0-13.4 ms (narrow panels; float32 12.1), N=16 6.2-6.5
// against 6.8-6.9, GRU N=4 1.70-1.71 against 1.79-1.82; at N=2 the narrow panels were the
// faster (LSTM 1.40-1.43 against 1.46-1.51), and at N=1 level.
constexpr int64_t kWideRows = 4;

// The bytes of L2 a core has (Linux's sysconf; 256 KiB where it does not say).
int64_t l2_bytes() {
#if defined(_SC_LEVEL2_CACHE_SIZE)
  const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (v > 0) return v;
#endif
  return 256 * 1024;
}

// Whether a float16 forward of few rows packs R into float32 panels widened once (rather
// than 16-bit panels that every step's tiles widen): on AVX2 (8 lanes) where vcvtph2ps
// costs more than streaming twice the bytes from L2 (slow_f16_conversion), while the machine's
// share of them per core fits its L2 (Zen 2, T=100 N=1 H=256, 2 threads, alternating runs:
// GRU 1.00-1.02 -> 0.94-0.98 ms, LSTM 1.28-1.32 -> 1.23-1.30 ms). The float32 panels run the
// float32 op's kernels: its bits, rounded once. RNNCORE_F16_R=narrow|wide forces the choice.
bool f16_widened_panels(const Problem& p, const FusedOps<float>& k) {
  static const std::string forced = [] {
    const char* v = std::getenv("RNNCORE_F16_R");
    return std::string(v ? v : "");
  }();
  if (forced == "narrow") return false;
  if (forced == "wide") return true;
  // The machine's cores, not the call's threads: a choice that set_num_threads changed would
  // change the bits where the two panels' kernels round differently (their epilogues).
  const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t bytes = p.D * p.G * p.H * p.H * 4;
  return k.width == 8 && slow_f16_conversion() &&
         bytes <= l2_bytes() * std::min(threads, p.D * ((p.H + 7) / 8));
}

void forward_narrow(const Problem& p, const detail::ForwardArrays& a) {
  Problem q = p;
  q.dtype = DType::Float32;
  const Sizes n(p);
  Widened w(p.dtype);
  const FusedOps<float>& k = fused_kernels().f32;
  // bfloat16 on vdpbf16ps multiplies pairs, its own arithmetic: the fused kernels always.
  const bool dot = p.dtype == DType::BFloat16 && k.gemm_pairs;
  // A few rows in all (per_step_blas): the steps' products and the projection read R's and
  // W's 16 bits as stored (no float32 copies of them made first: 35-50% of a T=1 N=1 call),
  // where the float32 operation runs the same kernel on its arrays (own_gemm_nt), so that
  // the outputs remain its own rounded once; bfloat16 on vdpbf16ps always, in the pairs'
  // arithmetic (StepProduct).
  const bool steps = !blas_path_forced() && per_step_blas(q) && gemm_bits_available();
  const int64_t R_cols = p.op == detail::OpKind::Gru && !p.gru.reset_after ? p.H : p.gh();
  const bool R_stored = steps && (dot || own_gemm_nt(p.N, R_cols, p.H));
  const bool W_stored =
      steps && p.has_input_weight && p.I > 0 && (dot || own_gemm_nt(p.T * p.N, p.D * p.gh(), p.I));
  const bool fused = !blas_path_forced() && !steps && (dot || !per_step_blas(q));
  // An LSTM that projects its steps' rows itself reads the bfloat16 source and W in place
  // (fuse_projection; the source's rows as pairs: an even I).
  // So does an LSTM or reset-after GRU at batch 1 that fills x' itself (lazy_projection),
  // except on AMX, whose projection of all T rows in full tiles beforehand (project_tiles) is
  // the faster (T=100 N=1 H=256 LSTM, medians of least times in 8 alternating processes:
  // 0.536 ms against 0.566 with 6-row blocks made in the threads' waits, 0.759 carried).
  const bool lazy = lazy_projection(q) && !k.project_tiles;
  const bool fused_pairs = fused && p.dtype == DType::BFloat16 && k.gemm_pairs && k.narrow_panels &&
                           ((p.op == detail::OpKind::Lstm && fuse_projection(q)) || lazy) &&
                           p.I % 2 == 0;
  const bool pairs = !fused_pairs && fused && p.dtype == DType::BFloat16 && k.gemm_pairs &&
                     p.has_input_weight && p.I > 0 && p.T * p.N > 0;
  // float16 filling x' itself at batch 1 packs W's float16 rows as they are (no float32 copy
  // of W made first: 7% of T=100 N=1 H=256 LSTM inference); its tiles widen them. So does
  // bfloat16 off vdpbf16ps (AVX2: gate pairs, as R's panels).
  const bool W_half = fused && k.narrow_panels && lazy_projection(q) &&
                      (p.dtype == DType::Float16 || (p.dtype == DType::BFloat16 && !k.gemm_pairs));
  // From kWideRows batch rows (off vdpbf16ps) R is widened once, into float32 panels, rather
  // than by every step's tiles: there a step's products are bound by arithmetic, not by R's
  // bytes, and the conversions compete with the FMAs (on Intel vcvtph2ps issues on the FMA
  // ports). The same float32 arithmetic on the same values: the same bits.
  const bool wide = fused && !dot && p.N >= kWideRows;
  const bool widened = fused && !dot && !wide && p.dtype == DType::Float16 && k.narrow_panels &&
                       f16_widened_panels(p, k);
  detail::ForwardArrays f = widen_inputs(p, a, w, (fused && k.narrow_panels && !wide) || R_stored,
                                         pairs || fused_pairs, W_half || W_stored);
  Tensor projected;
  if (pairs) projected = project_pairs(p, a, f.bias);
  // An LSTM on pairs writes its outputs in bfloat16 itself: no float32 state, cell and
  // training state written and narrowed after (5% of T=100 N=32 H=256 inference, 18% of
  // its training forward), and in inference no step converting h̃ to pairs (4%): the
  // previous step's rows are the pairs (an even H).
  const bool bits_out = fused && p.dtype == DType::BFloat16 && k.gemm_pairs && k.narrow_panels &&
                        p.op == detail::OpKind::Lstm && p.H % 2 == 0;
  f.state = bits_out ? nullptr : w.out(a.state, n.seq);
  f.cell = bits_out ? nullptr : w.out(a.cell, n.seq);
  f.z_state = bits_out ? nullptr : w.out(a.z_state, n.z);
  NarrowR r16{
      wide ? nullptr : static_cast<const uint16_t*>(a.recurrent_weight), p.dtype,
      pairs ? projected.data() : nullptr,
      fused_pairs ? static_cast<const uint16_t*>(a.source) : nullptr,
      fused_pairs || W_half || W_stored ? static_cast<const uint16_t*>(a.input_weight) : nullptr};
  r16.widen = widened;
  if (bits_out) {
    r16.y_bits = static_cast<uint16_t*>(a.state);
    r16.c_bits = static_cast<uint16_t*>(a.cell);
    r16.z_bits = static_cast<uint16_t*>(a.z_state);
  }
  forward_op(q, f, r16, fused);
  w.finish();
}

void backward_narrow(const Problem& p, const detail::BackwardArrays& a) {
  Problem q = p;
  q.dtype = DType::Float32;
  q.storage = p.dtype;
  const Sizes n(p);
  Widened w(p.dtype);
  detail::BackwardArrays b = a;
  // A few rows (no packed R: backward_impl), or a few rows in all (the source's gradient): the
  // products read R's and W's 16 bits as stored, where the float32 operation runs the same
  // kernel on its arrays (own_gemm_nn), so that the outputs remain its own rounded once (no
  // float32 copies of R and W made first: a fifth of a T=1 N=1 H=256 call).
  const bool bits = !blas_path_forced() && gemm_bits_available();
  const int64_t R_rows = p.op == detail::OpKind::Lstm                       ? 4 * p.H
                         : p.op == detail::OpKind::Gru && p.gru.reset_after ? 3 * p.H
                                                                            : p.H;
  const bool R_stored = bits && !packs_R(p) && own_gemm_nn(1, p.H, R_rows);
  const bool W_stored =
      bits && p.has_input_weight && p.I > 0 && own_gemm_nn(p.T * p.N, p.I, p.D * p.gh());
  b.fwd = widen_inputs(p, a.fwd, w, R_stored, false, W_stored);
  // The LSTM's steps widen the rows of the training state, the cell output and dy as they
  // read them (4-5% of its gradient op at T=100 N=32 H=256 went to widening all of the
  // training state first; the cell output and dy then took 2.4-4% of the samples).
  const bool z_rows = p.dtype == DType::BFloat16 && p.op == detail::OpKind::Lstm;
  b.z_state = z_rows ? nullptr : w.in(a.z_state, n.z);
  // Only the GRU's steps read the forward's state (the LSTM's and the single-gate RNN's
  // recompute h̃ from their gates): 0.8M elements widened for nothing at T=100 N=32 H=256.
  b.h_fwd = p.op == detail::OpKind::Gru ? w.in(a.h_fwd, n.seq) : nullptr;
  b.c_fwd = z_rows ? nullptr : w.in(a.c_fwd, n.seq);
  b.dy = z_rows ? nullptr : w.in(a.dy, n.seq);
  b.dh_final = w.in(a.dh_final, n.nh);
  b.dc_final = w.in(a.dc_final, n.nh);
  b.dc_steps = w.in(a.dc_steps, n.seq);
  b.dsource = w.out(a.dsource, n.source);
  b.dR = w.out(a.dR, n.R);
  b.dW = w.out(a.dW, n.W);
  b.dbias = w.out(a.dbias, n.bias);
  b.dh0 = w.out(a.dh0, n.nh);
  b.dc0 = w.out(a.dc0, n.nh);
  b.dP = w.out(a.dP, n.peephole);
  b.db2 = w.out(a.db2, n.b2);
  RowBits rows;
  if (z_rows)
    rows = {static_cast<const uint16_t*>(a.z_state), static_cast<const uint16_t*>(a.c_fwd),
            static_cast<const uint16_t*>(a.dy)};
  backward_op(q, b, rows, R_stored ? static_cast<const uint16_t*>(a.fwd.recurrent_weight) : nullptr,
              W_stored ? static_cast<const uint16_t*>(a.fwd.input_weight) : nullptr);
  w.finish();
}

class CpuBackend final : public detail::Backend {
 public:
  CpuBackend() { claim_blas_threads(); }
  const char* name() const override { return "cpu"; }
  Tensor allocate(const Shape& shape, DType dtype) override {
    return detail::cached_empty(shape, dtype);
  }
  Tensor allocate_zeroed(const Shape& shape, DType dtype) override {
    return Tensor::zeros(shape, dtype);  // fresh pages the OS zeroed: no pass over them
  }
  const char* dtypes() const override {
    return "float32 and float64, and float16 and bfloat16 storage";
  }
  bool computes(DType d) const override {
    return d == DType::Float32 || d == DType::Float64 || narrow_storage(d);
  }
  void forward(const Problem& p, const detail::ForwardArrays& a) override {
    if (narrow_storage(p.dtype)) return forward_narrow(p, a);
    forward_op(p, a);
  }
  void backward(const Problem& p, const detail::BackwardArrays& a) override {
    if (narrow_storage(p.dtype)) return backward_narrow(p, a);
    backward_op(p, a);
  }
};

}  // namespace
}  // namespace rnncore::cpu

namespace rnncore::detail {

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace rnncore::detail
