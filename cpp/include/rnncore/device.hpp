// Device selection. Backends are chosen at build time (CMake) and at run time here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rnncore {

// MetalEmulated runs the Metal backend's kernels and plans on the host emulator (a testing
// device of the Linux and test builds; never picked by Auto).
enum class Device { Auto, Cpu, Metal, MetalEmulated };

// "cpu", "metal", "metal-emulated"; Auto resolves through default_device().
const char* device_name(Device d);
// Parses a device name; "" means Auto. Unknown names throw ValueError.
Device parse_device(std::string_view name);
// Names of the devices this build can run on this machine, best first.
std::vector<std::string> available_devices();
// The device Auto stands for: RNNCORE_DEVICE if set, else the best available.
Device default_device();

}  // namespace rnncore
