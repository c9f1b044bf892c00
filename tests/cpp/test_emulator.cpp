// The host emulator checks itself: threadgroup memory and barriers behave as on the GPU, a
// missing barrier gives a wrong answer a test can see, barriers some threads skip or reach
// at different call sites raise, simd reductions and shuffles respect partial simdgroups
// (inactive lanes read as NaN), what Metal refuses raises (a function constant or an
// argument the dispatch does not provide), arguments bind by the indices of the kernel's
// signature, the threadgroup orders are what they say, and neither the shuffled schedule
// nor the threadgroup order changes anything for real kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "metal/emulator/half.hpp"
#include "metal/executor.hpp"
#include "rnncore/error.hpp"
#include "rnncore/rnncore.hpp"

int emulator_selftest_linked();

namespace {

using namespace rnncore::metal;

// One threadgroup of data.size() threads of selftest kernel `name`, data bound at index 0.
Dispatch selftest(const std::string& name, const std::vector<float>& data) {
  Dispatch d;
  d.kernel = name;
  d.buffers.push_back({0, Buffer::State, 0});
  d.threadgroup_memory = static_cast<uint32_t>(data.size() * 4);
  d.threads = {data.size(), 1, 1};
  return d;
}

// Runs dispatch d on data (in place; Buffer::State) and extra (Buffer::Source).
void run(const Dispatch& d, std::vector<float>& data, std::vector<float>* extra = nullptr) {
  (void)emulator_selftest_linked();
  Plan plan;
  HostArrays arrays{};
  plan.sizes[static_cast<int>(Buffer::State)] = static_cast<int64_t>(data.size() * 4);
  arrays[static_cast<int>(Buffer::State)] = data.data();
  if (extra) {
    plan.sizes[static_cast<int>(Buffer::Source)] = static_cast<int64_t>(extra->size() * 4);
    arrays[static_cast<int>(Buffer::Source)] = extra->data();
  }
  plan.dispatches.push_back(d);
  emulator_executor().run(plan, arrays);
}

// Runs selftest kernel `name` over one threadgroup of n threads on data (in place).
void run(const std::string& name, std::vector<float>& data) { run(selftest(name, data), data); }

// The DeviceError message of running d, or "" if it runs.
std::string error_of(const Dispatch& d, std::vector<float>& data,
                     std::vector<float>* extra = nullptr) {
  try {
    run(d, data, extra);
  } catch (const rnncore::DeviceError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
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

struct OrderEnv {
  explicit OrderEnv(const char* value) { setenv("RNNCORE_EMULATOR_ORDER", value, 1); }
  ~OrderEnv() { unsetenv("RNNCORE_EMULATOR_ORDER"); }
};

// selftest_neighbour_sum over 100 threads: each adds its right neighbour's value, which it
// reads from threadgroup memory after a barrier.
void expect_neighbour_sums(const char* schedule) {
  std::vector<float> v = iota(100);
  run("selftest_neighbour_sum", v);
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(v[i], float(i + 1) + float((i + 1) % 100 + 1)) << schedule << " thread " << i;
}

TEST(Emulator, BarrierMakesThreadgroupMemoryVisible) {
  for (const char* schedule : {"ordered", "shuffle:1", "shuffle:2"}) {
    ScheduleEnv env(schedule);
    expect_neighbour_sums(schedule);
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
  const std::string m = error_of(selftest("selftest_divergent_barrier", v), v);
  EXPECT_TRUE(contains(m, "selftest_divergent_barrier")) << m;
  EXPECT_TRUE(contains(m, "without reaching the threadgroup_barrier")) << m;
}

TEST(Emulator, ThreadsAtDifferentBarriersRaise) {
  std::vector<float> v = iota(64);
  const std::string m = error_of(selftest("selftest_different_barriers", v), v);
  EXPECT_TRUE(contains(m, "different threadgroup_barrier")) << m;
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
  const std::string m = error_of(selftest("selftest_divergent_simd", v), v);
  EXPECT_TRUE(contains(m, "simd")) << m;
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
    expect_neighbour_sums(schedule);
  }
}

TEST(Emulator, UnknownKernelRaises) {
  std::vector<float> v = iota(4);
  EXPECT_THROW(run("no_such_kernel", v), rnncore::DeviceError);
}

// Metal cannot specialise a function without a value for a function constant it uses; the
// emulator raises when a kernel reads one the dispatch does not set (or sets as another
// type), naming the kernel and the constant.
TEST(Emulator, ReadingAFunctionConstantTheDispatchDoesNotSetRaises) {
  std::vector<float> v = iota(8);
  Dispatch d = selftest("selftest_scaled", v);
  const std::string missing = error_of(d, v);
  EXPECT_TRUE(contains(missing, "selftest_scaled")) << missing;
  EXPECT_TRUE(contains(missing, "function constant 'selftest_scale' (index 63)")) << missing;
  EXPECT_TRUE(contains(missing, "does not set")) << missing;

  d.constants = {{63, FunctionConstant::Type::Bool, 1}};
  const std::string mistyped = error_of(d, v);
  EXPECT_TRUE(contains(mistyped, "sets as a bool")) << mistyped;

  d.constants = {{63, FunctionConstant::Type::Int, 3}};
  v = iota(8);
  run(d, v);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], 3.0f * float(i + 1)) << i;
}

// An argument with function_constant(flag) needs flag set; when it is false the argument
// does not exist (nothing need be bound), when true it must be bound like any other.
TEST(Emulator, ConditionalArgumentFollowsItsFunctionConstant) {
  std::vector<float> v = iota(8), extra(8, 10.0f);
  Dispatch d = selftest("selftest_conditional", v);
  const std::string unset = error_of(d, v);
  EXPECT_TRUE(contains(unset,
                       "argument 'extra' is conditional on function constant "
                       "'selftest_has_extra' (index 62)"))
      << unset;

  d.constants = {{62, FunctionConstant::Type::Bool, 0}};
  run(d, v);
  EXPECT_EQ(v, iota(8));

  d.constants = {{62, FunctionConstant::Type::Bool, 1}};
  const std::string unbound = error_of(d, v);
  EXPECT_TRUE(contains(unbound, "argument 'extra' [[buffer(1)]] is not bound")) << unbound;

  d.buffers.push_back({1, Buffer::Source, 0});
  run(d, v, &extra);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], float(i + 1) + 10.0f) << i;
}

