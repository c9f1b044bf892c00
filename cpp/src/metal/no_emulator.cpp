// Stands in for the host emulator in builds without it (RNNCORE_METAL_EMULATOR=OFF).
#include "core/backend.hpp"
#include "rnncore/error.hpp"

namespace rnncore::detail {

bool emulator_available() { return false; }

Backend& emulated_backend() {
  throw DeviceError(
      "[device] 'metal-emulated' is not available: this build of rnncore has no "
      "host emulator (configure with -DRNNCORE_METAL_EMULATOR=ON)");
}

}  // namespace rnncore::detail
