// The GEMMs and reductions around the recurrence (contract: "How every forward operation is
// built", "Gradient operations"): x' = x W^T + b for every time step at once, and after the
// gradient time loop dsource = dX' W, dW = dX'^T x, dR = delta^T h~, the bias, secondary-bias
// and peephole gradients as column sums, plus R^T for the backward step kernels.
//
// gemm: a threadgroup of 256 threads (8 simdgroups) computes a 64 x 64 tile of C; K moves
// through threadgroup memory 16 at a time, staged as float along whichever index is
// contiguous (operands are strided, so transposes cost nothing but coalescing) and
// zero-padded past the edges. Each simdgroup multiplies 8 x 8 simdgroup matrices
// (simdgroup_float8x8) for a 32 x 16 block of the tile: 4 x 2 accumulators, each A fragment
// used twice and each B fragment four times per 8-wide step of K. The tile then goes
// through threadgroup memory (16 KiB) so that the edges, the bias and the output type are
// handled per element.
// Input projection, T=100, N=32, I=256, 3H=768: 1.26 GFLOP.
#include "common.h"

template <typename TA, typename TB, typename TC>
kernel void gemm(device const TA* a [[buffer(GB_A)]],
                 device const TB* b [[buffer(GB_B), function_constant(has_weight)]],
                 device const TB* bias [[buffer(GB_BIAS), function_constant(has_bias)]],
                 device TC* c [[buffer(GB_C)]], constant GemmParams& p [[buffer(GB_PARAMS)]],
                 THREADGROUP_BUFFER(float, tiles, 0), uint3 tgid [[threadgroup_position_in_grid]],
                 uint tid [[thread_index_in_threadgroup]],
                 uint sg [[simdgroup_index_in_threadgroup]]) {
  const int m0 = int(tgid.y) * GEMM_TILE_M, n0 = int(tgid.x) * GEMM_TILE_N;
  const int splits = max(p.splits, 1), batch = int(tgid.z) / splits, split = int(tgid.z) % splits;
  const int k_begin = splits > 1 ? split * p.k_per : 0;
  const int k_end = splits > 1 ? min(p.K, k_begin + p.k_per) : p.K;
  a += batch * p.a_zs;
  c += batch * p.c_zs + split * p.c_ss;
  threadgroup float* cs = tiles;  // [TILE_M][TILE_N], after the K loop

  if (has_weight) {
    device const TB* bz = b + batch * p.b_zs;
    threadgroup float* as = tiles;                               // [TILE_K][TILE_M]
    threadgroup float* bs = tiles + GEMM_TILE_K * GEMM_TILE_M;   // [TILE_K][TILE_N]
    const int sm = 32 * (int(sg) / 4), sn = 16 * (int(sg) % 4);  // this simdgroup's block
    simdgroup_float8x8 acc[4][2];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    // Stage along the contiguous index so that neighbouring threads read neighbouring words.
    const bool a_k_major = p.a_cs == 1, b_k_major = p.b_rs == 1;
    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_TILE_K) {
      for (int e = int(tid); e < GEMM_TILE_M * GEMM_TILE_K; e += GEMM_THREADS) {
        const int ar = a_k_major ? e / GEMM_TILE_K : e % GEMM_TILE_M;
        const int ak = a_k_major ? e % GEMM_TILE_K : e / GEMM_TILE_M;
        const int m = m0 + ar, ka = k0 + ak;
        as[ak * GEMM_TILE_M + ar] =
            m < p.M && ka < k_end ? float(a[m * p.a_rs + ka * p.a_cs]) : 0.0f;
        const int bn = b_k_major ? e / GEMM_TILE_K : e % GEMM_TILE_N;
        const int bk = b_k_major ? e % GEMM_TILE_K : e / GEMM_TILE_N;
        const int n = n0 + bn, kb = k0 + bk;
        bs[bk * GEMM_TILE_N + bn] =
            n < p.N && kb < k_end ? float(bz[kb * p.b_rs + n * p.b_cs]) : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int k = 0; k < GEMM_TILE_K; k += 8) {
        simdgroup_float8x8 af[4], bf[2];
        // as is [k][m]: its transpose is A's (m, k) fragment.
        for (int i = 0; i < 4; ++i)
          simdgroup_load(af[i], as + k * GEMM_TILE_M + sm + 8 * i, GEMM_TILE_M, 0, true);
        for (int j = 0; j < 2; ++j)
          simdgroup_load(bf[j], bs + k * GEMM_TILE_N + sn + 8 * j, GEMM_TILE_N);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 2; ++j)
            simdgroup_multiply_accumulate(acc[i][j], af[i], bf[j], acc[i][j]);
      }
      // The next iteration (or the tile below) overwrites what other simdgroups may still read.
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j)
        simdgroup_store(acc[i][j], cs + (sm + 8 * i) * GEMM_TILE_N + sn + 8 * j, GEMM_TILE_N);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  for (int e = int(tid); e < GEMM_TILE_M * GEMM_TILE_N; e += GEMM_THREADS) {
    const int m = m0 + e / GEMM_TILE_N, n = n0 + e % GEMM_TILE_N;
    if (m >= p.M || n >= p.N) continue;
    float v = has_weight ? cs[e] : float(a[m * p.a_rs + n * p.a_cs]);
    if (has_bias) v += float(bias[n]);
    c[m * p.ldc + n] = TC(v);
  }
}

