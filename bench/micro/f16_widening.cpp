// What widening float16 weights costs in a batch-1 product, on one core (AVX-512 and F16C).
//
//   c++ -O3 -march=native bench/micro/f16_widening.cpp -o /tmp/f16_widening
//   taskset -c 0 /tmp/f16_widening
//
// One core's share of a batch-1 LSTM step at H = 256 on two threads: a row of K = 256 float32
// times a K × 512 panel (four gates' 128 units), 8 accumulation chains, the panel in L2 (256 KiB
// in 16 bits, 512 KiB in float32) as rnncore's kernels stream R. The ways of widening:
//   float32       an FMA from memory (float32 panels; R widened once a call)
//   cvt512        vcvtph2ps zmm, m256, then an FMA (rnncore's tile on Intel)
//   halves        two vcvtph2ps ymm, m128 and two 256-bit FMAs (tile_halves, Zen 4)
//   mask-2op      bit masks: a float16's 15 exponent and mantissa bits at bit 13 (its sign at
//                 31) of a float32 are its value times 2^-112, so an AND and an FMA with the row
//                 scaled by 2^112 give the same sum. Two float16 share each 32-bit slot; with
//                 both as stored (the first in bits 15-0) the first takes a shift left by 16, an
//                 arithmetic shift right by 3 and the AND, the second the last two: 2.5
//                 operations per 16 weights. Timed here at 2 (an AND for the first; a rotation,
//                 the shift and the AND for the second)
//   mask-1.5op    and at 1.5 (one rotation before the second AND), which no arrangement of the
//                 slot's bits makes exact. Both timing only: their sums are not checked.
// and the FMA floor: the panel's 8192 512-bit FMAs at the rate a register-only loop measures.
// Prints microseconds per panel product (least of 5 windows of 2000), 3 rounds; first checks
// that float32, cvt512 and halves give the same bits (all that `--check` does).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if !defined(__AVX512F__) || !defined(__F16C__) || !defined(__FMA__)
#error "build with -march=native on a processor with AVX-512F, F16C and FMA"
#endif

namespace {

constexpr int64_t K = 256, NC = 512, NV = NC / 16;  // NV 16-wide vectors of columns
alignas(64) float row[K];
alignas(64) float out[NC];

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Panels of 8 vectors (128 columns) × K, each k's 128 columns contiguous; widen(p) loads the
// 16 weights at p as float32.
template <class T, class Widen>
__attribute__((always_inline)) inline void product(const T* P, Widen widen) {
  for (int64_t b = 0; b < NV; b += 8) {
    __m512 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m512 x = _mm512_set1_ps(row[k]);
      const T* p = P + (b / 8 * K + k) * 128;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = _mm512_fmadd_ps(x, widen(p + 16 * j), a[j]);
    }
    for (int j = 0; j < 8; ++j) _mm512_storeu_ps(out + (b + j) * 16, a[j]);
  }
}

__attribute__((noinline)) void float32(const float* P) {
  product(P, [](const float* p) { return _mm512_loadu_ps(p); });
}

__attribute__((noinline)) void cvt512(const uint16_t* P) {
  product(P, [](const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  });
}

// 4 vectors of 16 (128 columns) as 8 halves; the same lanes' sums in the same order as cvt512.
__attribute__((noinline)) void halves(const uint16_t* P) {
  for (int64_t b = 0; b < NV; b += 8) {
    __m256 a[16];
    for (int j = 0; j < 16; ++j) a[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m256 x = _mm256_set1_ps(row[k]);
      const uint16_t* p = P + (b / 8 * K + k) * 128;
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j));
        a[j] = _mm256_fmadd_ps(x, _mm256_cvtph_ps(h), a[j]);
      }
    }
    for (int j = 0; j < 16; ++j) _mm256_storeu_ps(out + b * 16 + 8 * j, a[j]);
  }
}

// 64 bytes hold two vectors of 16 weights.
template <bool kShift>
__attribute__((noinline)) void masks(const uint32_t* P) {
  const __m512i m = _mm512_set1_epi32(static_cast<int>(0x8FFFE000u));
  for (int64_t b = 0; b < NV; b += 8) {
    __m512 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m512 x = _mm512_set1_ps(row[k]);
      const uint32_t* p = P + (b / 8 * K + k) * 64;
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512i t = _mm512_loadu_si512(static_cast<const void*>(p + 16 * j));
        __asm__("" : "+v"(t));  // one load for both weights (GCC would fold it into each)
        __m512i u = _mm512_rol_epi32(t, 16);
        if (kShift) u = _mm512_srai_epi32(u, 3);
        a[2 * j] = _mm512_fmadd_ps(x, _mm512_castsi512_ps(_mm512_and_si512(t, m)), a[2 * j]);
        a[2 * j + 1] =
            _mm512_fmadd_ps(x, _mm512_castsi512_ps(_mm512_and_si512(u, m)), a[2 * j + 1]);
      }
    }
    for (int j = 0; j < 8; ++j) _mm512_storeu_ps(out + (b + j) * 16, a[j]);
  }
}

