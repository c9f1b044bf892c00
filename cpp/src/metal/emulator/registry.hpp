// What the emulator's executor and the kernels compiled through shim.hpp share: the kernel
// registry, function-constant values, argument tables and the adapters that call a kernel
// with its parameter list. No Metal keywords here (the executor includes it too).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

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

// Function constants of the dispatch being run, by index (the shader's FC_* values).
struct ConstantValues {
  int32_t value[64] = {};
  bool defined[64] = {};
  int32_t get(int32_t index) const { return value[index]; }
};
using ConstantSetter = void (*)(const ConstantValues&);
bool register_function_constant(ConstantSetter setter);
void apply_function_constants(const ConstantValues& values);

// What an adapter hands a kernel: buffer and setBytes arguments by index.
struct KernelArgs {
  void* buffers[32] = {};
  const void* bytes[32] = {};
  void* threadgroup_memory = nullptr;
};
using KernelAdapter = void (*)(const KernelArgs& args, const ThreadIds& ids);
bool register_kernel(const char* name, KernelAdapter adapter);
KernelAdapter find_kernel(const std::string& name);

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

// ---- adapters: from the executor's argument table to a kernel's parameter list ----------
namespace rnncore::metal::emu {

template <class T, class Kernel>
void step_adapter(Kernel kernel, const KernelArgs& a, const ThreadIds& id) {
  using namespace rnncore::kernels;
  const auto in = [&](int i) { return static_cast<const T*>(a.buffers[i]); };
  const auto out = [&](int i) { return static_cast<T*>(a.buffers[i]); };
  kernel(in(SB_XP), in(SB_R), in(SB_H0), in(SB_C0), in(SB_MASK), in(SB_PEEPHOLE), in(SB_B2),
         out(SB_Y), out(SB_C), out(SB_Z), out(SB_WS),
         *static_cast<const StepParams*>(a.bytes[SB_PARAMS]), id.tgid, id.sg, id.lane);
}

template <class TA, class TB, class TC, class Kernel>
void gemm_adapter(Kernel kernel, const KernelArgs& a, const ThreadIds& id) {
  using namespace rnncore::kernels;
  kernel(static_cast<const TA*>(a.buffers[GB_A]), static_cast<const TB*>(a.buffers[GB_B]),
         static_cast<const TB*>(a.buffers[GB_BIAS]), static_cast<TC*>(a.buffers[GB_C]),
         *static_cast<const GemmParams*>(a.bytes[GB_PARAMS]),
         static_cast<float*>(a.threadgroup_memory), id.tgid, id.tid);
}

template <class T, class Kernel>
void column_sums_adapter(Kernel kernel, const KernelArgs& a, const ThreadIds& id) {
  using namespace rnncore::kernels;
  kernel(static_cast<const float*>(a.buffers[CB_A]), static_cast<const float*>(a.buffers[CB_S]),
         static_cast<T*>(a.buffers[CB_OUT]),
         *static_cast<const ColumnSumParams*>(a.bytes[CB_PARAMS]), id.tgid, id.tid);
}

template <class T, class Kernel>
void transpose_adapter(Kernel kernel, const KernelArgs& a, const ThreadIds& id) {
  using namespace rnncore::kernels;
  kernel(static_cast<const T*>(a.buffers[TB_IN]), static_cast<T*>(a.buffers[TB_OUT]),
         *static_cast<const TransposeParams*>(a.bytes[TB_PARAMS]), id.tgid, id.tid);
}

template <class T, class Kernel>
void backward_adapter(Kernel kernel, const KernelArgs& a, const ThreadIds& id) {
  using namespace rnncore::kernels;
  const auto in = [&](int i) { return static_cast<const T*>(a.buffers[i]); };
  const auto out = [&](int i) { return static_cast<T*>(a.buffers[i]); };
  const auto work = [&](int i) { return static_cast<float*>(a.buffers[i]); };
  kernel(in(BB_RT), in(BB_Z), in(BB_HFWD), in(BB_CFWD), in(BB_H0), in(BB_C0), in(BB_MASK),
         in(BB_PEEPHOLE), in(BB_DY), in(BB_DH_FINAL), in(BB_DC_FINAL), in(BB_DC_STEPS),
         work(BB_DXP), work(BB_RDELTA), work(BB_HTILDE), work(BB_U), work(BB_CARRY), work(BB_CPREV),
         out(BB_DH0), out(BB_DC0), *static_cast<const BackwardParams*>(a.bytes[BB_PARAMS]), id.tgid,
         id.sg, id.lane);
}

}  // namespace rnncore::metal::emu

using rnncore::metal::emu::backward_adapter;
using rnncore::metal::emu::column_sums_adapter;
using rnncore::metal::emu::gemm_adapter;
using rnncore::metal::emu::step_adapter;
using rnncore::metal::emu::transpose_adapter;