// gemm_<A><B><C>: the element types of A, B (and bias) and C, f = float, h = half,
// b = bfloat. float16 storage uses hhh (the input projection), fhh (dsource, dW: float32 dX'
// times half inputs) and ffh (dR from float32 deltas and states); bfloat16 the same with b.
INSTANTIATE_KERNEL(gemm_fff, gemm<float, float, float>)
INSTANTIATE_KERNEL(gemm_hhh, gemm<half, half, half>)
INSTANTIATE_KERNEL(gemm_fhh, gemm<float, half, half>)
INSTANTIATE_KERNEL(gemm_ffh, gemm<float, float, half>)
INSTANTIATE_KERNEL(gemm_fhf, gemm<float, half, float>)  // float16 dW's split-K partials
INSTANTIATE_BFLOAT_KERNEL(gemm_bbb, gemm<bfloat, bfloat, bfloat>)
INSTANTIATE_BFLOAT_KERNEL(gemm_fbb, gemm<float, bfloat, bfloat>)
INSTANTIATE_BFLOAT_KERNEL(gemm_ffb, gemm<float, float, bfloat>)
INSTANTIATE_BFLOAT_KERNEL(gemm_fbf, gemm<float, bfloat, float>)

// One thread per column, the rows of one block (grid y) in order: neighbouring threads read
// neighbouring words. Bias gradient of T=100, N=32, 3H=768: 2.5 M adds over 9.8 MB, in 25
// row blocks (75 threadgroups, not 3) and a second pass over the 25 partial rows. Sums
// float32 intermediates (dX', R's deltas, previous cells) into an output of type T.
template <typename T>
kernel void column_sums(device const float* a [[buffer(CB_A)]],
                        device const float* s [[buffer(CB_S), function_constant(has_scale)]],
                        device T* out [[buffer(CB_OUT)]],
                        constant ColumnSumParams& p [[buffer(CB_PARAMS)]],
                        uint3 tgid [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]]) {
  const int col = int(tgid.x) * GEMM_THREADS + int(tid);
  if (col >= p.cols) return;
  device const float* az = a + int(tgid.z) * p.a_zs + col;
  const int block = p.row_block > 0 ? p.row_block : p.rows;
  const int r0 = int(tgid.y) * block, r1 = min(p.rows, r0 + block);
  float sum = 0.0f;
  if (has_scale) {
    device const float* sz = s + int(tgid.z) * p.s_zs + col % p.s_mod;
    for (int r = r0; r < r1; ++r) sum = fma(float(az[r * p.lda]), float(sz[r * p.lds]), sum);
  } else {
    for (int r = r0; r < r1; ++r) sum += float(az[r * p.lda]);
  }
  out[int(tgid.z) * p.out_zs + int(tgid.y) * p.out_ys + col] = T(sum);
}

INSTANTIATE_KERNEL(column_sums_f32, column_sums<float>)
INSTANTIATE_KERNEL(column_sums_f16, column_sums<half>)
INSTANTIATE_BFLOAT_KERNEL(column_sums_bf16, column_sums<bfloat>)

// R^T per direction, so the backward steps read rows of R^T (contiguous) instead of
// columns of R. 4*G*H*H bytes each way once per call. (Not named transpose: Metal's
// standard library has a transpose.)
template <typename T>
kernel void transpose_matrix(device const T* in [[buffer(TB_IN)]], device T* out [[buffer(TB_OUT)]],
                             constant TransposeParams& p [[buffer(TB_PARAMS)]],
                             uint3 tgid [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]]) {
  const int e = int(tgid.x) * GEMM_THREADS + int(tid);
  if (e >= p.rows * p.cols) return;
  const int r = e / p.cols, c = e % p.cols, z = int(tgid.z) * p.zs;
  out[z + c * p.rows + r] = in[z + e];
}

INSTANTIATE_KERNEL(transpose_f32, transpose_matrix<float>)
INSTANTIATE_KERNEL(transpose_f16, transpose_matrix<half>)
INSTANTIATE_BFLOAT_KERNEL(transpose_bf16, transpose_matrix<bfloat>)
