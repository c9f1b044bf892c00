// The host emulator checks itself: threadgroup memory and barriers behave as on the GPU, a
// missing barrier gives a wrong answer a test can see, barriers some threads skip or reach
// at different call sites raise, simd reductions and shuffles respect partial simdgroups
// (inactive lanes read as NaN), and the shuffled schedule changes nothing for real kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "metal/emulator/registry.hpp"
#include "metal/executor.hpp"
#include "rnncore/error.hpp"
#include "rnncore/rnncore.hpp"

int emulator_selftest_linked();

namespace {

using namespace rnncore::metal;

// Runs selftest kernel `name` over one threadgroup of n threads on data (in place).
void run(const std::string& name, std::vector<float>& data) {
  (void)emulator_selftest_linked();
  Plan plan;
  plan.sizes[static_cast<int>(Buffer::State)] = static_cast<int64_t>(data.size() * 4);
  Dispatch d;
  d.kernel = name;
  d.buffers.push_back({0, Buffer::State, 0});
  d.threadgroup_memory = static_cast<uint32_t>(data.size() * 4);
  d.threads = {data.size(), 1, 1};
  plan.dispatches.push_back(d);
  HostArrays arrays{};
  arrays[static_cast<int>(Buffer::State)] = data.data();
  emulator_executor().run(plan, arrays);
}

std::vector<float> iota(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i + 1);
  return v;
}

struct ScheduleEnv {
  explicit ScheduleEnv(const char* value) { setenv("RNNCORE_EMULATOR_SCHEDULE", value, 1); }
  ~ScheduleEnv() { unsetenv("RNNCORE_EMULATOR_SCHEDULE"); }
};

TEST(Emulator, BarrierMakesThreadgroupMemoryVisible) {
  for (const char* schedule : {"ordered", "shuffle:1", "shuffle:2"}) {
    ScheduleEnv env(schedule);
    std::vector<float> v = iota(100);
    run("selftest_neighbour_sum", v);
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(v[i], float(i + 1) + float((i + 1) % 100 + 1)) << schedule << " thread " << i;
  }
}

TEST(Emulator, MissingBarrierGivesAWrongAnswer) {
  std::vector<float> v = iota(64);
  run("selftest_neighbour_sum_no_barrier", v);
  // Threads run until they block; with no barrier thread i reads its neighbour's slot
  // before the neighbour wrote it, and unwritten threadgroup memory is NaN.
  size_t wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) wrong += !(v[i] == float(i + 1) + float((i + 1) % 64 + 1));
  EXPECT_GT(wrong, 0u);
  EXPECT_TRUE(std::isnan(v[0]));
}

TEST(Emulator, BarrierSkippedBySomeThreadsRaises) {
  std::vector<float> v = iota(64);
  try {
    run("selftest_divergent_barrier", v);
    FAIL() << "no error";
  } catch (const rnncore::DeviceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("selftest_divergent_barrier"), std::string::npos) << m;
    EXPECT_NE(m.find("without reaching the threadgroup_barrier"), std::string::npos) << m;
  }
}

TEST(Emulator, ThreadsAtDifferentBarriersRaise) {
  std::vector<float> v = iota(64);
  try {
    run("selftest_different_barriers", v);
    FAIL() << "no error";
  } catch (const rnncore::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("different threadgroup_barrier"), std::string::npos)
        << e.what();
  }
}

TEST(Emulator, SimdSumCoversActiveLanesOfPartialSimdgroups) {
  std::vector<float> v = iota(40);  // a full simdgroup and one of 8 lanes
  run("selftest_simd_sum", v);
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(v[i], 528.0f) << i;   // 1 + ... + 32
  for (size_t i = 32; i < 40; ++i) EXPECT_EQ(v[i], 292.0f) << i;  // 33 + ... + 40
}

TEST(Emulator, InactiveLanesReadAsPoison) {
  std::vector<float> v = iota(40);
  run("selftest_simd_shuffle_down", v);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(v[i], float(i + 9)) << i;
  for (size_t i = 24; i < 32; ++i) EXPECT_TRUE(std::isnan(v[i])) << i;  // lanes 32.. do not exist
  EXPECT_TRUE(std::isnan(v[32]));  // the second simdgroup has lanes 0..7 only
}

