// The device table: each device's name, whether this build can run it here, and its
// backend. Adding a device is an enum value (rnncore/device.hpp), a row here, and its backend.
#include "rnncore/device.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/backend.hpp"
#include "rnncore/error.hpp"

namespace rnncore::detail {

// Each defined by its backend's sources; a backend this build lacks throws a DeviceError
// saying why (metal/devices.cpp).
Backend& cpu_backend();
Backend& metal_backend();
bool metal_available();
Backend& emulated_backend();
bool emulator_available();

namespace {

bool always() { return true; }

struct DeviceEntry {
  Device device;
  const char* name;
  bool (*available)();    // whether this build can run it on this machine
  Backend& (*backend)();  // throws DeviceError saying why when it is not available
  bool picked_by_auto;
};

// Best first: the order of available_devices(), and Auto takes the first available of
// those it may pick (the emulator is a testing device, never picked by Auto).
constexpr DeviceEntry kDevices[] = {
    {Device::Metal, "metal", metal_available, metal_backend, true},
    {Device::Cpu, "cpu", always, cpu_backend, true},
    {Device::MetalEmulated, "metal-emulated", emulator_available, emulated_backend, false},
};

}  // namespace

Backend& backend_of(Device device) {
  if (device == Device::Auto) device = default_device();
  for (const DeviceEntry& e : kDevices)
    if (e.device == device) return e.backend();
  return cpu_backend();  // only a value cast out of the enum's range gets here
}

}  // namespace rnncore::detail

namespace rnncore {

const char* device_name(Device d) {
  if (d == Device::Auto) return "auto";
  for (const detail::DeviceEntry& e : detail::kDevices)
    if (e.device == d) return e.name;
  return "?";
}

Device parse_device(std::string_view name) {
  if (name.empty() || name == "auto") return Device::Auto;
  std::vector<std::string> known;
  for (const detail::DeviceEntry& e : detail::kDevices) {
    if (name == e.name) return e.device;
    known.push_back(std::string("'") + e.name + "'");
  }
  std::sort(known.begin(), known.end());
  std::string list;
  for (size_t i = 0; i < known.size(); ++i)
    list += (i == 0 ? "" : i + 1 == known.size() ? " and " : ", ") + known[i];
  throw ValueError("[device] unknown device '" + std::string(name) + "'; known devices are " +
                   list);
}

std::vector<std::string> available_devices() {
  std::vector<std::string> r;
  for (const detail::DeviceEntry& e : detail::kDevices)
    if (e.available()) r.push_back(e.name);
  return r;
}

Device default_device() {
  if (const char* env = std::getenv("RNNCORE_DEVICE"); env && *env) {
    Device d = parse_device(env);
    if (d != Device::Auto) return d;
  }
  for (const detail::DeviceEntry& e : detail::kDevices)
    if (e.picked_by_auto && e.available()) return e.device;
  return Device::Cpu;
}

}  // namespace rnncore
