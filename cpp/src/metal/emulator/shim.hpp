// Compiles Metal Shading Language kernels as C++ for the host emulator: address-space
// qualifiers vanish (constant becomes const), the builtins the kernels use map onto the
// fiber scheduler, and function constants read the values of the dispatch being run.
// Include it, then the .metal sources, then their generated signature table
// (cpp/shaders/check/emulator_signatures.py), which registers every kernel; the conventions
// the kernels follow for this to be faithful are in cpp/shaders/README.md.
#pragma once

#include <cmath>

#include "metal/emulator/adapter.hpp"
#include "metal/emulator/half.hpp"

// ---- Metal Shading Language surface -------------------------------------------------------
#define kernel
#define device
#define thread
#define threadgroup
#define constant const

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

using std::exp;
using std::fabs;
using std::fma;
using std::fmax;
using std::fmin;
using std::tanh;
using uint = uint32_t;
using ushort = uint16_t;
using uint3 = rnncore::metal::emu::uint3;
using half = rnncore::metal::emu::half;

struct float2 {
  float x = 0.0f, y = 0.0f;
  float2() = default;
  constexpr float2(float a, float b) : x(a), y(b) {}
};

template <class T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
inline T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}

// noinline: the return address identifies the call site, so threads waiting at different
// barriers are told apart.
[[gnu::noinline]] inline void threadgroup_barrier(mem_flags) {
  rnncore::metal::emu::barrier(__builtin_return_address(0));
}

[[gnu::noinline]] inline rnncore::metal::emu::SimdView simd_exchange(uint64_t bits) {
  return rnncore::metal::emu::simd_collective(bits, __builtin_return_address(0));
}

// Reductions over the active lanes, in lane order (the GPU's tree order may round
// differently); computed once per simdgroup and shared with the other lanes.
template <class T, class Op>
T simd_reduce(T v, int kind, Op op) {
  using namespace rnncore::metal::emu;
  const SimdView s = simd_exchange(to_bits(v));
  if (s.shared->kind == kind) return from_bits<T>(s.shared->bits);
  bool first = true;
  T r = T(0);
  for (uint32_t l = 0; l < kSimdWidth; ++l) {
    if (!(s.active >> l & 1)) continue;
    const T x = from_bits<T>(s.slots[l]);
    r = first ? x : op(r, x);
    first = false;
  }
  *s.shared = {kind, to_bits(r)};
  return r;
}

template <class T>
T simd_sum(T v) {
  return simd_reduce(v, 1, [](T a, T b) { return a + b; });
}

template <class T>
T simd_max(T v) {
  return simd_reduce(v, 2, [](T a, T b) { return max(a, b); });
}

template <class T>
T simd_shuffle(T v, ushort lane) {
  using namespace rnncore::metal::emu;
  const SimdView s = simd_exchange(to_bits(v));
  return lane < kSimdWidth && (s.active >> lane & 1) ? from_bits<T>(s.slots[lane]) : poison<T>();
}

template <class T>
T simd_broadcast(T v, ushort lane) {
  return simd_shuffle(v, lane);
}

template <class T>
T simd_shuffle_down(T v, ushort delta) {
  using namespace rnncore::metal::emu;
  const SimdView s = simd_exchange(to_bits(v));
  const uint32_t src = s.lane + delta;
  return src < kSimdWidth && (s.active >> src & 1) ? from_bits<T>(s.slots[src]) : poison<T>();
}
}  // namespace metal

using namespace metal;

// A program-scope function constant: reading it yields the value of the dispatch being run
// and raises DeviceError if the dispatch does not set it (Metal cannot specialise a function
// without a value for every constant it uses).
#define FUNCTION_CONSTANT(type, name, index) \
  static constexpr ::rnncore::metal::emu::KernelConstant<type, index> name{#name};

// One block per threadgroup, handed to every thread of it by the adapter.
#define THREADGROUP_BUFFER(type, name, index) type* name

// The instance; the generated table registers it under its host name
// (RNNCORE_EMULATED_KERNEL).
#define INSTANTIATE_KERNEL(name, ...) template decltype(__VA_ARGS__) __VA_ARGS__;
