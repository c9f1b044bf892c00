// The "metal-emulated" device: the Metal backend on the host emulator.
#include "core/backend.hpp"
#include "metal/backend.hpp"

namespace rnncore::detail {

bool emulator_available() { return true; }

Backend& emulated_backend() { return metal::backend_on(metal::emulator_executor()); }

}  // namespace rnncore::detail
