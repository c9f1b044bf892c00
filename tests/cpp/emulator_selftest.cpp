// Compiles emulator_selftest.metal through the emulator's shim (as kernels.cpp does for
// the library's kernels), with an adapter for its one signature.
#include "metal/emulator/registry.hpp"

namespace {
template <class Kernel>
void selftest_adapter(Kernel k, const rnncore::metal::emu::KernelArgs& a,
                      const rnncore::metal::emu::ThreadIds& id) {
  k(static_cast<float*>(a.buffers[0]), static_cast<float*>(a.threadgroup_memory), id.tid, id.lane,
    id.tptg);
}
}  // namespace

#include "metal/emulator/shim.hpp"

// clang-format off
#include "emulator_selftest.metal"
// clang-format on

int emulator_selftest_linked() { return 1; }
