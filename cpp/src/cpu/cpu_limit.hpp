// The CPU time a Linux control group allows the process, for the thread pool's default size.
#pragma once

#include <string>

namespace rnncore::cpu {

// CPUs' worth of time a second that the process's control groups allow it: the least quota
// / period along its group's path up to the hierarchy's root, in cgroup v2 (cpu.max) and
// in v1's cpu controller (cpu.cfs_quota_us, cpu.cfs_period_us); 0 when no quota is set or
// nothing can be read (and off Linux). Every path read is prefixed with `root` (the tests
// give a directory of such files).
double cgroup_cpu_limit(const std::string& root = "");

}  // namespace rnncore::cpu
