// Picks the fused kernels for this CPU and runs them on the thread pool.
#include "cpu/fused.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/aligned.hpp"
#include "cpu/thread_pool.hpp"
#include "rnncore/error.hpp"

#if defined(RNNCORE_X86_KERNELS)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace rnncore::cpu {

FusedKernels fused_kernels_generic();
#if defined(RNNCORE_X86_KERNELS)
FusedKernels fused_kernels_avx2();
FusedKernels fused_kernels_avx512();
FusedKernels fused_kernels_avx512bf16();
#if defined(RNNCORE_AMX_KERNELS)
FusedKernels fused_kernels_avx512amx();
#endif
#endif

namespace {

#if defined(RNNCORE_X86_KERNELS)
// AMX-BF16 and its tiles on the CPU (CPUID leaf 7: EDX bits 22 and 24), and the tile data
// state granted by the OS: Linux hands it out per process on request (arch_prctl).
bool amx_usable() {
#if defined(RNNCORE_AMX_KERNELS) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 22) & 1) || !((d >> 24) & 1)) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

FusedKernels select() {
  // RNNCORE_ISA=generic|avx2|avx512|avx512bf16|avx512amx forces a variant (for tests); never one
  // the CPU lacks (a forced variant the CPU lacks falls back to the best it has below it).
  const char* forced = std::getenv("RNNCORE_ISA");
  const std::string want = forced ? forced : "";
#if defined(RNNCORE_X86_KERNELS)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const bool amx = want == "avx512amx";
  // The bfloat16 variants carry no float64 kernels of their own (CMakeLists.txt).
  const auto with_f64 = [](FusedKernels k) {
    k.f64 = fused_kernels_avx512().f64;
    return k;
  };
#if defined(RNNCORE_AMX_KERNELS)
  if (bf16 && (want.empty() || amx) && amx_usable()) return with_f64(fused_kernels_avx512amx());
#endif
  if (bf16 && (want.empty() || amx || want == "avx512bf16"))
    return with_f64(fused_kernels_avx512bf16());
  if (avx512 && (want.empty() || amx || want == "avx512bf16" || want == "avx512"))
    return fused_kernels_avx512();
  if (avx2 && (want.empty() || amx || want == "avx512bf16" || want == "avx512" || want == "avx2"))
    return fused_kernels_avx2();
#endif
  return fused_kernels_generic();
}

// The processor's family if it is an AMD one (0 otherwise, and off x86).
unsigned amd_family() {
#if defined(RNNCORE_X86_KERNELS)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // AuthenticAMD
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return ((a >> 8) & 0xF) + ((a >> 20) & 0xFF);
#else
  return 0;
#endif
}

bool halves_choice() {
  const char* forced = std::getenv("RNNCORE_F16_WIDEN");
  if (forced && std::string(forced) == "halves") return true;
  if (forced && std::string(forced) == "whole") return false;
  // Zen 3 and 4 (only Zen 4 has AVX-512). Zen 5 (0x1A) converts whole vectors faster:
  // halves took 1.16x the time of the T=100 N=1 H=256 float16 GRU and 1.15x the LSTM's.
  return amd_family() == 0x19;
}

bool broadcast_choice() {
  const char* forced = std::getenv("RNNCORE_FMA_BROADCAST");
  if (forced && std::string(forced) == "memory") return true;
  if (forced && std::string(forced) == "register") return false;
  return amd_family() == 0x19;  // Zen 3 and 4; only Zen 4 runs the AVX-512 kernels
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

const FusedKernels& fused_kernels() {
  static const FusedKernels k = select();
  return k;
}

bool widen_f16_by_halves() {
  static const bool halves = halves_choice();
  return halves;
}

bool fma_broadcast_from_memory() {
  static const bool memory = broadcast_choice();
  return memory;
}

bool carry_blocks() {
  static const bool carry = [] {
    const char* e = std::getenv("RNNCORE_CARRY");
    return !(e && std::string(e) == "0");
  }();
  return carry;
}

bool slow_f16_conversion() {
  static const bool slow = amd_family() == 0x17;
  return slow;
}

template <class T>
void fused_forward_impl(const detail::Problem& p, const DirectionForward* dirs) {
  const FusedOps<T>& k = fused_kernels().ops<T>();
  ThreadPool& pool = ThreadPool::instance();
  const int64_t nb = (p.H + k.width - 1) / k.width;
  // Chunks of panels, fixed by the shape (the bits do not depend on them anyway), at most 64
  // per direction and of even sizes: split when the panels hold 64k multiply-adds a step a
  // chunk, as many ways as threads; beyond that, about 128k each, so that claiming one and
  // counting it done (~0.1 us each, on lines the threads share) is cheap beside its work.
  // (64k chunks at batch 1, H = 256, were 2-5% slower in alternating runs, each cell and
  // storage type.)
  const int64_t K = p.H + (p.fused_projection ? p.I : 0);
  const int64_t panel_macs = std::max<int64_t>(1, p.N * p.G * K * k.width);
  const int64_t threads = pool.max_threads();
  const auto chunks_of = [&](int64_t macs) {
    const int64_t per = std::max((macs + panel_macs - 1) / panel_macs, (nb + 63) / 64);
    return (nb + per - 1) / per;
  };
  // A step whose panels outgrow L1 (32 KiB) is split among the threads even when small,
  // so that each thread's share stays in its L1 (alternating runs, N = 1: float32 GRU at
  // H = 64 0.88 of the time, LSTM at H = 48 0.87-0.94, H = 128 0.62-0.79; split at 24 KiB,
  // the bfloat16 GRU at H = 64 took 1.45x). Two phases a step wait twice: from 96 KiB.
  // Not where the directions already fill the threads.
  const int phases = k.phases(p);
  const int64_t elem =
      dirs[0].R_narrow && !dirs[0].R_widen && k.narrow_panels ? 2 : int64_t(sizeof(T));
  const int64_t panel_bytes = nb * p.G * K * k.width * elem;
  const bool small_split = p.D < threads && panel_bytes > (phases == 2 ? 96 : 28) * 1024;
  const int64_t least = small_split ? 4096 : 65536;
  int64_t C = std::max(chunks_of(131072), std::min(threads, chunks_of(least)));
  int64_t per_chunk = (nb + C - 1) / C;
  C = (nb + per_chunk - 1) / per_chunk;  // chunks per direction
  if (C > 1 && p.D * C < 8 * threads && p.D * C % threads != 0) {
    // Few chunks that do not divide among the threads (3 on 2 threads: one waits a third of
    // every step): as many more as make them divide, when the panels allow.
    const int64_t want = ((p.D * C + threads - 1) / threads * threads + p.D - 1) / p.D;
    per_chunk = (nb + std::min(want, nb) - 1) / std::min(want, nb);
    C = (nb + per_chunk - 1) / per_chunk;
  }
  const int64_t stages = 1 + p.T * phases;  // packing, then every phase of every step

  const int64_t ws_elems = k.workspace(p);
  std::unique_ptr<T, AlignedFree> ws[2];
  for (int64_t d = 0; d < p.D; ++d) {
    const size_t bytes = static_cast<size_t>((ws_elems * int64_t(sizeof(T)) + 63) / 64 * 64);
    ws[d].reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!ws[d]) throw std::bad_alloc();
  }
  const int64_t blk = (k.block(p) + 15) / 16 * 16;
  // Work ahead (FusedOps::project_step): a participant that would wait for a step computes
  // the next step's projection part of chunks (its home range's first, then the others'),
  // into its own buffers (one per participant, stage parity and panel), and marks each chunk's
  // ahead[ch] = stage << 16 | slot << 1 | done. A chunk whose part is not marked done for
  // its stage computes the part itself. Per-participant buffers: a participant the OS
  // descheduled mid-part can only ever be overwriting its own buffer, which no chunk reads
  // until it marks it done. (The part is the same arithmetic wherever it runs.)
  const int64_t pblk = phases == 1 ? k.project_block(p) : 0;
  const int participants = static_cast<int>(std::min<int64_t>(pool.max_threads(), p.D * C));
  std::unique_ptr<T, AlignedFree> ahead_buf;
  std::unique_ptr<std::atomic<int64_t>[]> ahead;
  if (pblk > 0 && participants > 1 && C > 1) {
    const size_t n = static_cast<size_t>(participants * 2 * p.D * nb * pblk);
    ahead_buf.reset(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)));
    if (!ahead_buf) throw std::bad_alloc();
    ahead.reset(new std::atomic<int64_t>[static_cast<size_t>(p.D * C)]());
  }
  const auto ahead_part = [&](int slot, int64_t stage, int64_t ch) {
    const int64_t d = ch / C, b0 = ch % C * per_chunk;
    return ahead_buf.get() + ((slot * 2 + stage % 2) * p.D * nb + d * nb + b0) * pblk;
  };
  // Problem::lazy_projection: x' in blocks of kRows steps' rows (input time) × one panel,
  // made[(d * nb + panel) * blocks + block] 0 (to do), 1 (being made) or 2 (made). A chunk's
  // step makes its rows' blocks unless made; a participant that would wait makes the next
  // blocks that steps will read (from the second step on: W's panels are packed in the first
  // stage). A block is short (6 rows × 16 units: ~0.6 us at I = 256), so that it fits the
  // wait it fills rather than delaying the next step.
  // Carried blocks (FusedOps::carry_rows): a chunk's steps sum the blocks of its own panels
  // that its later steps read, in the order they read them, `per_slice` units of k
  // (CarrySlice) per panel's product (as many as the steps consume: each panel's block of
  // kRows rows every kRows steps). A block is claimed as made is (0 to 1) and marked made by
  // the step that sums its last units; a step whose block is still being carried sums the rest
  // first. A chunk's Carrying, slices and sums are touched only by whoever runs its step (one at a
  // time, stage after stage). The blocks' rows are carry_rows whether carried or not
  // (carry_blocks), so the bits are the same either way.
  const int64_t block_rows = [&] {
    const int64_t r = p.lazy_projection && k.carry_rows ? k.carry_rows(p, dirs[0]) : 0;
    for (int64_t d = 1; d < p.D; ++d)
      if (k.carry_rows(p, dirs[d]) != r) return int64_t(0);
    return r;
  }();
  const int64_t carry_rows = carry_blocks() ? block_rows : 0;
  const int64_t kRows = block_rows ? block_rows : k.project_rows_max,
                blocks = (p.T + kRows - 1) / kRows;
  std::unique_ptr<std::atomic<int>[]> made;
  if (p.lazy_projection) made.reset(new std::atomic<int>[static_cast<size_t>(p.D * nb * blocks)]());
  struct Carrying {
    int64_t next = 0, bi = 0;       // the next block (in the order read) and panel to claim
    int64_t t0 = -1, b = 0, k = 0;  // the block being carried: its first row, panel, pairs summed
    int64_t buf = 0;
  };
  const int64_t units = carry_rows ? k.carry_units(p) : 0,
                per_slice = carry_rows ? (units + carry_rows - 1) / carry_rows : 0;
  // Sums per chunk: as many as the blocks one step's slices can touch (the one in progress,
  // then a block per `units`; one finished in a step keeps its sums until the step is done).
  const int64_t ring = carry_rows ? (per_chunk * per_slice + units - 1) / units + 2 : 0,
                acc_elems = carry_rows * p.G * k.width;
  std::vector<Carrying> carrying(static_cast<size_t>(carry_rows ? p.D * C : 0));
  std::vector<CarrySlice<T>> plans(static_cast<size_t>(carry_rows ? p.D * C * per_chunk : 0));
  std::unique_ptr<T, AlignedFree> carry_sums;
  if (carry_rows) {
    const size_t n = static_cast<size_t>(p.D * C * ring * acc_elems);
    carry_sums.reset(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)));
    if (!carry_sums) throw std::bad_alloc();
  }
  const auto sums_of = [&](int64_t ch, int64_t buf) {
    return carry_sums.get() + (ch * ring + buf) * acc_elems;
  };
  // The block read at step s in the order the steps read them.
  const auto read_order = [&](int64_t d, int64_t s) {
    const int64_t block = (dirs[d].flip_in ? p.T - 1 - s : s) / kRows;
    return dirs[d].flip_in ? blocks - 1 - block : block;
  };
  // Claims the next whole block (a short one is left to its step) of the chunk's panels
  // [b0, b1) read after the step read_order `now`.
  const auto claim = [&](Carrying& c, int64_t d, int64_t b0, int64_t b1, int64_t now) {
    if (c.next <= now) c.next = now + 1, c.bi = b0;
    for (; c.next < blocks; ++c.next, c.bi = b0) {
      const int64_t block = dirs[d].flip_in ? blocks - 1 - c.next : c.next;
      if ((block + 1) * kRows > p.T) continue;
      for (; c.bi < b1; ++c.bi) {
        std::atomic<int>& m = made[static_cast<size_t>((d * nb + c.bi) * blocks + block)];
        int v = 0;
        if (m.load(std::memory_order_relaxed) == 0 &&
            m.compare_exchange_strong(v, 1, std::memory_order_acquire)) {
          c.t0 = block * kRows, c.b = c.bi++, c.k = 0, c.buf = (c.buf + 1) % ring;
          return true;
        }
      }
    }
    return false;
  };
  const auto carried = [&](int64_t d, int64_t ch, const Carrying& c) {
    k.carry_complete(p, dirs[d], ws[d].get(), c.t0, c.b, c.k, sums_of(ch, c.buf));
    made[static_cast<size_t>((d * nb + c.b) * blocks + c.t0 / kRows)].store(
        2, std::memory_order_release);
  };
  const auto make = [&](int64_t d, int64_t b, int64_t block, bool wait) {
    std::atomic<int>& m = made[static_cast<size_t>((d * nb + b) * blocks + block)];
    int v = m.load(std::memory_order_acquire);
    if (v == 0 && m.compare_exchange_strong(v, 1, std::memory_order_acquire)) {
      const int64_t t0 = block * kRows;
      k.project_rows(p, dirs[d], ws[d].get(), t0, std::min(kRows, p.T - t0), b, b + 1);
      m.store(2, std::memory_order_release);
      return true;
    }
    // Being made by another participant (briefly: it is running it, not waiting).
    for (int i = 1; wait && m.load(std::memory_order_acquire) != 2; ++i)
      if (i % 1024 == 0)
        std::this_thread::yield();
      else
        cpu_relax();
    return false;
  };
  // The block of x' that step s of direction d reads.
  const auto block_of = [&](int64_t d, int64_t s) {
    return (dirs[d].flip_in ? p.T - 1 - s : s) / kRows;
  };
  auto chunk = [&](T* scratch, int64_t stage, int64_t ch) {
    const int64_t d = ch / C, b0 = ch % C * per_chunk, b1 = std::min(nb, b0 + per_chunk);
    if (stage == 0) return k.pack(p, dirs[d], ws[d].get(), b0, b1);
    const int64_t s = (stage - 1) / phases;
    CarrySlice<T>* plan = nullptr;
    if (carry_rows) {
      Carrying& c = carrying[static_cast<size_t>(ch)];
      if (c.t0 >= 0 && c.t0 / kRows == block_of(d, s)) {  // read now: summed to its end here
        carried(d, ch, c);
        c.t0 = -1;
      }
    }
    if (made)
      for (int64_t b = b0; b < b1; ++b) make(d, b, block_of(d, s), true);
    if (carry_rows) {
      Carrying& c = carrying[static_cast<size_t>(ch)];
      plan = plans.data() + ch * per_chunk;
      const int64_t now = read_order(d, s);
      for (int64_t i = 0; i < b1 - b0; ++i) {
        CarrySlice<T>& slice = plan[i];
        slice = {0, 0, 0, 0, nullptr};
        if (c.t0 < 0 && !claim(c, d, b0, b1, now)) continue;
        slice = {c.t0, c.b, c.k, std::min(units, c.k + per_slice), sums_of(ch, c.buf)};
        c.k = slice.k1;
        if (c.k == units) c.t0 = -1;  // summed by this step (and marked made after it)
      }
    }
    T* xpre = nullptr;
    if (ahead) {
      const int64_t v = ahead[ch].load(std::memory_order_acquire);
      if (v >> 16 == stage && (v & 1))
        xpre = ahead_part(static_cast<int>(v >> 1 & 0x7fff), stage, ch);
    }
    k.step(p, dirs[d], ws[d].get(), s, static_cast<int>((stage - 1) % phases), b0, b1, scratch,
           xpre, plan);
    if (plan)
      for (int64_t i = 0; i < b1 - b0; ++i)
        if (plan[i].k1 == units && plan[i].k1 > plan[i].k0) {
          const CarrySlice<T>& slice = plan[i];
          k.carry_complete(p, dirs[d], ws[d].get(), slice.t0, slice.b, units, slice.acc);
          made[static_cast<size_t>((d * nb + slice.b) * blocks + slice.t0 / kRows)].store(
              2, std::memory_order_release);
        }
  };
  // Steps from the second on (the first's chunks may not have packed W yet).
  auto idle = [&](int slot, int64_t stage, int64_t begin, int64_t /*end*/) {
    if (made && stage >= 2) {
      // The next blocks the steps read, earliest first, home chunks' panels first.
      const int64_t all = p.D * C, s = (stage - 1) / phases;
      for (int64_t t = s; t < p.T; t += kRows)
        for (int64_t i = 0; i < all; ++i) {
          const int64_t ch = (begin + i) % all, d = ch / C, b0 = ch % C * per_chunk;
          const int64_t block = block_of(d, t);
          for (int64_t b = b0; b < std::min(nb, b0 + per_chunk); ++b)
            if (made[static_cast<size_t>((d * nb + b) * blocks + block)].load(
                    std::memory_order_relaxed) == 0 &&
                make(d, b, block, false))
              return true;
        }
      return false;
    }
    if (!ahead || stage < 2) return false;
    const int64_t all = p.D * C;
    for (int64_t i = 0; i < all; ++i) {
      const int64_t ch = (begin + i) % all;
      int64_t v = ahead[ch].load(std::memory_order_relaxed);
      if (v >> 16 >= stage) continue;
      const int64_t mine = stage << 16 | int64_t(slot) << 1;
      if (!ahead[ch].compare_exchange_strong(v, mine, std::memory_order_relaxed)) continue;
      const int64_t d = ch / C, b0 = ch % C * per_chunk, b1 = std::min(nb, b0 + per_chunk);
      k.project_step(p, dirs[d], ws[d].get(), stage - 1, b0, b1, ahead_part(slot, stage, ch));
      ahead[ch].compare_exchange_strong(v = mine, mine | 1, std::memory_order_release,
                                        std::memory_order_relaxed);
      return true;
    }
    return false;
  };
  auto serial = [&](int64_t d, T* scratch) {
    for (int64_t stage = 0; stage < stages; ++stage)
      for (int64_t c = 0; c < C; ++c) chunk(scratch, stage, d * C + c);
  };

  if (C == 1) {
    // A direction is one chain of small steps: the directions run side by side, each on
    // one thread, with nothing to wait for inside.
    pool.parallel_for(p.D, [&](int64_t d) {
      LineVector<T> scratch(static_cast<size_t>(blk));
      serial(d, scratch.data());
    });
    return;
  }
  std::unique_ptr<T, AlignedFree> scratch(
      static_cast<T*>(std::aligned_alloc(64, static_cast<size_t>(participants * blk) * sizeof(T))));
  if (!scratch) throw std::bad_alloc();
  // Zeroed: the kernels keep what a participant's scratch holds in it (FusedOps::block).
  std::memset(scratch.get(), 0, static_cast<size_t>(participants * blk) * sizeof(T));
  if (participants <= 1) {
    for (int64_t d = 0; d < p.D; ++d) serial(d, scratch.get());
    return;
  }
  StagedJob job(
      stages, p.D * C, participants,
      [&](int slot, int64_t stage, int64_t ch) { chunk(scratch.get() + slot * blk, stage, ch); },
      idle);
  job.run(pool);
}

void fused_forward(const detail::Problem& p, const DirectionForward* dirs) {
  if (p.dtype == DType::Float32)
    fused_forward_impl<float>(p, dirs);
  else
    fused_forward_impl<double>(p, dirs);
}

}  // namespace rnncore::cpu
