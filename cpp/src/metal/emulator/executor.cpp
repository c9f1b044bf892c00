// The host emulator as an Executor: runs a plan's dispatches in order, every threadgroup's
// threads as fibers (scheduler.cpp) over the kernels compiled from the .metal sources
// (kernels.cpp). Workspace and threadgroup memory start as NaN, so a kernel that reads what
// nobody wrote produces NaN instead of a plausible number. What Metal would refuse, it
// refuses too (DeviceError): a kernel argument its signature binds that the dispatch leaves
// unbound, an argument conditional on a function constant the dispatch does not set, and a
// kernel reading a function constant the dispatch does not set.
//
// RNNCORE_EMULATOR_SCHEDULE=shuffle[:seed] runs the threads of each threadgroup in a random
// order each round (default: in order); results must not depend on it.
// RNNCORE_EMULATOR_ORDER=forward|reverse|random[:seed] is the order the threadgroups of a
// dispatch start in (default forward: threadgroup (0,0,0), (1,0,0), ...); random draws a
// permutation per dispatch. The emulator's OS threads take threadgroups from that sequence
// in turn (one thread: exactly that order). Results must not depend on it either.
#include "metal/executor.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "metal/apple_rules.hpp"
#include "metal/emulator/registry.hpp"
#include "rnncore/error.hpp"
#include "rnncore/metal_counts.hpp"

