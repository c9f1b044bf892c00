#include "cpu/narrow.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/clones.hpp"
#include "cpu/thread_pool.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RNNCORE_HAVE_F16C_PATH 1
#endif

namespace rnncore::cpu {
namespace {

#if defined(RNNCORE_HAVE_F16C_PATH)
__attribute__((target("avx,f16c"))) void widen_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// Every AVX2 processor has F16C (and compilers do not all name "f16c" for the builtin).
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

// Plain loops the compiler vectorises (shifts and adds), for AVX2 and AVX-512 too (SSE2
// alone took a fifth of a bfloat16 GRU's gradients at T=1: R's and W's and their gradients'
// conversions).
RNNCORE_CLONES void widen_bfloat16_serial(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
}

RNNCORE_CLONES void narrow_bfloat16_serial(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i]);
}

void widen_half_serial(const uint16_t* src, float* dst, int64_t n) {
#if defined(RNNCORE_HAVE_F16C_PATH)
  if (has_f16c()) return widen_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void narrow_half_serial(const float* src, uint16_t* dst, int64_t n) {
#if defined(RNNCORE_HAVE_F16C_PATH)
  if (has_f16c()) return narrow_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// Whole arrays (a training state is millions of elements) in blocks of 64k elements that the
// pool's threads claim: one thread converts at about half the memory bandwidth. Each element
// is converted alone, so the blocks change no bits.
template <class S, class D>
void blocks(void (*f)(const S*, D*, int64_t), const S* src, D* dst, int64_t n) {
  constexpr int64_t kBlock = int64_t(1) << 16;
  if (n < 2 * kBlock) return f(src, dst, n);
  if (n <= 16 * kBlock) {
    // Halves, as parallel_gemm splits a few rows' product by the columns of a weight: each
    // core then multiplies the half of the widened weight it wrote itself (blocks claimed
    // at random made batch-1 float16 GRU calls of 1 step 1.6x slower).
    const int64_t half = (n / 2 + 8) / 16 * 16;
    ThreadPool::instance().parallel_for(
        2, [&](int64_t b) { f(src + b * half, dst + b * half, b == 0 ? half : n - half); });
    return;
  }
  ThreadPool::instance().parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b) {
    const int64_t i = b * kBlock;
    f(src + i, dst + i, std::min(kBlock, n - i));
  });
}

}  // namespace

void widen_bfloat16(const uint16_t* src, float* dst, int64_t n) {
  blocks(&widen_bfloat16_serial, src, dst, n);
}
void narrow_bfloat16(const float* src, uint16_t* dst, int64_t n) {
  blocks(&narrow_bfloat16_serial, src, dst, n);
}
void widen_half(const uint16_t* src, float* dst, int64_t n) {
  blocks(&widen_half_serial, src, dst, n);
}
void narrow_half(const float* src, uint16_t* dst, int64_t n) {
  blocks(&narrow_half_serial, src, dst, n);
}

}  // namespace rnncore::cpu
