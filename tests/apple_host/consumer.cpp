// A C++ application that uses metal-cpp itself and links rnncore: it defines metal-cpp's
// implementation tables in its own translation unit, as metal-cpp tells every application to,
// without the visibility macro. rnncore's copy of those tables must not clash with these:
// tests/test_apple_host.py links this with rnncore's Metal object on Linux, and the macOS
// workflow links it (consumer/) with the installed library and runs it.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>
#include <rnncore/device.hpp>
#include <string>

// The application's own Metal use, and rnncore's view of the same machine.
std::string consumer_devices() {
  std::string report = "application: ";
  if (MTL::Device* device = MTL::CreateSystemDefaultDevice()) {
    report += device->name()->utf8String();
    report += device->supportsFamily(MTL::GPUFamilyApple7) ? " (Apple7)" : " (not Apple7)";
    device->release();
  } else {
    report += "no default Metal device";
  }
  report += "; rnncore:";
  for (const std::string& name : rnncore::available_devices()) report += " " + name;
  return report;
}