namespace rnncore::metal::emu {

int emulated_kernels_linked();
int counted_kernels_linked();

namespace {

std::unordered_map<std::string, KernelEntry>& kernels() {
  static std::unordered_map<std::string, KernelEntry> k;
  return k;
}
std::unordered_map<std::string, KernelEntry>& counted_kernels() {
  static std::unordered_map<std::string, KernelEntry> k;
  return k;
}

// Metal counting (rnncore/metal_counts.hpp): on or off, and what it recorded.
struct Counting {
  std::mutex m;
  bool on = false;
  std::vector<DispatchCount> records;
  // Per distinct dispatch (kernel, constants, grid): how often measured, and the last counts.
  std::unordered_map<std::string, std::pair<int, DispatchCount>> seen;
  uint64_t plans = 0;
};
Counting& counting() {
  static Counting c;
  return c;
}

Schedule schedule_from_env() {
  Schedule s;
  const char* env = std::getenv("RNNCORE_EMULATOR_SCHEDULE");
  if (!env || !*env || std::string(env) == "ordered") return s;
  const std::string v(env);
  if (v.rfind("shuffle", 0) != 0)
    throw ValueError(
        "[metal-emulated] RNNCORE_EMULATOR_SCHEDULE must be 'ordered' or "
        "'shuffle[:seed]', not '" +
        v + "'");
  s.shuffle = true;
  if (v.size() > 8 && v[7] == ':') s.seed = std::strtoull(v.c_str() + 8, nullptr, 10);
  return s;
}

// The emulated pipelines' maxTotalThreadsPerThreadgroup (RNNCORE_EMULATOR_MAX_THREADS, default
// 1024): lower, it runs an adapting kernel with fewer threads as a GPU would for a kernel with
// many registers (apple::threads_for_pipeline), and refuses the others.
uint64_t max_threads_from_env() {
  const char* env = std::getenv("RNNCORE_EMULATOR_MAX_THREADS");
  if (!env || !*env) return Limits::max_threads_per_threadgroup;
  const std::string v(env);
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (*end != '\0' || n < 1 || n > Limits::max_threads_per_threadgroup)
    throw ValueError(
        "[metal-emulated] RNNCORE_EMULATOR_MAX_THREADS must be a number of threads "
        "from 1 to 1024, not '" +
        v + "'");
  return n;
}

enum class GroupOrder { Forward, Reverse, Random };
struct Order {
  GroupOrder kind = GroupOrder::Forward;
  uint64_t seed = 0;
};

Order order_from_env() {
  Order o;
  const char* env = std::getenv("RNNCORE_EMULATOR_ORDER");
  if (!env || !*env) return o;
  const std::string v(env);
  if (v == "forward") return o;
  if (v == "reverse") {
    o.kind = GroupOrder::Reverse;
    return o;
  }
  const auto digits = [](const std::string& d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
  };
  if (v == "random" || (v.rfind("random:", 0) == 0 && digits(v.substr(7)))) {
    o.kind = GroupOrder::Random;
    if (v.size() > 7) o.seed = std::strtoull(v.c_str() + 7, nullptr, 10);
    return o;
  }
  throw ValueError(
      "[metal-emulated] RNNCORE_EMULATOR_ORDER must be 'forward', 'reverse' or "
      "'random[:seed]', not '" +
      v + "'");
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The linear threadgroup indices of a grid of `groups` in the order they start: forward,
// reverse, or a permutation drawn from the seed and the dispatch's position in the plan.
std::vector<uint64_t> group_sequence(const Order& order, uint64_t groups, uint64_t dispatch) {
  std::vector<uint64_t> seq(groups);
  std::iota(seq.begin(), seq.end(), uint64_t{0});
  if (order.kind == GroupOrder::Reverse) std::reverse(seq.begin(), seq.end());
  if (order.kind == GroupOrder::Random) {
    uint64_t state = order.seed ^ (0xD1B54A32D192ED03ull * (dispatch + 1));
    for (uint64_t i = groups; i > 1; --i) std::swap(seq[i - 1], seq[splitmix64(state) % i]);
  }
  return seq;
}

std::string argument_name(const std::string& kernel, const ArgSpec& a) {
  return "[metal-emulated] kernel '" + kernel + "': argument '" + a.name + "'";
}

// The function-constant values a dispatch sets.
ConstantValues constant_values(const Dispatch& d) {
  ConstantValues values;
  for (const FunctionConstant& c : d.constants) {
    if (c.index >= uint32_t(ConstantValues::kCount))
      throw DeviceError("[metal-emulated] dispatch of '" + d.kernel + "' sets function constant " +
                        std::to_string(c.index) + ", beyond the emulator's " +
                        std::to_string(ConstantValues::kCount));
    values.value[c.index] = c.value;
    values.defined[c.index] = true;
    values.is_bool[c.index] = c.type == FunctionConstant::Type::Bool;
  }
  return values;
}

// Per kernel parameter, what the dispatch binds at the index its signature names; raises
// for what Metal would refuse.
struct Arguments {
  std::vector<void*> args;                // null: absent, or not a buffer
  std::vector<size_t> threadgroup_slots;  // parameters that get the threadgroup block
};

Arguments bind_arguments(const Dispatch& d, const KernelEntry& k, const ConstantValues& values,
                         void* const* base) {
  void* slot[kMaxBufferIndex + 1] = {};
  bool bound[kMaxBufferIndex + 1] = {};
  const auto bind = [&](uint32_t index, void* p, const char* what) {
    if (index > uint32_t(kMaxBufferIndex))
      throw DeviceError("[metal-emulated] dispatch of '" + d.kernel + "' binds " + what +
                        " at index " + std::to_string(index) + " (Metal has 0.." +
                        std::to_string(kMaxBufferIndex) + ")");
    if (bound[index])
      throw DeviceError("[metal-emulated] dispatch of '" + d.kernel +
                        "' binds two arguments at index " + std::to_string(index));
    slot[index] = p;
    bound[index] = true;
  };
  for (const Binding& b : d.buffers) {
    // A buffer of no bytes has no storage: bound, never read (null, not null + offset).
    char* start = static_cast<char*>(base[static_cast<int>(b.buffer)]);
    bind(b.index, start ? start + b.offset : nullptr, "a buffer");
  }
  for (const BytesArg& b : d.bytes) bind(b.index, const_cast<uint8_t*>(b.data.data()), "bytes");

  Arguments bound_args;
  std::vector<void*>& args = bound_args.args;
  args.assign(k.count, nullptr);
  for (size_t i = 0; i < k.count; ++i) {
    const ArgSpec& a = k.args[i];
    if (a.kind != ArgKind::Buffer && a.kind != ArgKind::Threadgroup) continue;
    if (a.constant >= 0) {
      if (!values.defined[a.constant])
        throw DeviceError(argument_name(d.kernel, a) + " is conditional on function constant '" +
                          a.constant_name + "' (index " + std::to_string(a.constant) +
                          "), which the dispatch does not set");
      if (!values.value[a.constant]) continue;  // absent, as in Metal: null
    }
    if (a.kind == ArgKind::Threadgroup) {
      if (d.threadgroup_memory == 0)
        throw DeviceError(argument_name(d.kernel, a) + " [[threadgroup(" + std::to_string(a.index) +
                          ")]] has no threadgroup memory (the dispatch sets none)");
      bound_args.threadgroup_slots.push_back(i);
      continue;
    }
    if (!bound[a.index])
      throw DeviceError(argument_name(d.kernel, a) + " [[buffer(" + std::to_string(a.index) +
                        ")]] is not bound by the dispatch");
    args[i] = slot[a.index];
  }
  return bound_args;
}

// Sets the dispatch state of the calling OS thread for the kernel code it runs.
class DispatchScope {
 public:
  explicit DispatchScope(const DispatchState* state) : outer_(g_dispatch) { g_dispatch = state; }
  ~DispatchScope() { g_dispatch = outer_; }
  DispatchScope(const DispatchScope&) = delete;
  DispatchScope& operator=(const DispatchScope&) = delete;

 private:
  const DispatchState* outer_;
};

// NaN in every element: float32 NaN words, or two 16-bit NaNs per word (0x7FC0 is a NaN
// as float16 and as bfloat16).
void poison(std::vector<float>& v, int64_t element_size = 4) {
  uint32_t bits = 0x7FC00000u;
  if (element_size == 2) bits = 0x7FC07FC0u;
  float f;
  std::memcpy(&f, &bits, 4);
  std::fill(v.begin(), v.end(), f);
}

// Counting runs one threadgroup per class of alike ones: along each grid axis the first,
// one interior and the last position (a kernel treats its threadgroups alike but for
// partial tiles and first steps at the edges), each weighted by its class's size.
void representatives(const Size3& grid, std::vector<uint64_t>* sequence,
                     std::vector<uint64_t>* weight) {
  auto axis = [](uint64_t n) {
    std::vector<std::pair<uint64_t, uint64_t>> picks = {{0, 1}};  // (position, weight)
    if (n >= 3) picks.push_back({1, n - 2});
    if (n >= 2) picks.push_back({n - 1, 1});
    return picks;
  };
  for (auto [z, wz] : axis(grid.z))
    for (auto [y, wy] : axis(grid.y))
      for (auto [x, wx] : axis(grid.x)) {
        sequence->push_back(x + grid.x * (y + grid.y * z));
        weight->push_back(wx * wy * wz);
      }
}

struct GroupContext {
  KernelAdapter adapter;
  void* const* args;
};

void run_thread(void* ctx, const ThreadIds& ids) {
  auto* g = static_cast<GroupContext*>(ctx);
  g->adapter(g->args, ids);
}

class EmulatorExecutor final : public Executor {
 public:
  const char* name() const override { return "metal-emulated"; }
  bool computes_bfloat16() const override { return true; }  // its C++ compiles the bfloat kernels

  Tensor allocate(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }

  void run(const Plan& plan, const HostArrays& arrays) override {
    (void)emulated_kernels_linked();
#if defined(RNNCORE_METAL_COUNTING)
    (void)counted_kernels_linked();
#endif
    bool count;
    uint64_t plan_index = 0;
    {
      std::lock_guard<std::mutex> lock(counting().m);
      count = counting().on;
      if (count) plan_index = counting().plans++;
    }
    check_limits(plan);
    const Schedule schedule = schedule_from_env();
    const uint64_t max_threads = max_threads_from_env();
    std::vector<float> workspace[kBufferCount];
    void* base[kBufferCount] = {};
    for (int b = 0; b < kBufferCount; ++b) {
      const int64_t bytes = plan.sizes[b];
      if (bytes <= 0) continue;
      if (is_workspace(static_cast<Buffer>(b))) {
        workspace[b].resize(static_cast<size_t>((bytes + 3) / 4));
        poison(workspace[b], plan.element_sizes[b]);
        base[b] = workspace[b].data();
      } else {
        if (!arrays[b])
          throw Error(std::string("[metal-emulated] the plan uses ") +
                      buffer_name(static_cast<Buffer>(b)) + " but no array was given");
        base[b] = const_cast<void*>(arrays[b]);
      }
    }
    // The device buffers' address ranges, for the counting kernels.
    std::vector<std::array<uintptr_t, 2>> ranges;
    for (int b = 0; b < kBufferCount; ++b)
      if (base[b] && plan.sizes[b] > 0) {
        const auto begin = reinterpret_cast<uintptr_t>(base[b]);
        ranges.push_back({begin, begin + static_cast<uintptr_t>(plan.sizes[b])});
      }
    const Order order = order_from_env();
    for (size_t n = 0; n < plan.dispatches.size(); ++n) {
      const Dispatch& d = plan.dispatches[n];
      Size3 threads;  // the plans' threads are one-dimensional
      threads.x = apple::threads_for_pipeline(d.threads.volume(), max_threads, d.adapts_threads);
      if (threads.x == 0)
        throw DeviceError("[metal-emulated] kernel '" + d.kernel + "' needs " +
                          std::to_string(d.threads.volume()) +
                          " threads per threadgroup but the emulated pipeline allows " +
                          std::to_string(max_threads));
      DispatchCount record;
      std::string key;
      if (count) {
        record.plan = plan_index;
        record.kernel = d.kernel;
        record.threadgroups = d.threadgroups.volume();
        record.threads_per_threadgroup = threads.volume();
        key = d.pipeline_key() + "@" + std::to_string(d.threadgroups.x) + "," +
              std::to_string(d.threadgroups.y) + "," + std::to_string(d.threadgroups.z);
        // The params, but for a step's index: steps of one plan share a key.
        for (const BytesArg& a : d.bytes) {
          std::string bytes(a.data.begin(), a.data.end());
          if (d.kernel.rfind("gemm", 0) != 0 && bytes.size() == sizeof(kernels::StepParams))
            std::memset(&bytes[offsetof(kernels::StepParams, step)], 0, sizeof(int32_t));
          key += "#" + std::to_string(a.index) + ":" + bytes;
        }
        std::lock_guard<std::mutex> lock(counting().m);
        auto it = counting().seen.find(key);
        if (it != counting().seen.end() && it->second.first >= 2) {
          DispatchCount again = it->second.second;
          again.repeated = true;
          again.plan = plan_index;
          counting().records.push_back(again);
          continue;  // a step like the two measured: not run again
        }
      }
      const KernelEntry& kernel = count ? find_counted_kernel(d.kernel) : find_kernel(d.kernel);
      const ConstantValues values = constant_values(d);
      const Arguments bound = bind_arguments(d, kernel, values, base);
      const DispatchState state{&values, &d.kernel};
      // Threadgroups are independent (as on the GPU): they run on the CPU backend's
      // threads, each with its own threadgroup memory, taking them in turn from the order.
      const Size3 grid = d.threadgroups;
      std::vector<uint64_t> sequence, weight;
      if (count)
        representatives(grid, &sequence, &weight);
      else
        sequence = group_sequence(order, grid.volume(), n);
      const int want = static_cast<int>(std::min<uint64_t>(sequence.size(), 64));
      std::mutex totals_m;
      cpu::ThreadPool::instance().run(want, [&](int tid, int team) {
        const DispatchScope scope(&state);
        CountContext mine_count;
        mine_count.ranges = reinterpret_cast<const uintptr_t(*)[2]>(ranges.data());
        mine_count.count = ranges.size();
        struct CountScope {
          CountContext* outer = g_count;
          CountScope(CountContext* c, bool on) {
            if (on) g_count = c;
          }
          ~CountScope() { g_count = outer; }
        } count_scope(&mine_count, count);
        std::vector<float> tg_memory(d.threadgroup_memory / 4);
        std::vector<void*> mine = bound.args;
        for (size_t i : bound.threadgroup_slots) mine[i] = tg_memory.data();
        GroupContext ctx{kernel.adapter, mine.data()};
        uint64_t barriers = 0;
        for (size_t pos = static_cast<size_t>(tid); pos < sequence.size();
             pos += static_cast<size_t>(team)) {
          poison(tg_memory);  // threadgroup memory does not outlive its threadgroup
          const uint64_t g = sequence[pos];
          const uint3 id{uint32_t(g % grid.x), uint32_t(g / grid.x % grid.y),
                         uint32_t(g / (grid.x * grid.y))};
          const CountContext before = mine_count;
          run_threadgroup(d.kernel, threads, id, schedule, &run_thread, &ctx);
          if (count) {  // this threadgroup stands for weight[pos] alike
            const uint64_t w = weight[pos];
            mine_count.read = before.read + (mine_count.read - before.read) * w;
            mine_count.written = before.written + (mine_count.written - before.written) * w;
            mine_count.fmas = before.fmas + (mine_count.fmas - before.fmas) * w;
            const uint64_t calls = mine_count.barrier_calls - before.barrier_calls;
            barriers = std::max(barriers, calls / threads.volume());
          }
        }
        if (count) {
          std::lock_guard<std::mutex> lock(totals_m);
          record.bytes_read += mine_count.read;
          record.bytes_written += mine_count.written;
          record.flops += 2 * mine_count.fmas;
          record.barriers = std::max(record.barriers, barriers);
        }
      });
      if (count) {
        std::lock_guard<std::mutex> lock(counting().m);
        auto& seen = counting().seen[key];
        seen = {seen.first + 1, record};
        counting().records.push_back(record);
      }
    }
  }
};

}  // namespace

void bad_constant_read(const char* name, int32_t index, bool want_bool) {
  const DispatchState* d = g_dispatch;
  const std::string constant =
      std::string("function constant '") + name + "' (index " + std::to_string(index) + ")";
  if (!d) throw DeviceError("[metal-emulated] " + constant + " read outside a dispatch");
  const std::string where = "[metal-emulated] kernel '" + *d->kernel + "' reads " + constant;
  if (!d->constants->defined[index])
    throw DeviceError(where +
                      ", which the dispatch does not set: Metal cannot specialise a function "
                      "without a value for every function constant it uses");
  throw DeviceError(where + ", a " + (want_bool ? "bool" : "int") +
                    ", which the dispatch sets as " + (want_bool ? "an int" : "a bool"));
}

void absent_reference_argument(const char* name) {
  const DispatchState* d = g_dispatch;
  throw DeviceError("[metal-emulated] kernel '" + (d ? *d->kernel : std::string("?")) +
                    "' reads argument '" + name + "', absent through its function constant");
}

bool register_kernel(const char* name, KernelAdapter adapter, const ArgSpec* args, size_t count) {
  kernels()[name] = KernelEntry{adapter, args, count};
  return true;
}

bool register_counted_kernel(const char* name, KernelAdapter adapter, const ArgSpec* args,
                             size_t count) {
  counted_kernels()[name] = KernelEntry{adapter, args, count};
  return true;
}

const KernelEntry& find_counted_kernel(const std::string& name) {
  const auto it = counted_kernels().find(name);
  if (it == counted_kernels().end())
    throw DeviceError("[metal-emulated] no counting kernel named '" + name + "'");
  return it->second;
}

void set_counting(bool on) {
  std::lock_guard<std::mutex> lock(counting().m);
  counting().on = on;
  counting().seen.clear();
  counting().plans = 0;
  if (on) counting().records.clear();
}

std::vector<DispatchCount> take_counts() {
  std::lock_guard<std::mutex> lock(counting().m);
  std::vector<DispatchCount> r = std::move(counting().records);
  counting().records.clear();
  return r;
}

const KernelEntry& find_kernel(const std::string& name) {
  const auto it = kernels().find(name);
  if (it == kernels().end()) throw DeviceError("[metal-emulated] no kernel named '" + name + "'");
  return it->second;
}

}  // namespace rnncore::metal::emu

namespace rnncore::metal {

Executor& emulator_executor() {
  static emu::EmulatorExecutor e;
  return e;
}

}  // namespace rnncore::metal