TEST(Emulator, SimdOperationInDivergentControlFlowRaises) {
  std::vector<float> v = iota(32);
  try {
    run("selftest_divergent_simd", v);
    FAIL() << "no error";
  } catch (const rnncore::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("simd"), std::string::npos) << e.what();
  }
}

// A scheduler error abandons threads mid-run; their fibers are restarted for the next
// kernel, whose frames reuse the same stacks. Under AddressSanitizer the abandoned frames'
// redzones must not outlive them (a false stack-buffer-overflow in the next kernel), and
// the results must not depend on what the abandoned kernel left.
TEST(Emulator, KernelAfterAnAbandonedKernelRuns) {
  for (const char* schedule : {"ordered", "shuffle:3"}) {
    ScheduleEnv env(schedule);
    std::vector<float> v = iota(64);
    EXPECT_THROW(run("selftest_abandoned_in_a_deep_frame", v), rnncore::DeviceError);
    for (size_t n : {64, 40, 96}) {
      std::vector<float> w = iota(n);
      run("selftest_large_frame", w);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(w[i], float(i + 1)) << schedule << " " << i;
    }
    std::vector<float> u = iota(100);
    run("selftest_neighbour_sum", u);
    for (size_t i = 0; i < u.size(); ++i)
      EXPECT_EQ(u[i], float(i + 1) + float((i + 1) % 100 + 1)) << schedule << " thread " << i;
  }
}

TEST(Emulator, UnknownKernelRaises) {
  std::vector<float> v = iota(4);
  EXPECT_THROW(run("no_such_kernel", v), rnncore::DeviceError);
}

// The library's kernels give bit-identical results in every schedule: no kernel depends on
// the order threads run in between synchronisation points.
TEST(Emulator, ShuffledScheduleMatchesOrderedForTheKernels) {
  using namespace rnncore;
  const int64_t T = 4, N = 5, I = 6, H = 33;
  std::vector<float> x(T * N * I), W(2 * 3 * H * I), R(2 * 3 * H * H), b(2 * 3 * H);
  uint32_t s = 1;
  const auto fill = [&](std::vector<float>& a) {
    for (float& e : a) e = float((s = s * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f;
  };
  fill(x), fill(W), fill(R), fill(b);
  GRUDescriptor desc;
  desc.bidirectional = true;
  desc.training = true;
  GRUInputs in;
  in.source = TensorView(x.data(), {T, N, I});
  in.recurrent_weight = TensorView(R.data(), {2, 3 * H, H});
  in.input_weight = TensorView(W.data(), {2 * 3 * H, I});
  in.bias = TensorView(b.data(), {2 * 3 * H});
  std::vector<std::vector<float>> results;
  for (const char* schedule : {"ordered", "shuffle:7", "shuffle:8"}) {
    for (bool reset_after : {false, true}) {
      ScheduleEnv env(schedule);
      desc.reset_after = reset_after;
      const GRUResults r = gru(in, desc, Device::MetalEmulated);
      const float* p = r.state.ptr<float>();
      results.emplace_back(p, p + r.state.numel());
    }
  }
  for (size_t i = 2; i < results.size(); ++i) EXPECT_EQ(results[i], results[i % 2]) << i;
}

}  // namespace

namespace {

using rnncore::metal::emu::float_to_half_bits;
using rnncore::metal::emu::half_bits_to_float;

TEST(EmulatorHalf, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f)))) << h;
      continue;
    }
    EXPECT_EQ(float_to_half_bits(f), h) << h;
  }
}

TEST(EmulatorHalf, RoundsToNearestEven) {
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + std::ldexp(1.0f, -11))), 1.0f);  // tie
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));                                 // tie to even, upwards
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(65504.0f)), 65504.0f);  // largest half
  EXPECT_TRUE(std::isinf(half_bits_to_float(float_to_half_bits(65520.0f))));  // rounds to inf
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(std::ldexp(1.0f, -25))), 0.0f);  // tie to 0
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(3 * std::ldexp(1.0f, -26))),
            std::ldexp(1.0f, -24));
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
}

}  // namespace
