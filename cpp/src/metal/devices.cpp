// The Metal devices as this build has them: "metal" (the Metal backend on the metal-cpp
// executor, Apple builds with RNNCORE_METAL) and "metal-emulated" (on the host emulator,
// builds with RNNCORE_METAL_EMULATOR). A device the build lacks raises a DeviceError that
// says why; RNNCORE_NO_METAL_REASON comes from cmake/metal.cmake.
#include <string>

#include "core/backend.hpp"
#include "rnncore/error.hpp"
#if defined(RNNCORE_METAL_APPLE) || defined(RNNCORE_METAL_EMULATED)
#include "metal/backend.hpp"
#endif

#ifndef RNNCORE_NO_METAL_REASON
#define RNNCORE_NO_METAL_REASON "it is built on macOS with Apple silicon only"
#endif

namespace rnncore::detail {
namespace {

[[maybe_unused]] [[noreturn]] Backend& missing(const char* device, const char* what) {
  throw DeviceError(std::string("[device] '") + device +
                    "' is not available: this build of rnncore has " + what);
}

}  // namespace

#if defined(RNNCORE_METAL_APPLE)
bool metal_available() { return metal::apple_gpu_available(); }
Backend& metal_backend() { return metal::backend_on(metal::apple_executor()); }
#else
bool metal_available() { return false; }
Backend& metal_backend() { missing("metal", "no Metal backend (" RNNCORE_NO_METAL_REASON ")"); }
#endif

#if defined(RNNCORE_METAL_EMULATED)
bool emulator_available() { return true; }
Backend& emulated_backend() { return metal::backend_on(metal::emulator_executor()); }
#else
bool emulator_available() { return false; }
Backend& emulated_backend() {
  missing("metal-emulated", "no host emulator (configure with -DRNNCORE_METAL_EMULATOR=ON)");
}
#endif

}  // namespace rnncore::detail
