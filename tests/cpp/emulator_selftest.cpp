// Compiles emulator_selftest.metal through the emulator's shim (as kernels.cpp does for
// the library's kernels), its kernels registered from their signatures.
#include "metal/emulator/shim.hpp"

// clang-format off
#include "emulator_selftest.metal"
#include "emulator_selftest_kernels.inc"
// clang-format on

int emulator_selftest_linked() { return 1; }
