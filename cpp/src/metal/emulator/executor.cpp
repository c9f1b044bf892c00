// The host emulator as an Executor: runs a plan's dispatches in order, every threadgroup's
// threads as fibers (scheduler.cpp) over the kernels compiled from the .metal sources
// (kernels.cpp). Workspace and threadgroup memory start as NaN, so a kernel that reads what
// nobody wrote produces NaN instead of a plausible number.
//
// RNNCORE_EMULATOR_SCHEDULE=shuffle[:seed] runs the threads of each threadgroup in a random
// order each round (default: in order); results must not depend on it.
#include "metal/executor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "metal/emulator/registry.hpp"
#include "rnncore/error.hpp"

namespace rnncore::metal::emu {

int emulated_kernels_linked();

namespace {

std::vector<ConstantSetter>& setters() {
  static std::vector<ConstantSetter> s;
  return s;
}

std::unordered_map<std::string, KernelAdapter>& kernels() {
  static std::unordered_map<std::string, KernelAdapter> k;
  return k;
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

// NaN in every element: float32 NaN words, or two float16 NaNs per word.
void poison(std::vector<float>& v, int64_t element_size = 4) {
  uint32_t bits = 0x7FC00000u;
  if (element_size == 2) bits = 0x7E007E00u;
  float f;
  std::memcpy(&f, &bits, 4);
  std::fill(v.begin(), v.end(), f);
}

struct GroupContext {
  KernelAdapter adapter;
  const KernelArgs* args;
};

void run_thread(void* ctx, const ThreadIds& ids) {
  auto* g = static_cast<GroupContext*>(ctx);
  g->adapter(*g->args, ids);
}

class EmulatorExecutor final : public Executor {
 public:
  const char* name() const override { return "metal-emulated"; }

  Tensor allocate(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }

  void run(const Plan& plan, const HostArrays& arrays) override {
    (void)emulated_kernels_linked();
    check_limits(plan);
    const Schedule schedule = schedule_from_env();
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
    for (const Dispatch& d : plan.dispatches) {
      const KernelAdapter adapter = find_kernel(d.kernel);
      ConstantValues values;
      for (const FunctionConstant& c : d.constants) {
        values.value[c.index] = c.value;
        values.defined[c.index] = true;
      }
      KernelArgs args;
      for (const Binding& b : d.buffers)
        args.buffers[b.index] = static_cast<char*>(base[static_cast<int>(b.buffer)]) + b.offset;
      for (const BytesArg& b : d.bytes) args.bytes[b.index] = b.data.data();
      // Threadgroups are independent (as on the GPU): they run on the CPU backend's
      // threads, each with its own threadgroup memory and function-constant values.
      const Size3 grid = d.threadgroups;
      const uint64_t groups = grid.volume();
      const int want = static_cast<int>(std::min<uint64_t>(groups, 64));
      cpu::ThreadPool::instance().run(want, [&](int tid, int team) {
        apply_function_constants(values);
        std::vector<float> tg_memory(d.threadgroup_memory / 4);
        KernelArgs mine = args;
        mine.threadgroup_memory = d.threadgroup_memory ? tg_memory.data() : nullptr;
        GroupContext ctx{adapter, &mine};
        for (uint64_t g = static_cast<uint64_t>(tid); g < groups;
             g += static_cast<uint64_t>(team)) {
          poison(tg_memory);  // threadgroup memory does not outlive its threadgroup
          const uint3 id{uint32_t(g % grid.x), uint32_t(g / grid.x % grid.y),
                         uint32_t(g / (grid.x * grid.y))};
          run_threadgroup(d.kernel, d.threads, id, schedule, &run_thread, &ctx);
        }
      });
    }
  }
};

}  // namespace

uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  uint32_t h, rem, halfway;
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {
    h = static_cast<uint32_t>(e) << 10 | mant >> 13;
    rem = mant & 0x1fffu;
    halfway = 0x1000u;
  }
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // a carry rounds up the exponent
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int32_t e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while (!(m & 0x400u));
      x = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | mant << 13;
  } else {
    x = sign | (exp - 15 + 127) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

bool register_function_constant(ConstantSetter setter) {
  setters().push_back(setter);
  return true;
}

void apply_function_constants(const ConstantValues& values) {
  for (ConstantSetter s : setters()) s(values);
}

bool register_kernel(const char* name, KernelAdapter adapter) {
  kernels()[name] = adapter;
  return true;
}

KernelAdapter find_kernel(const std::string& name) {
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
