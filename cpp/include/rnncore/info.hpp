// What this build of rnncore is: version, BLAS, compiler, devices.
#pragma once

#include <string>
#include <vector>

namespace rnncore {

struct BuildInfo {
  std::string version;
  std::string blas;      // the BLAS library in use, with its configuration when known
  std::string compiler;
  std::vector<std::string> devices;
};

const char* version();
BuildInfo build_info();

}  // namespace rnncore
