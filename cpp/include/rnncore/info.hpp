// What this build of rnncore is: version, BLAS, compiler, devices.
#pragma once

#include <string>
#include <vector>

namespace rnncore {

struct BuildInfo {
  std::string version;
  std::string blas;  // the BLAS library in use, with its configuration when known
  std::string compiler;
  int threads = 1;      // threads a call may use (RNNCORE_NUM_THREADS, set_num_threads)
  std::string kernels;  // the CPU kernel variant: avx512, avx2 or generic
  // CPUs' worth of time the process's cgroups allow (Linux), which bounds the default
  // thread count; 0 when no quota is set.
  double cpu_quota = 0;
  std::vector<std::string> devices;
};

const char* version();
BuildInfo build_info();

// Threads a call may use; 0 restores the default (RNNCORE_NUM_THREADS, else every usable
// core: those of the CPU affinity, no more than the whole CPUs of the cgroups' quota).
void set_num_threads(int n);
int num_threads();

}  // namespace rnncore
