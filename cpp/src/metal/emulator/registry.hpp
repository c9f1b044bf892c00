// What the emulator's executor and the kernels compiled through shim.hpp share: the kernel
// registry, function constants, the argument tables read from the kernels' signatures and
// the adapter that calls a kernel with its parameter list. No Metal keywords here (the
// executor includes it too).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "kernel_params.h"
#include "metal/emulator/scheduler.hpp"

namespace rnncore::metal::emu {

// IEEE binary16 <-> binary32, round to nearest even (what Metal's half conversions and
// numpy's float16 do).
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);

// Metal's `half` as a storage type: converts from float implicitly (stores), to float
// explicitly only, so that every read in a kernel is written float(x) as Metal's overload
// rules want for mixed half/float arithmetic.
struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f) : bits(float_to_half_bits(f)) {}  // NOLINT: implicit, like Metal's
  explicit operator float() const { return half_bits_to_float(bits); }
};

// ---- function constants --------------------------------------------------------------------
// The function-constant values of the dispatch being run, by index (the shader's FC_*
// values), as the plan sets them: Metal specialises a kernel with them.
struct ConstantValues {
  static constexpr int32_t kCount = 64;  // indices the emulator takes (the kernels use < 50)
  int32_t value[kCount] = {};
  bool defined[kCount] = {};
  bool is_bool[kCount] = {};  // set as a bool, else as an int
};

// What the kernel code of the dispatch being run sees: its function constants and name.
// The executor sets it on each OS thread around the threadgroups the thread runs (the
// fibers of a threadgroup share it).
struct DispatchState {
  const ConstantValues* constants = nullptr;
  const std::string* kernel = nullptr;
};
inline thread_local const DispatchState* g_dispatch = nullptr;

// Raises DeviceError: a kernel read a function constant the dispatch does not set (Metal
// cannot specialise the function), or set with another type, or read outside a dispatch.
[[noreturn]] void bad_constant_read(const char* name, int32_t index, bool want_bool);

// A program-scope function constant (FUNCTION_CONSTANT in shim.hpp): reading it yields the
// value of the dispatch being run, and raises if that dispatch does not set it.
template <class T, int32_t Index>
struct KernelConstant {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int>,
                "the emulator's function constants are bool or int");
  static_assert(Index >= 0 && Index < ConstantValues::kCount,
                "function-constant index beyond the emulator's table");
  const char* name;
  operator T() const {  // NOLINT: implicit, as reading a constant in Metal
    constexpr bool want_bool = std::is_same_v<T, bool>;
    const DispatchState* d = g_dispatch;
    if (!d || !d->constants->defined[Index] || d->constants->is_bool[Index] != want_bool)
      bad_constant_read(name, Index, want_bool);
    return static_cast<T>(d->constants->value[Index]);
  }
};
template <class T, int32_t Index>
constexpr int32_t constant_index(const KernelConstant<T, Index>&) {
  return Index;
}

// ---- kernels and their arguments -------------------------------------------------------------
// What an argument's attribute in the kernel's signature binds. The table of every kernel
// is generated from the .metal sources (cpp/shaders/check/emulator_signatures.py).
enum class ArgKind : uint8_t {
  Buffer,       // [[buffer(i)]]: setBuffer or setBytes at index i
  Threadgroup,  // [[threadgroup(i)]]: threadgroup memory
  // The thread-position attributes of the same names.
  ThreadgroupPositionInGrid,
  ThreadPositionInThreadgroup,
  ThreadPositionInGrid,
  ThreadsPerThreadgroup,
  ThreadIndexInThreadgroup,
  SimdgroupIndexInThreadgroup,
  ThreadIndexInSimdgroup,
  ThreadsPerSimdgroup,
};
struct ArgSpec {
  const char* name;
  ArgKind kind;
  int32_t index;              // of a buffer or threadgroup argument
  int32_t constant;           // function_constant(name): its index; -1 for none
  const char* constant_name;  // (for messages)
};
inline constexpr int32_t kMaxBufferIndex = 30;  // Metal's argument table: 31 buffers

// Calls a kernel for one thread: `args` holds, per parameter, the bound pointer of a buffer
// or threadgroup argument (null for an argument absent through its function constant).
using KernelAdapter = void (*)(void* const* args, const ThreadIds& ids);
struct KernelEntry {
  KernelAdapter adapter = nullptr;
  const ArgSpec* args = nullptr;
  size_t count = 0;
};
bool register_kernel(const char* name, KernelAdapter adapter, const ArgSpec* args, size_t count);
const KernelEntry& find_kernel(const std::string& name);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
// What reading an inactive lane yields: NaN for floating point, a marker for integers.
template <class T>
T poison() {
  if constexpr (std::is_floating_point_v<T>)
    return std::numeric_limits<T>::quiet_NaN();
  else
    return static_cast<T>(0x5EADBEEF);
}

}  // namespace rnncore::metal::emu

