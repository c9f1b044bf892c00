// Picks the fused kernels for this CPU and runs them on the thread pool.
#include "cpu/fused.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cpu/thread_pool.hpp"
#include "rnncore/error.hpp"

namespace rnncore::cpu {

FusedKernels fused_kernels_generic();
#if defined(RNNCORE_X86_KERNELS)
FusedKernels fused_kernels_avx2();
FusedKernels fused_kernels_avx512();
#endif

namespace {

FusedKernels select() {
  // RNNCORE_ISA=generic|avx2|avx512 forces a variant (for tests); never one the CPU lacks.
  const char* forced = std::getenv("RNNCORE_ISA");
  const std::string want = forced ? forced : "";
#if defined(RNNCORE_X86_KERNELS)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && (want.empty() || want == "avx512")) return fused_kernels_avx512();
  if (avx2 && (want.empty() || want == "avx512" || want == "avx2")) return fused_kernels_avx2();
#endif
  return fused_kernels_generic();
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

const FusedKernels& fused_kernels() {
  static const FusedKernels k = select();
  return k;
}

template <class T>
void fused_forward_impl(const detail::Problem& p, const detail::DirectionForward* dirs) {
  const FusedOps<T>& k = fused_kernels().ops<T>();
  ThreadPool& pool = ThreadPool::instance();
  const int max_threads = pool.max_threads();
  // A thread must have enough work per step to pay for the barrier (~0.1-0.3 us).
  const int64_t macs = p.N * p.G * p.H * p.H;
  const int64_t nb = (p.H + k.width - 1) / k.width;
  int per_dir = static_cast<int>(std::min<int64_t>(macs / 65536 + 1, nb));
  per_dir = std::max(1, std::min(per_dir, std::max(1, max_threads / static_cast<int>(p.D))));

  const int64_t ws_elems = k.workspace(p);
  std::unique_ptr<T, AlignedFree> ws[2];
  for (int64_t d = 0; d < p.D; ++d) {
    const size_t bytes = static_cast<size_t>((ws_elems * int64_t(sizeof(T)) + 63) / 64 * 64);
    ws[d].reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!ws[d]) throw std::bad_alloc();
  }
  SpinBarrier barriers[2] = {SpinBarrier(per_dir), SpinBarrier(per_dir)};
  // With one thread per direction there are no barriers, and fewer threads than
  // directions take the directions in turn.
  const int want =
      per_dir == 1 ? std::min(static_cast<int>(p.D), max_threads) : per_dir * static_cast<int>(p.D);
  pool.run(want, [&](int tid, int team) {
    if (per_dir == 1 || team < want) {
      for (int64_t d = tid; d < p.D; d += team) k.forward(p, dirs[d], ws[d].get(), nullptr, 0, 1);
      return;
    }
    const int d = tid / per_dir;
    k.forward(p, dirs[d], ws[d].get(), &barriers[d], tid % per_dir, per_dir);
  });
}

void fused_forward(const detail::Problem& p, const detail::DirectionForward* dirs) {
  if (p.dtype == DType::Float32)
    fused_forward_impl<float>(p, dirs);
  else
    fused_forward_impl<double>(p, dirs);
}

}  // namespace rnncore::cpu
