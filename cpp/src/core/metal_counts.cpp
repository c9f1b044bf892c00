#include "rnncore/metal_counts.hpp"

#include "rnncore/error.hpp"

#if defined(RNNCORE_METAL_COUNTING)
namespace rnncore::metal::emu {
void set_counting(bool on);
std::vector<DispatchCount> take_counts();
}  // namespace rnncore::metal::emu
#endif

namespace rnncore {

#if !defined(RNNCORE_METAL_COUNTING)
namespace {
[[noreturn]] void unavailable() {
  throw DeviceError(
      "[metal counting] this build has no counting Metal emulator (it needs device "
      "'metal-emulated', GCC or Clang, and no sanitizer build)");
}
}  // namespace
#endif

void set_metal_counting(bool on) {
#if defined(RNNCORE_METAL_COUNTING)
  metal::emu::set_counting(on);
#else
  if (on) unavailable();
#endif
}

std::vector<DispatchCount> take_metal_counts() {
#if defined(RNNCORE_METAL_COUNTING)
  return metal::emu::take_counts();
#else
  unavailable();
#endif
}

}  // namespace rnncore
