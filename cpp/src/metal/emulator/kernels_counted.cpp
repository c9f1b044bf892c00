// The .metal sources compiled a second time, with every load and store instrumented (CMake
// compiles this file with kernel-address instrumentation in outlined-call mode; counts.cpp
// has the hooks), into an anonymous namespace so that nothing here is shared with the
// kernels the emulator runs otherwise (kernels.cpp). fma() counts the products'
// multiply-adds.
#include "metal/emulator/shim.hpp"

namespace {
inline float fma(float a, float b, float c) {
  if (auto* n = rnncore::metal::emu::g_count) ++n->fmas;
  return std::fma(a, b, c);
}
// clang-format off
#include "gemm.metal"
#include "rnn.metal"
#include "lstm.metal"
#include "gru.metal"
// clang-format on
}  // namespace

#undef RNNCORE_EMULATED_KERNEL
#define RNNCORE_EMULATED_KERNEL(name, table, ...)                                               \
  static const bool name##_counted_ = ::rnncore::metal::emu::register_counted_kernel(           \
      #name,                                                                                    \
      &::rnncore::metal::emu::invoke<&::__VA_ARGS__, ::rnncore::metal::emu::signatures::table>, \
      ::rnncore::metal::emu::signatures::table,                                                 \
      std::size(::rnncore::metal::emu::signatures::table));
#include "emulated_kernels.inc"

namespace rnncore::metal::emu {
int counted_kernels_linked() { return 1; }
}  // namespace rnncore::metal::emu
