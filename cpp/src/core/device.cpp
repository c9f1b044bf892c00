#include "rnncore/device.hpp"

#include <cstdlib>
#include <string>

#include "core/backend.hpp"
#include "rnncore/error.hpp"

namespace rnncore {

const char* device_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Metal: return "metal";
    case Device::MetalEmulated: return "metal-emulated";
  }
  return "?";
}

Device parse_device(std::string_view name) {
  if (name.empty() || name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "metal") return Device::Metal;
  if (name == "metal-emulated") return Device::MetalEmulated;
  throw ValueError("[device] unknown device '" + std::string(name) +
                   "'; known devices are 'cpu', 'metal' and 'metal-emulated'");
}

std::vector<std::string> available_devices() {
  std::vector<std::string> r;
  if (detail::metal_available()) r.push_back("metal");
  r.push_back("cpu");
  if (detail::emulator_available()) r.push_back("metal-emulated");
  return r;
}

Device default_device() {
  if (const char* env = std::getenv("RNNCORE_DEVICE"); env && *env) {
    Device d = parse_device(env);
    if (d != Device::Auto) return d;
  }
  return detail::metal_available() ? Device::Metal : Device::Cpu;
}

}  // namespace rnncore