// ---- the adapter every kernel shares ------------------------------------------------------
namespace rnncore::metal::emu {

[[noreturn]] void absent_reference_argument(const char* name);

template <class>
inline constexpr bool kAlwaysFalse = false;

// The value a parameter of type P with attribute kind K receives.
template <class P, ArgKind K>
P argument(void* slot, const char* name, const ThreadIds& id) {
  if constexpr (K == ArgKind::Buffer || K == ArgKind::Threadgroup) {
    if constexpr (std::is_pointer_v<P>) {
      (void)name;
      return static_cast<P>(slot);
    } else if constexpr (std::is_lvalue_reference_v<P>) {
      using V = std::remove_reference_t<P>;
      static_assert(std::is_const_v<V>, "a [[buffer]] reference argument must be constant");
      if (!slot) absent_reference_argument(name);
      return *static_cast<V*>(slot);
    } else {
      static_assert(kAlwaysFalse<P>, "a [[buffer]] or [[threadgroup]] argument is a pointer");
    }
  } else {
    (void)slot;
    (void)name;
    constexpr bool vector =
        K == ArgKind::ThreadgroupPositionInGrid || K == ArgKind::ThreadPositionInThreadgroup ||
        K == ArgKind::ThreadPositionInGrid || K == ArgKind::ThreadsPerThreadgroup;
    if constexpr (vector) {
      static_assert(std::is_same_v<P, uint3>, "this thread-position attribute is a uint3 here");
      if constexpr (K == ArgKind::ThreadgroupPositionInGrid) return id.tgid;
      if constexpr (K == ArgKind::ThreadPositionInThreadgroup) return id.tpos;
      if constexpr (K == ArgKind::ThreadsPerThreadgroup) return id.tptg;
      if constexpr (K == ArgKind::ThreadPositionInGrid)
        return uint3{id.tgid.x * id.tptg.x + id.tpos.x, id.tgid.y * id.tptg.y + id.tpos.y,
                     id.tgid.z * id.tptg.z + id.tpos.z};
    } else {
      static_assert(std::is_integral_v<P> && !std::is_same_v<P, bool>,
                    "this thread-position attribute is an integer");
      if constexpr (K == ArgKind::ThreadIndexInThreadgroup) return static_cast<P>(id.tid);
      if constexpr (K == ArgKind::SimdgroupIndexInThreadgroup) return static_cast<P>(id.sg);
      if constexpr (K == ArgKind::ThreadIndexInSimdgroup) return static_cast<P>(id.lane);
      if constexpr (K == ArgKind::ThreadsPerSimdgroup) return static_cast<P>(kSimdWidth);
    }
  }
}

// Checks of a signature table that Metal's compiler or the emulator would refuse.
template <size_t N>
constexpr bool indices_in_range(const ArgSpec (&spec)[N]) {
  for (const ArgSpec& a : spec)
    if (a.kind == ArgKind::Buffer && (a.index < 0 || a.index > kMaxBufferIndex)) return false;
  return true;
}
template <size_t N>
constexpr bool indices_unique(const ArgSpec (&spec)[N]) {
  for (size_t i = 0; i < N; ++i)
    for (size_t j = i + 1; j < N; ++j)
      if (spec[i].kind == spec[j].kind && spec[i].index == spec[j].index &&
          (spec[i].kind == ArgKind::Buffer || spec[i].kind == ArgKind::Threadgroup))
        return false;
  return true;
}
template <size_t N>
constexpr bool one_threadgroup_block(const ArgSpec (&spec)[N]) {
  for (const ArgSpec& a : spec)
    if (a.kind == ArgKind::Threadgroup && a.index != 0) return false;
  return true;
}

template <const auto& Spec, class... P, size_t... I>
void call(void (*kernel)(P...), void* const* args, const ThreadIds& id, std::index_sequence<I...>) {
  kernel(argument<P, Spec[I].kind>(args[I], Spec[I].name, id)...);
}

// The adapter of `Kernel`, whose signature table is `Spec`.
template <auto Kernel, const auto& Spec>
void invoke(void* const* args, const ThreadIds& id) {
  constexpr size_t n = std::extent_v<std::remove_reference_t<decltype(Spec)>>;
  static_assert(indices_in_range(Spec), "a [[buffer(i)]] index is outside 0..30");
  static_assert(indices_unique(Spec), "two arguments of a kernel have the same index");
  static_assert(one_threadgroup_block(Spec),
                "the emulator gives a kernel one threadgroup block, [[threadgroup(0)]]");
  call<Spec>(Kernel, args, id, std::make_index_sequence<n>());
}

template <class... P>
constexpr size_t parameter_count(void (*)(P...)) {
  return sizeof...(P);
}

}  // namespace rnncore::metal::emu

// Registers the function `name` (a kernel, or an instance of a kernel template, written after
// the table's name) with the generated table of its signature; the table and the parameter
// list must agree (checked when compiling).
#define RNNCORE_EMULATED_KERNEL(name, table, ...)                                               \
  static_assert(::rnncore::metal::emu::parameter_count(&::__VA_ARGS__) ==                       \
                    std::size(::rnncore::metal::emu::signatures::table),                        \
                "kernel " #name ": the signature table and the parameters differ");             \
  static const bool name##_emulated_ = ::rnncore::metal::emu::register_kernel(                  \
      #name,                                                                                    \
      &::rnncore::metal::emu::invoke<&::__VA_ARGS__, ::rnncore::metal::emu::signatures::table>, \
      ::rnncore::metal::emu::signatures::table,                                                 \
      std::size(::rnncore::metal::emu::signatures::table));
