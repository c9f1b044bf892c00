// The .metal sources compiled as C++ for the host emulator. Each kernel registers itself
// (REGISTER_KERNEL in the shaders expands to a registration only here).
#include "metal/emulator/shim.hpp"

// clang-format off
#include "gemm.metal"
#include "rnn.metal"
#include "lstm.metal"
#include "gru.metal"
// clang-format on

namespace rnncore::metal::emu {
// Referenced by the executor so a static link keeps this object file (and its
// registrations).
int emulated_kernels_linked() { return 1; }
}  // namespace rnncore::metal::emu