// The emulator binds each argument at the index its [[buffer(i)]] names, as Metal does:
// a kernel whose signature names another index than the host binds fails.
TEST(Emulator, ArgumentsBindAtTheIndicesOfTheSignature) {
  std::vector<float> v = iota(8);
  Dispatch d = selftest("selftest_data_at_index_one", v);  // the host binds index 0
  const std::string wrong = error_of(d, v);
  EXPECT_TRUE(contains(wrong,
                       "kernel 'selftest_data_at_index_one': argument 'data' "
                       "[[buffer(1)]] is not bound"))
      << wrong;
  EXPECT_EQ(v, iota(8));

  d.buffers = {{1, Buffer::State, 0}};
  run(d, v);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], float(i + 2)) << i;

  // Parameters in one order, indices in the other.
  std::vector<float> out(8, 0.0f), in = iota(8);
  Dispatch s = selftest("selftest_swapped_indices", out);
  s.buffers = {{0, Buffer::State, 0}, {1, Buffer::Source, 0}};
  run(s, out, &in);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], 2.0f * float(i + 1)) << i;

  s.buffers.push_back({1, Buffer::Source, 0});
  EXPECT_TRUE(contains(error_of(s, out, &in), "binds two arguments at index 1"));
}

// RNNCORE_EMULATOR_ORDER: on one OS thread, threadgroups start in grid order, in reverse,
// or in a permutation drawn from the seed (the same for the same seed).
TEST(Emulator, ThreadgroupOrders) {
  auto& pool = rnncore::cpu::ThreadPool::instance();
  const int threads = pool.max_threads();
  pool.set_max_threads(1);
  const size_t n = 16;
  const auto order = [&](const char* setting) {
    OrderEnv env(setting);
    std::vector<float> v(n + 1, 0.0f);
    Dispatch d = selftest("selftest_group_order", v);
    d.threads = {1, 1, 1};
    d.threadgroups = {n, 1, 1};
    d.threadgroup_memory = 0;
    run(d, v);
    EXPECT_EQ(v[0], float(n)) << setting;
    return std::vector<float>(v.begin() + 1, v.end());
  };
  std::vector<float> forward(n), reverse(n);
  for (size_t g = 0; g < n; ++g) forward[g] = float(g), reverse[g] = float(n - 1 - g);
  EXPECT_EQ(order("forward"), forward);
  EXPECT_EQ(order("reverse"), reverse);
  const std::vector<float> random1 = order("random:1"), random2 = order("random:2");
  EXPECT_NE(random1, forward);
  EXPECT_NE(random1, reverse);
  EXPECT_NE(random1, random2);
  EXPECT_EQ(order("random:1"), random1);
  std::vector<float> sorted = random1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, forward);  // a permutation: every threadgroup ran once
  pool.set_max_threads(threads);

  OrderEnv bad("sideways");
  std::vector<float> v = iota(4);
  EXPECT_THROW(run("selftest_simd_sum", v), rnncore::ValueError);
}

