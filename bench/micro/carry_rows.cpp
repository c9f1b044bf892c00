// What carrying the input projection in a batch-1 step's product costs, on one core (AVX-512 BF16).
//
//   c++ -O3 -march=native bench/micro/carry_rows.cpp -o /tmp/carry_rows
//   taskset -c 0 /tmp/carry_rows
//
// One core's share of a bfloat16 LSTM step at T = 100, N = 1, H = I = 256 on two threads, as
// rnncore's carry_product runs it: 8 panels of 16 units, each the row h (128 pairs of k) times
// the panel's R pairs (4 gates: 32 KiB a panel, 256 KiB for the 8, streamed from L2) with
// 2 × 4 accumulators, plus, after every 4 of the row's pairs, one carried unit of a later block
// of x' (the rows of X times W's pairs, another 256 KiB in L2), as many as one step consumes:
//   R only        the row's product alone
//   4 rows × 4    a unit is one pair of k for the 4 gates of 4 rows: 4 W vectors for 16 products
//   8 rows × 2    a unit is one pair of k for 2 gates of 8 rows: 2 W vectors for 16 products,
//                 half the W stream (the carried sums: 16 accumulators beside the row's 8)
//   prefetched    with a software prefetch (prefetcht0) of every other line of R 1 KiB ahead, or
//                 of every line: whether the hardware prefetchers leave L2's stream short of
//                 its rate (R only, and 8 rows × 2)
//   alternating   every other step runs the panels, and each panel's pairs, last to first: a
//                 step starts on the lines the one before ended on, which L1 may still hold
//                 (R only, and 8 rows × 2)
//   non-temporal  a prefetchnta of every line of R 1 KiB ahead, of every panel or of all but
//                 the first: whether R's lines can pass through L1 without evicting a panel
//                 kept there from step to step (R only)
// Prints microseconds per step (least of 5 windows of 2000 steps), 3 rounds; first checks that
// both carried layouts give the projection the same bits (one accumulator per row and gate, in
// k order; all that `--check` does).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if !defined(__AVX512BF16__)
#error "build with -march=native on a processor with AVX-512 BF16"
#endif

namespace {

constexpr int G = 4, K2 = 128, P = 8, ROWS = 8;   // gates, pairs of k, panels, X's rows
constexpr int64_t kPanel = int64_t(K2) * G * 16;  // 32-bit pairs a panel

struct Data {
  std::vector<uint32_t> R, Wp, h, X;
  std::vector<float> out, acc;
};

inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// How a panel's stream of R is prefetched in software (beside the hardware's prefetchers).
enum Prefetch { kNone, kEveryOther, kEvery, kNonTemporal, kNonTemporalButFirst };

// Panel p's row product, carrying units [u0, u1) of M rows × GC gates (none when M = 0), its
// pairs of k last to first when `reverse`.
// (Loops unrolled by pragma, as in rnncore's kernels: otherwise GCC keeps the sums in memory.)
template <int M, int GC, int Prefetch = kNone>
__attribute__((noinline)) void panel(const Data& d, float* out_, float* acc_, int p, int u0, int u1,
                                     bool reverse) {
  const uint32_t* const R = d.R.data() + p * kPanel;
  const uint32_t* const Wp = d.Wp.data() + p * kPanel;
  const uint32_t* const h = d.h.data();
  const uint32_t* const X = d.X.data();
  float* const acc = acc_ + p * ROWS * G * 16;
  __m512 ra[2][G];
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) ra[j][g] = _mm512_setzero_ps();
  constexpr int MR = M > 0 ? M : 1;
  __m512 pa[MR][GC];
  int u = u0, q = u0 / K2;
  const auto load = [&](bool zero) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
      for (int g = 0; g < GC; ++g)
        pa[r][g] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r * G + q * GC + g) * 16);
  };
  const auto store = [&]() __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
      for (int g = 0; g < GC; ++g) _mm512_storeu_ps(acc + (r * G + q * GC + g) * 16, pa[r][g]);
  };
  if (M > 0) load(u0 % K2 == 0);
  const auto carried = [&]() __attribute__((always_inline)) {
    if (u / K2 != q) store(), ++q, load(true);
    const int k = u - q * K2;
    __m512i b[GC];
#pragma GCC unroll 4
    for (int g = 0; g < GC; ++g) b[g] = _mm512_loadu_si512(Wp + (k * G + q * GC + g) * 16);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(X[r * K2 + k]));
