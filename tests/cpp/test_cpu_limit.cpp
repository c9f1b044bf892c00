// The control groups' CPU quota (the thread pool's default size) read from directories of
// the files Linux shows: /proc/self/cgroup, /proc/self/mountinfo and the groups' quota
// files, for cgroup v2, v1 and both at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cpu/cpu_limit.hpp"

namespace fs = std::filesystem;
using rnncore::cpu::cgroup_cpu_limit;

namespace {

class CpuLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / (std::string("rnncore_cpu_limit_") + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    const fs::path file = root_ / fs::path(path).relative_path();
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  double limit() const { return cgroup_cpu_limit(root_.string()); }

  fs::path root_;
};

#if defined(__linux__)
// mountinfo lines as a systemd host shows them.
const char* kV2Mount =
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
const char* kOtherMounts =
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
    "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n";

TEST_F(CpuLimit, V2TheLeastQuotaOnThePathToTheRoot) {
  write("/proc/self/mountinfo", std::string(kOtherMounts) + kV2Mount);
  write("/proc/self/cgroup", "0::/user.slice/job.scope\n");
  write("/sys/fs/cgroup/user.slice/job.scope/cpu.max", "max 100000\n");
  write("/sys/fs/cgroup/user.slice/cpu.max", "250000 100000\n");
  EXPECT_DOUBLE_EQ(limit(), 2.5);
  write("/sys/fs/cgroup/user.slice/job.scope/cpu.max", "75000 50000\n");
  EXPECT_DOUBLE_EQ(limit(), 1.5);
  write("/sys/fs/cgroup/cpu.max", "50000 100000\n");  // a namespace's root shows its own
  EXPECT_DOUBLE_EQ(limit(), 0.5);
}

TEST_F(CpuLimit, V2NoQuota) {
  write("/proc/self/mountinfo", kV2Mount);
  write("/proc/self/cgroup", "0::/a\n");
  write("/sys/fs/cgroup/a/cpu.max", "max 100000\n");
  EXPECT_EQ(limit(), 0);
}

TEST_F(CpuLimit, V1MountOfASubtree) {
  // A container without its own cgroup namespace: its group is the mount's root.
  write("/proc/self/mountinfo",
        std::string(kOtherMounts) +
            "40 30 0:35 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup "
            "rw,cpu,cpuacct\n"
            "41 30 0:36 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n");
  write("/proc/self/cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n");
  write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
  write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(limit(), 1.5);
  write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(limit(), 0);
}

TEST_F(CpuLimit, V1PathOutsideTheMountIsNotRead) {
  write("/proc/self/mountinfo",
        "40 30 0:35 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
  write("/proc/self/cgroup", "4:cpu:/docker/abcd\n");
  write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "100000\n");
  write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit(), 0);
}

TEST_F(CpuLimit, HybridCountsBothHierarchies) {
  write("/proc/self/mountinfo",
        std::string(kV2Mount) +
            "36 24 0:31 / /sys/fs/cgroup/cpu\\040ctl rw - cgroup cgroup rw,cpu\n");
  write("/proc/self/cgroup", "1:cpu:/x/y\n0::/x/y\n");
  write("/sys/fs/cgroup/cpu ctl/x/cpu.cfs_quota_us", "300000\n");
  write("/sys/fs/cgroup/cpu ctl/x/cpu.cfs_period_us", "100000\n");
  write("/sys/fs/cgroup/cpu ctl/x/y/cpu.cfs_quota_us", "-1\n");
  write("/sys/fs/cgroup/cpu ctl/x/y/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(limit(), 3.0);
  write("/sys/fs/cgroup/x/y/cpu.max", "200000 100000\n");
  EXPECT_DOUBLE_EQ(limit(), 2.0);
}

TEST_F(CpuLimit, NothingReadableIsNoLimit) {
  EXPECT_EQ(limit(), 0);
  write("/proc/self/cgroup", "0::/a\n");  // no mountinfo
  EXPECT_EQ(limit(), 0);
  write("/proc/self/mountinfo", "garbage\n\n35 24 0:30 / /sys/fs/cgroup rw - cgroup2\n");
  EXPECT_EQ(limit(), 0);
  write("/proc/self/mountinfo", kV2Mount);
  write("/sys/fs/cgroup/a/cpu.max", "100000\n");  // no period
  EXPECT_EQ(limit(), 0);
  write("/sys/fs/cgroup/a/cpu.max", "0 100000\n");
  EXPECT_EQ(limit(), 0);
}
#endif

TEST(CpuLimitHere, ThisProcessIsNotNegative) { EXPECT_GE(cgroup_cpu_limit(), 0); }

}  // namespace