// The library's kernels give bit-identical results in every schedule and threadgroup order:
// no kernel depends on the order threads run in between synchronisation points, nor on
// the order of threadgroups.
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
  const std::pair<const char*, const char*> settings[] = {
      {"ordered", "forward"}, {"shuffle:7", "forward"}, {"shuffle:8", "forward"},
      {"ordered", "reverse"}, {"ordered", "random:5"},  {"shuffle:9", "random:6"}};
  for (const auto& [schedule, order] : settings) {
    for (bool reset_after : {false, true}) {
      ScheduleEnv env(schedule);
      OrderEnv order_env(order);
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

namespace {

TEST(EmulatorSimdgroupMatrix, LoadStoreTransposeOriginAndProduct) {
  std::vector<float> v(384, -7.0f);
  for (int i = 0; i < 128; ++i) v[size_t(i)] = float((i * 37) % 19) - 9.0f;  // A, B
  std::vector<float> in = v;
  run("selftest_simdgroup_matrix", v);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      float acc = 1.0f;  // C = A Bt + 1, k in order
      for (int k = 0; k < 8; ++k)
        acc = std::fma(in[size_t(r * 8 + k)], in[size_t(64 + c * 8 + k)], acc);
      EXPECT_EQ(v[size_t(128 + r * 8 + c)], acc) << r << "," << c;
      EXPECT_EQ(v[size_t(192 + c * 8 + r)], in[size_t(r * 8 + c)]);       // At
      EXPECT_EQ(v[size_t(256 + r * 16 + 8 + c)], in[size_t(r * 8 + c)]);  // W[:, 8:16] = A
      EXPECT_EQ(v[size_t(256 + r * 16 + c)], -7.0f);                      // W[:, 0:8] untouched
    }
}

TEST(EmulatorSimdgroupMatrix, MisuseRaises) {
  std::vector<float> v = iota(384);
  std::string m = error_of(selftest("selftest_simdgroup_matrix_divergent", v), v);
  EXPECT_TRUE(contains(m, "divergent")) << m;
  v = iota(384);
  m = error_of(selftest("selftest_simdgroup_matrix_nonuniform", v), v);
  EXPECT_TRUE(contains(m, "arguments that differ between lanes")) << m;
  // A simdgroup of 16 lanes: the matrix needs all 32.
  v = iota(384);
  Dispatch d = selftest("selftest_simdgroup_matrix", v);
  d.threads = {16, 1, 1};
  m = error_of(d, v);
  EXPECT_TRUE(contains(m, "inactive lanes")) << m;
}

}  // namespace
