// Compiles Metal Shading Language kernels as C++ for the host emulator: address-space
// qualifiers vanish (constant becomes const), the builtins the kernels use map onto the
// fiber scheduler, and function constants read the values of the dispatch being run.
// Include it, then the .metal sources, then their generated signature table
// (cpp/shaders/check/emulator_signatures.py), which registers every kernel; the conventions
// the kernels follow for this to be faithful are in cpp/shaders/README.md.
#pragma once

#include <cmath>
#include <cstring>
#include <string>

#include "metal/emulator/adapter.hpp"
#include "metal/emulator/half.hpp"
#include "rnncore/error.hpp"

// ---- Metal Shading Language surface -------------------------------------------------------
#define kernel
#define device
#define thread
#define threadgroup
#define constant const
// The emulator has MSL 3.1's bfloat (the Metal compiler defines this from -std=metal3.1).
#define __HAVE_BFLOAT__ 1

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<int>(a) | static_cast<int>(b));
}

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
using bfloat = rnncore::metal::emu::bfloat;

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

// A barrier is identified by its place in the source (file and line, through the macro
// below), so threads waiting at different barriers are told apart, and a barrier the
// compiler duplicates (a loop unswitched on a simdgroup's condition) is still one barrier.
inline void threadgroup_barrier_at(mem_flags, const char* site) {
  if (auto* n = rnncore::metal::emu::g_count) ++n->barrier_calls;
  rnncore::metal::emu::barrier(site);
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

// ---- simdgroup matrices (MSL 2.3) -----------------------------------------------------------
// An 8 x 8 matrix held by a whole simdgroup. Here lane l holds elements 2l and 2l + 1 in
// row-major order; the hardware's layout is unspecified and no kernel may depend on it (the
// emulator offers no thread_elements()). Every operation is a collective of all 32 lanes
// (DeviceError when any is inactive) with the same arguments in every lane (DeviceError
// otherwise); products accumulate in float, k in order, with fma (the GPU's order may round
// differently).
using ulong = uint64_t;
struct ulong2 {
  ulong x = 0, y = 0;
  constexpr ulong2(ulong v = 0) : x(v), y(v) {}  // NOLINT: implicit, as MSL's `= 0` default
  constexpr ulong2(ulong a, ulong b) : x(a), y(b) {}
};

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "the emulator has 8 x 8 simdgroup matrices");
  T e[2]{};  // this lane's elements
};
using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = simdgroup_matrix<half, 8, 8>;

template <class T, int C, int R>
simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, C, R> m;
  m.e[0] = m.e[1] = value;
  return m;
}

namespace sgm {
inline float value(float v) { return v; }
inline float value(half v) { return float(v); }

// The collective: every lane must be active and pass the same `key`.
inline rnncore::metal::emu::SimdView whole(uint64_t key, bool uniform, const void* site,
                                           const char* op) {
  using namespace rnncore::metal::emu;
  const SimdView s = simd_collective(key, site);
  if (s.active != 0xffffffffu)
    throw rnncore::DeviceError(std::string("[metal-emulated] ") + op +
                               " in a simdgroup with inactive lanes: simdgroup matrices need "
                               "all 32 lanes");
  if (uniform)
    for (uint32_t l = 0; l < kSimdWidth; ++l)
      if (s.slots[l] != key)
        throw rnncore::DeviceError(std::string("[metal-emulated] ") + op +
                                   " with arguments that differ between lanes of a simdgroup");
  return s;
}

inline uint64_t key(const void* p, ulong epr, ulong2 o, bool transpose) {
  uint64_t h = reinterpret_cast<uintptr_t>(p);
  for (uint64_t v : {epr, o.x, o.y, uint64_t(transpose)}) h = (h ^ v) * 0x100000001b3ull;
  return h;
}

// Element (r, c) of the matrix at `origin` of a row-major memory matrix (transposed: its
// (c, r)).
inline ulong at(ulong epr, ulong2 o, bool transpose, int r, int c) {
  return transpose ? (o.y + ulong(c)) * epr + o.x + ulong(r)
                   : (o.y + ulong(r)) * epr + o.x + ulong(c);
}

template <class T, int C, int R>
uint64_t pack(const simdgroup_matrix<T, C, R>& m) {
  static_assert(sizeof(m.e) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, m.e, sizeof(m.e));
  return bits;
}

// All 64 elements of a matrix, from a collective's slots.
template <class T>
void unpack(const uint64_t* slots, float* out) {
  for (uint32_t l = 0; l < 32; ++l) {
    T e[2];
    std::memcpy(e, &slots[l], sizeof(e));
    out[2 * l] = value(e[0]);
    out[2 * l + 1] = value(e[1]);
  }
}
}  // namespace sgm

