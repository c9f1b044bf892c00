// What the emulator's executor and the kernels compiled through shim.hpp share: the kernel
// registry, function constants and the argument tables read from the kernels' signatures
// (the adapter that calls a kernel is adapter.hpp, Metal's half half.hpp). No Metal keywords
// here (the executor includes it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "kernel_params.h"
#include "metal/emulator/scheduler.hpp"

namespace rnncore::metal::emu {

// ---- function constants --------------------------------------------------------------------
// The function-constant values of the dispatch being run, by index (the shader's FC_*
// values), as the plan sets them: Metal specialises a kernel with them.
struct ConstantValues {
  static constexpr int32_t kCount = 64;  // indices the emulator takes (the kernels use < 50)
  int32_t value[kCount] = {};
  // Set by the dispatch: reading a constant it does not set, or binding an argument
  // conditional on one, raises DeviceError as Metal refuses to specialise the function.
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
// The counting copy (kernels_counted.cpp): the same kernels with every load and store
// instrumented, run while metal counting is on.
bool register_counted_kernel(const char* name, KernelAdapter adapter, const ArgSpec* args,
                             size_t count);
const KernelEntry& find_counted_kernel(const std::string& name);

// What the counting kernels of one OS thread add up for the dispatch being run: bytes of the
// device buffers read and written (the address ranges [begin, end) of the plan's buffers),
// and fma calls. Null outside counting.
struct CountContext {
  const uintptr_t (*ranges)[2] = nullptr;
  size_t count = 0;
  uint64_t read = 0, written = 0, fmas = 0;
  uint64_t barrier_calls = 0;  // threadgroup_barrier calls, by every thread
  void note(uintptr_t address, uint64_t size, bool write) {
    for (size_t k = 0; k < count; ++k)
      if (address >= ranges[k][0] && address < ranges[k][1]) {
        (write ? written : read) += size;
        return;
      }
  }
};
inline thread_local CountContext* g_count = nullptr;

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
