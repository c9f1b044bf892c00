// Stands in for the Metal backend in builds without it: everything but Apple silicon Macs, and
// Macs whose build found no Metal compiler (RNNCORE_NO_METAL_REASON, from CMakeLists.txt).
#include "core/backend.hpp"
#include "rnncore/error.hpp"

#ifndef RNNCORE_NO_METAL_REASON
#define RNNCORE_NO_METAL_REASON "it is built on macOS with Apple silicon only"
#endif

namespace rnncore::detail {

bool metal_available() { return false; }

Backend& metal_backend() {
  throw DeviceError(
      "[device] 'metal' is not available: this build of rnncore has no Metal "
      "backend (" RNNCORE_NO_METAL_REASON ")");
}

}  // namespace rnncore::detail