template <class T, int C, int R>
[[gnu::noinline]] void simdgroup_load(simdgroup_matrix<T, C, R>& d, const T* src,
                                      ulong elements_per_row = C, ulong2 origin = 0,
                                      bool transpose = false) {
  const auto s = sgm::whole(sgm::key(src, elements_per_row, origin, transpose), true,
                            __builtin_return_address(0), "simdgroup_load");
  for (int k = 0; k < 2; ++k) {
    const int e = int(2 * s.lane) + k;
    d.e[k] = src[sgm::at(elements_per_row, origin, transpose, e / 8, e % 8)];
  }
}

template <class T, int C, int R>
[[gnu::noinline]] void simdgroup_store(const simdgroup_matrix<T, C, R>& a, T* dst,
                                       ulong elements_per_row = C, ulong2 origin = 0,
                                       bool transpose = false) {
  const auto s = sgm::whole(sgm::key(dst, elements_per_row, origin, transpose), true,
                            __builtin_return_address(0), "simdgroup_store");
  for (int k = 0; k < 2; ++k) {
    const int e = int(2 * s.lane) + k;
    dst[sgm::at(elements_per_row, origin, transpose, e / 8, e % 8)] = a.e[k];
  }
}

// d = a b + c (d may be any of them).
template <class T, int C, int R, int K>
[[gnu::noinline]] void simdgroup_multiply_accumulate(simdgroup_matrix<T, C, R>& d,
                                                     const simdgroup_matrix<T, K, R>& a,
                                                     const simdgroup_matrix<T, C, K>& b,
                                                     const simdgroup_matrix<T, C, R>& c) {
  const char* site = static_cast<const char*>(__builtin_return_address(0));
  if (auto* n = rnncore::metal::emu::g_count) n->fmas += 16;  // this lane's two elements
  float A[64], B[64];
  const auto sa = sgm::whole(sgm::pack(a), false, site, "simdgroup_multiply_accumulate");
  sgm::unpack<T>(sa.slots, A);
  const auto sb = sgm::whole(sgm::pack(b), false, site + 1, "simdgroup_multiply_accumulate");
  sgm::unpack<T>(sb.slots, B);
  T out[2];
  for (int k = 0; k < 2; ++k) {
    const int e = int(2 * sa.lane) + k, r = e / 8, col = e % 8;
    float acc = sgm::value(c.e[k]);
    for (int i = 0; i < 8; ++i) acc = std::fma(A[r * 8 + i], B[i * 8 + col], acc);
    out[k] = T(acc);
  }
  d.e[0] = out[0];
  d.e[1] = out[1];
}

template <class T, int C, int R, int K>
void simdgroup_multiply(simdgroup_matrix<T, C, R>& d, const simdgroup_matrix<T, K, R>& a,
                        const simdgroup_matrix<T, C, K>& b) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<T, C, R>(T(0.0f)));
}
}  // namespace metal

using namespace metal;

#define RNNCORE_SHIM_STR2(x) #x
#define RNNCORE_SHIM_STR(x) RNNCORE_SHIM_STR2(x)
#define threadgroup_barrier(flags) \
  ::metal::threadgroup_barrier_at(flags, __FILE__ ":" RNNCORE_SHIM_STR(__LINE__))

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
