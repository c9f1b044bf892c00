// Runs the threads of one threadgroup as cooperative fibers, so that threadgroup barriers
// and simdgroup operations suspend and resume threads as on the GPU. It also checks what
// the GPU leaves undefined: a barrier some threads skip, threads waiting at different
// barriers, simdgroup operations in divergent control flow (all raise DeviceError), and
// it poisons what an inactive simd lane would return.
#pragma once

#include <cstdint>
#include <string>

#include "metal/plan.hpp"

namespace rnncore::metal::emu {

struct uint3 {
  uint32_t x = 0, y = 0, z = 0;
  uint3() = default;
  constexpr uint3(uint32_t a, uint32_t b, uint32_t c) : x(a), y(b), z(c) {}  // MSL's uint3(x, y, z)
};

// The thread-position attributes a kernel may ask for.
struct ThreadIds {
  uint3 tgid;         // threadgroup_position_in_grid
  uint3 tpos;         // thread_position_in_threadgroup
  uint3 tptg;         // threads_per_threadgroup
  uint32_t tid = 0;   // thread_index_in_threadgroup
  uint32_t sg = 0;    // simdgroup_index_in_threadgroup
  uint32_t lane = 0;  // thread_index_in_simdgroup
};

inline constexpr uint32_t kSimdWidth = 32;

struct Schedule {
  bool shuffle = false;  // run ready threads in a random order each round
  uint64_t seed = 0;
};

using ThreadBody = void (*)(void* ctx, const ThreadIds& ids);

// Runs body(ctx, ids) once for every thread of threadgroup `tgid`; returns when all have
// finished. Throws DeviceError for the misuses above, naming `kernel`.
void run_threadgroup(const std::string& kernel, const Size3& threads, const uint3& tgid,
                     const Schedule& schedule, ThreadBody body, void* ctx);

// For the shim, from inside a running thread.
void barrier(const void* site);
// A simdgroup collective: every active lane deposits `bits`; returns the 32 slots, the mask
// of active lanes, and the caller's lane.
struct SimdView {
  const uint64_t* slots;
  uint32_t active;
  uint32_t lane;
  // A reduction every lane computes identically is computed by the first lane to read and
  // kept here for the others: `kind` names the operation (0 = none yet).
  struct Shared {
    int kind;
    uint64_t bits;
  } * shared;
};
SimdView simd_collective(uint64_t bits, const void* site);

}  // namespace rnncore::metal::emu
