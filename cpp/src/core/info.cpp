#include "rnncore/info.hpp"

#include "cpu/blas.hpp"
#include "cpu/cpu_limit.hpp"
#include "cpu/fused.hpp"
#include "cpu/thread_pool.hpp"
#include "rnncore/device.hpp"

namespace rnncore {

const char* version() { return RNNCORE_VERSION; }

BuildInfo build_info() {
  BuildInfo b;
  b.version = RNNCORE_VERSION;
  b.blas = cpu::blas_info();
#if defined(__clang__)
  b.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  b.compiler = std::string("gcc ") + __VERSION__;
#else
  b.compiler = "unknown";
#endif
  b.devices = available_devices();
  b.threads = num_threads();
  b.kernels = cpu::fused_kernels().isa;
  b.cpu_quota = cpu::cgroup_cpu_limit();
  return b;
}

void set_num_threads(int n) { cpu::ThreadPool::instance().set_max_threads(n); }

int num_threads() { return cpu::ThreadPool::instance().max_threads(); }

}  // namespace rnncore
