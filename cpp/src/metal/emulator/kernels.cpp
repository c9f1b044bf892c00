// The .metal sources compiled as C++ for the host emulator, each kernel registered with the
// argument table of its signature (generated at build time from the same sources by
// cpp/shaders/check/emulator_signatures.py; cmake/emulator.cmake).
#include "metal/emulator/shim.hpp"

// clang-format off
#include "gemm.metal"
#include "rnn.metal"
#include "lstm.metal"
#include "gru.metal"
#include "emulated_kernels.inc"
// clang-format on

namespace rnncore::metal::emu {
// Referenced by the executor so a static link keeps this object file (and its
// registrations).
int emulated_kernels_linked() { return 1; }
}  // namespace rnncore::metal::emu
