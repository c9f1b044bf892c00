// The "metal" device on Apple builds: the Metal backend on the metal-cpp executor.
#include "core/backend.hpp"
#include "metal/backend.hpp"

namespace rnncore::detail {

bool metal_available() { return metal::apple_gpu_available(); }

Backend& metal_backend() { return metal::backend_on(metal::apple_executor()); }

}  // namespace rnncore::detail