// 512-bit FMAs a second from registers: 12 chains, more than latency × throughput.
double fma_rate() {
  // Distinct starting values, or the compiler would merge the chains into one.
  const __m512 x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.5f);
  __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f),
         a3 = _mm512_set1_ps(3.f), a4 = _mm512_set1_ps(4.f), a5 = _mm512_set1_ps(5.f),
         a6 = _mm512_set1_ps(6.f), a7 = _mm512_set1_ps(7.f), a8 = _mm512_set1_ps(8.f),
         a9 = _mm512_set1_ps(9.f), a10 = _mm512_set1_ps(10.f), a11 = _mm512_set1_ps(11.f);
  const int64_t n = 50000000;
  const double t0 = now();
  for (int64_t i = 0; i < n; ++i) {
    a0 = _mm512_fmadd_ps(a0, x, y), a1 = _mm512_fmadd_ps(a1, x, y);
    a2 = _mm512_fmadd_ps(a2, x, y), a3 = _mm512_fmadd_ps(a3, x, y);
    a4 = _mm512_fmadd_ps(a4, x, y), a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y), a7 = _mm512_fmadd_ps(a7, x, y);
    a8 = _mm512_fmadd_ps(a8, x, y), a9 = _mm512_fmadd_ps(a9, x, y);
    a10 = _mm512_fmadd_ps(a10, x, y), a11 = _mm512_fmadd_ps(a11, x, y);
  }
  const double s = now() - t0;
  const __m512 sum =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                    _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  _mm512_storeu_ps(out, sum);
  return 12.0 * static_cast<double>(n) / s;
}

template <class F>
double least_us(F&& f) {
  constexpr int kReps = 2000;
  double best = 1e30;
  for (int w = 0; w < 5; ++w) {
    const double t0 = now();
    for (int r = 0; r < kReps; ++r) f();
    best = std::min(best, now() - t0);
  }
  return best / kReps * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = static_cast<size_t>(K * NC);
  std::vector<uint16_t> p16(n);
  std::vector<float> p32(n);
  for (size_t i = 0; i < n; ++i) {
    p16[i] = static_cast<uint16_t>(0x2000 + (i * 7919) % 0x3000 + (i % 2 ? 0x8000 : 0));
    p32[i] = _cvtsh_ss(p16[i]);
  }
  std::vector<uint32_t> pm(n / 2);
  for (size_t i = 0; i < n / 2; ++i) pm[i] = 0x0A00A000u + static_cast<uint32_t>(i % 4096);
  for (int64_t k = 0; k < K; ++k) row[k] = 0.001f * static_cast<float>(k) - 0.1f;

  // The three exact ways give the same bits: each lane's FMAs in the same order.
  std::vector<float> ref(NC);
  float32(p32.data());
  std::memcpy(ref.data(), out, sizeof out);
  cvt512(p16.data());
  const bool same512 = std::memcmp(ref.data(), out, sizeof out) == 0;
  halves(p16.data());
  const bool same256 = std::memcmp(ref.data(), out, sizeof out) == 0;
  if (!same512 || !same256) {
    std::printf("the widened products differ from float32's (cvt512 %d, halves %d)\n", same512,
                same256);
    return 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--check") == 0) return 0;  // the bits only (tests)

  const double fmas = static_cast<double>(K * NV);
  for (int round = 0; round < 3; ++round) {
    const double rate = fma_rate();
    const double floor_us = fmas / rate * 1e6;
    const double t32 = least_us([&] { float32(p32.data()); });
    const double t512 = least_us([&] { cvt512(p16.data()); });
    const double th = least_us([&] { halves(p16.data()); });
    const double tm2 = least_us([&] { masks<true>(pm.data()); });
    const double tm15 = least_us([&] { masks<false>(pm.data()); });
    std::printf(
        "us a panel: float32 %.2f  cvt512 %.2f  halves %.2f  mask-2op %.2f  mask-1.5op %.2f  "
        "| FMA floor %.2f (%.2f G 512-bit FMA/s)\n",
        t32, t512, th, tm2, tm15, floor_us, rate / 1e9);
  }
  return 0;
}