#pragma GCC unroll 4
      for (int g = 0; g < GC; ++g) pa[r][g] = dp(pa[r][g], a, b[g]);
    }
    ++u;
  };
  const bool nta = Prefetch == kNonTemporal || (Prefetch == kNonTemporalButFirst && p > 0);
  for (int k4 = 0; k4 < K2; k4 += 4) {
    const int k = reverse ? K2 - 4 - k4 : k4;
#pragma GCC unroll 4
    for (int j4 = 0; j4 < 4; ++j4) {
      const int j = reverse ? 3 - j4 : j4;
      const __m512i a = _mm512_set1_epi32(static_cast<int>(h[k + j]));
      // (Ahead of the last panel the lines are the next array's or past the end: harmless.)
      [[maybe_unused]] const char* const ahead =
          reinterpret_cast<const char*>(R + (k + j) * G * 16) + 1024;
      if constexpr (Prefetch == kEveryOther || Prefetch == kEvery) {
        constexpr int every = Prefetch == kEveryOther ? 2 : 1;  // lines of the row's 4
#pragma GCC unroll 4
        for (int g = 0; g < G; g += every) _mm_prefetch(ahead + g * 64, _MM_HINT_T0);
      }
      if (nta) {
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) _mm_prefetch(ahead + g * 64, _MM_HINT_NTA);
      }
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        ra[j % 2][g] = dp(ra[j % 2][g], a, _mm512_loadu_si512(R + ((k + j) * G + g) * 16));
    }
    if (M > 0 && u < u1) carried();
  }
  while (M > 0 && u < u1) carried();
  if (M > 0) store();
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
    _mm512_storeu_ps(out_ + (p * G + g) * 16, _mm512_add_ps(ra[0][g], ra[1][g]));
}

// One step: every panel, each carrying its share of a block of M rows (units per step: the
// block's units over its M steps); the panels and their pairs last to first in the odd steps
// when `alternate`.
template <int M, int GC, int Prefetch = kNone>
void step(Data& d, int s, bool alternate = false) {
  const int units = M > 0 ? K2 * (G / GC) : 0, per = M > 0 ? units / M : 0;
  const int u0 = M > 0 ? s % M * per : 0;
  const bool reverse = alternate && s % 2 == 1;
  for (int i = 0; i < P; ++i)
    panel<M, GC, Prefetch>(d, d.out.data(), d.acc.data(), reverse ? P - 1 - i : i, u0, u0 + per,
                           reverse);
}

template <int M, int GC, int Prefetch = kNone>
double time_step(Data& d, bool alternate = false) {
  double best = 1e30;
  for (int w = 0; w < 5; ++w) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < 2000; ++s) step<M, GC, Prefetch>(d, s, alternate);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, us / 2000);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check_only = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  Data d;
  d.R.resize(P * kPanel), d.Wp.resize(P * kPanel), d.h.resize(K2), d.X.resize(ROWS * K2);
  d.out.resize(P * G * 16), d.acc.resize(P * ROWS * G * 16);
  uint32_t seed = 12345;
  const auto bf16_pair = [&] {  // two bfloat16 in [-1, 1)
    uint32_t v = 0;
    for (int i = 0; i < 2; ++i) {
      seed = seed * 1664525u + 1013904223u;
      float f = static_cast<float>(seed >> 8) / 8388608.0f - 1.0f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v |= (bits >> 16) << (16 * i);
    }
    return v;
  };
  for (auto* v : {&d.R, &d.Wp, &d.h, &d.X})
    for (auto& x : *v) x = bf16_pair();
  // The carried sums of a whole block, both ways.
  std::vector<float> a44, a82;
  for (int s = 0; s < 4; ++s) step<4, 4>(d, s);
  a44 = d.acc;
  std::fill(d.acc.begin(), d.acc.end(), 0.0f);
  for (int s = 0; s < 8; ++s) step<8, 2>(d, s);
  a82 = d.acc;
  bool same = true;
  for (int p = 0; p < P; ++p)
    same = same && std::memcmp(&a44[p * ROWS * G * 16], &a82[p * ROWS * G * 16],
                               4 * G * 16 * sizeof(float)) == 0;
  std::printf("4 rows x 4 and 8 rows x 2: %s bits\n", same ? "the same" : "DIFFERENT");
  if (!same || check_only) return same ? 0 : 1;
  for (int round = 0; round < 3; ++round) {
    std::printf("us a step: R only %.3f, 4 rows x 4 %.3f, 8 rows x 2 %.3f\n", time_step<0, 4>(d),
                time_step<4, 4>(d), time_step<8, 2>(d));
    std::printf(
        "  prefetched: R only, every other line %.3f, every line %.3f; 8 rows x 2, every "
        "other line %.3f\n",
        time_step<0, 4, kEveryOther>(d), time_step<0, 4, kEvery>(d),
        time_step<8, 2, kEveryOther>(d));
    std::printf("  alternating: R only %.3f, 8 rows x 2 %.3f\n", time_step<0, 4>(d, true),
                time_step<8, 2>(d, true));
    std::printf("  non-temporal: R only, every panel %.3f, all but the first %.3f\n",
                time_step<0, 4, kNonTemporal>(d), time_step<0, 4, kNonTemporalButFirst>(d));
  }
  return 0;
}
