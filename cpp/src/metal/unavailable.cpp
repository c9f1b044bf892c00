// Stands in for the Metal backend in builds without it (everything but Apple).
#include "core/backend.hpp"
#include "rnncore/error.hpp"

namespace rnncore::detail {

bool metal_available() { return false; }

Backend& metal_backend() {
  throw DeviceError(
      "[device] 'metal' is not available: this build of rnncore has no Metal "
      "backend (it is built on macOS with Apple silicon only)");
}

}  // namespace rnncore::detail
