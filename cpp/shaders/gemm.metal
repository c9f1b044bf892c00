// The GEMMs and reductions around the recurrence (contract: "How every forward operation is
// built", "Gradient operations"): x' = x W^T + b for every time step at once, and after the
// gradient time loop dsource = dX' W, dW = dX'^T x, dR = delta^T h~, the bias, secondary-bias
// and peephole gradients as column sums, plus R^T for the backward step kernels.
//
// gemm_f32: a threadgroup of 16 x 16 threads computes a 64 x 64 tile of C, 4 x 4 outputs
// per thread strided by 16 (neighbouring threads write neighbouring columns); K moves
// through threadgroup memory 16 at a time (8 KiB). Operands are strided, so transposes
// cost nothing but coalescing: tiles are staged along whichever index is contiguous.
// Each staged element is reused 64 times: 2*64*64*16 FLOPs per 8 KiB loaded.
// Input projection, T=100, N=32, I=256, 3H=768: 1.26 GFLOP, ~0.5-0.8 ms on an M2-class GPU
// at the 40-60% of peak a simple tiled kernel reaches; its 14 MB of traffic take ~0.15 ms.
// Weight gradients of the same layer (dW, dR: 2 x 1.26 GFLOP, dsource 1.26 GFLOP): ~2 ms.
#include "common.h"

template <typename TA, typename TB, typename TC>
kernel void gemm(device const TA* a [[buffer(GB_A)]],
                 device const TB* b [[buffer(GB_B), function_constant(has_weight)]],
                 device const TB* bias [[buffer(GB_BIAS), function_constant(has_bias)]],
                 device TC* c [[buffer(GB_C)]], constant GemmParams& p [[buffer(GB_PARAMS)]],
                 THREADGROUP_BUFFER(float, tiles, 0), uint3 tgid [[threadgroup_position_in_grid]],
                 uint tid [[thread_index_in_threadgroup]]) {
  const int tx = int(tid) % 16, ty = int(tid) / 16;
  const int m0 = int(tgid.y) * GEMM_TILE_M, n0 = int(tgid.x) * GEMM_TILE_N;
  a += int(tgid.z) * p.a_zs;
  c += int(tgid.z) * p.c_zs;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  if (has_weight) {
    device const TB* bz = b + int(tgid.z) * p.b_zs;
    threadgroup float* as = tiles;                              // [TILE_K][TILE_M]
    threadgroup float* bs = tiles + GEMM_TILE_K * GEMM_TILE_M;  // [TILE_K][TILE_N]
    // Stage along the contiguous index so that neighbouring threads read neighbouring words.
    const bool a_k_major = p.a_cs == 1, b_k_major = p.b_rs == 1;
    for (int k0 = 0; k0 < p.K; k0 += GEMM_TILE_K) {
      for (int e = int(tid); e < GEMM_TILE_M * GEMM_TILE_K; e += GEMM_THREADS) {
        const int ar = a_k_major ? e / GEMM_TILE_K : e % GEMM_TILE_M;
        const int ak = a_k_major ? e % GEMM_TILE_K : e / GEMM_TILE_M;
        const int m = m0 + ar, ka = k0 + ak;
        as[ak * GEMM_TILE_M + ar] = m < p.M && ka < p.K ? float(a[m * p.a_rs + ka * p.a_cs]) : 0.0f;
        const int bn = b_k_major ? e / GEMM_TILE_K : e % GEMM_TILE_N;
        const int bk = b_k_major ? e % GEMM_TILE_K : e / GEMM_TILE_N;
        const int n = n0 + bn, kb = k0 + bk;
        bs[bk * GEMM_TILE_N + bn] =
            n < p.N && kb < p.K ? float(bz[kb * p.b_rs + n * p.b_cs]) : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int k = 0; k < GEMM_TILE_K; ++k) {
        float av[4], bv[4];
        for (int i = 0; i < 4; ++i) av[i] = as[k * GEMM_TILE_M + ty + 16 * i];
        for (int j = 0; j < 4; ++j) bv[j] = bs[k * GEMM_TILE_N + tx + 16 * j];
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
      }
      // The next iteration overwrites tiles that other threads may still be reading.
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }

  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty + 16 * i;
    if (m >= p.M) continue;
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n >= p.N) continue;
      float v = has_weight ? acc[i][j] : float(a[m * p.a_rs + n * p.a_cs]);
      if (has_bias) v += float(bias[n]);
      c[m * p.ldc + n] = TC(v);
    }
  }
}

// gemm_<A><B><C>: the element types of A, B (and bias) and C, f = float, h = half. float16
// storage uses hhh (the input projection), fhh (dsource, dW: float32 dX' times half
// inputs) and ffh (dR from float32 deltas and states).
INSTANTIATE_KERNEL(gemm_fff, gemm<float, float, float>)
INSTANTIATE_KERNEL(gemm_hhh, gemm<half, half, half>)
INSTANTIATE_KERNEL(gemm_fhh, gemm<float, half, half>)
INSTANTIATE_KERNEL(gemm_ffh, gemm<float, float, half>)

// One thread per column, rows in order: neighbouring threads read neighbouring words.
// Bias gradient of T=100, N=32, 3H=768: 2.5 M adds over 9.8 MB, ~0.1 ms (bandwidth).
// Sums float32 intermediates (dX', R's deltas, previous cells) into an output of type T.
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
  float sum = 0.0f;
  if (has_scale) {
    device const float* sz = s + int(tgid.z) * p.s_zs + col % p.s_mod;
    for (int r = 0; r < p.rows; ++r) sum = fma(float(az[r * p.lda]), float(sz[r * p.lds]), sum);
  } else {
    for (int r = 0; r < p.rows; ++r) sum += float(az[r * p.lda]);
  }
  out[int(tgid.z) * p.out_zs + col] = T(sum);
}

INSTANTIATE_KERNEL(column_sums_f32, column_sums<float>)
INSTANTIATE_KERNEL(column_sums_f16, column_sums<half>)

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
