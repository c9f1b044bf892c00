// The fiber scheduler of the host emulator (see scheduler.hpp). Threads run in rounds;
// each runs until it blocks (barrier, simd operation) or returns. When no thread can run,
// complete simdgroup collectives are released first, then a barrier that every thread
// reached; anything else is a kernel that would hang or misbehave on the GPU.
#include "metal/emulator/scheduler.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <numeric>
#include <vector>

#include "metal/emulator/fiber.hpp"
#include "rnncore/error.hpp"

namespace rnncore::metal::emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;

class Scheduler {
 public:
  void run(const std::string& kernel, const Size3& threads, const uint3& tgid,
           const Schedule& schedule, ThreadBody body, void* ctx);
  void barrier(const void* site);
  SimdView simd(uint64_t bits, const void* site);

 private:
  enum class State : uint8_t { Ready, Barrier, Simd, Done };
  struct Thread {
    State state = State::Ready;
    const void* site = nullptr;
    uint64_t barriers = 0;  // barriers passed
    uint64_t simd_seq = 0;  // simd collectives passed
    ThreadIds ids;
  };
  struct SimdGroup {
    uint64_t slots[2][kSimdWidth];
    uint32_t active[2];
    SimdView::Shared shared[2];
    uint32_t lanes;  // mask of lanes that exist
  };
  struct Arg {
    Scheduler* self;
    uint32_t index;
  };

  static Fiber& entry(void* arg);
  // The fiber to run after the current thread blocks or returns: the next ready thread of
  // this round directly (half the switches of going through the driver), or the driver at
  // the end of the round.
  Fiber& next() {
    while (++position_ < order_.size()) {
      const uint32_t i = order_[position_];
      if (threads_[i].state == State::Ready) {
        current_ = i;
        return *fibers_[i];
      }
    }
    return *main_;
  }
  void yield() {
    Fiber& from = *fibers_[current_];
    Fiber::switch_to(from, next());
  }
  bool release_simd();
  bool release_barrier();
  [[noreturn]] void fail(const std::string& what) const;
  std::string list(State s) const;

  std::unique_ptr<Fiber> main_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<Arg> args_;
  std::vector<Thread> threads_;
  std::vector<SimdGroup> groups_;
  uint32_t current_ = 0;
  std::vector<uint32_t> order_;  // this round's order
  size_t position_ = 0;          // of current_ in order_
  ThreadBody body_ = nullptr;
  void* ctx_ = nullptr;
  const std::string* kernel_ = nullptr;
  std::exception_ptr error_;
};

thread_local Scheduler* g_running = nullptr;

Scheduler& scheduler() {
  thread_local Scheduler s;
  return s;
}

Fiber& Scheduler::entry(void* arg) {
  auto* a = static_cast<Arg*>(arg);
  Scheduler& s = *a->self;
  Thread& t = s.threads_[a->index];
  try {
    s.body_(s.ctx_, t.ids);
  } catch (...) {
    if (!s.error_) s.error_ = std::current_exception();
  }
  t.state = State::Done;
  return s.next();  // the fiber parks; the next run() starts it again
}

void Scheduler::run(const std::string& kernel, const Size3& threads, const uint3& tgid,
                    const Schedule& schedule, ThreadBody body, void* ctx) {
  const auto n = static_cast<uint32_t>(threads.volume());
  if (!main_) main_ = Fiber::for_current_thread();
  while (fibers_.size() < n) fibers_.push_back(std::make_unique<Fiber>(kStackBytes));
  args_.resize(n);
  threads_.assign(n, Thread{});
  const uint32_t ngroups = (n + kSimdWidth - 1) / kSimdWidth;
  groups_.assign(ngroups, SimdGroup{});
  for (uint32_t g = 0; g < ngroups; ++g) {
    const uint32_t lanes = std::min(kSimdWidth, n - g * kSimdWidth);
    groups_[g].lanes = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  body_ = body;
  ctx_ = ctx;
  kernel_ = &kernel;
  error_ = nullptr;
  for (uint32_t i = 0; i < n; ++i) {
    ThreadIds& id = threads_[i].ids;
    id.tgid = tgid;
    id.tptg = {uint32_t(threads.x), uint32_t(threads.y), uint32_t(threads.z)};
    id.tid = i;
    id.tpos = {uint32_t(i % threads.x), uint32_t(i / threads.x % threads.y),
               uint32_t(i / (threads.x * threads.y))};
    id.sg = i / kSimdWidth;
    id.lane = i % kSimdWidth;
    args_[i] = {this, i};
    fibers_[i]->start(&Scheduler::entry, &args_[i]);
  }

  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0u);
  // splitmix64, seeded per threadgroup so the order does not depend on which OS thread
  // runs the group.
  uint64_t state =
      schedule.seed ^ (tgid.x + 0x9E3779B97F4A7C15ull * (tgid.y + 0x10001ull * tgid.z));
  const auto next_random = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  Scheduler* outer = g_running;
  g_running = this;
  struct Restore {
    Scheduler* outer;
    ~Restore() { g_running = outer; }
  } restore{outer};
  for (;;) {
    if (schedule.shuffle)
      for (uint32_t i = n - 1; i > 0; --i) std::swap(order_[i], order_[next_random() % (i + 1)]);
    // Start the round at its first ready thread; the threads pass control along (yield).
    for (position_ = 0; position_ < n; ++position_) {
      const uint32_t i = order_[position_];
      if (threads_[i].state != State::Ready) continue;
      current_ = i;
      Fiber::switch_to(*main_, *fibers_[i]);
      break;
    }
    if (error_) std::rethrow_exception(error_);
    bool done = true;
    for (const Thread& t : threads_) done = done && t.state == State::Done;
    if (done) return;
    if (release_simd() || release_barrier()) continue;
    fail("threads " + list(State::Simd) + " wait at a simd operation while threads " +
         list(State::Barrier) +
         " wait at a threadgroup_barrier (simd operations must be in "
         "simd-uniform control flow)");
  }
}

std::string Scheduler::list(State s) const {
  std::string r;
  uint32_t count = 0;
  for (uint32_t i = 0; i < threads_.size(); ++i) {
    if (threads_[i].state != s) continue;
    if (count < 8) r += (count ? "," : "") + std::to_string(i);
    ++count;
  }
  if (count > 8) r += ",... (" + std::to_string(count) + " threads)";
  return count ? "{" + r + "}" : "{}";
}

void Scheduler::fail(const std::string& what) const {
  throw DeviceError("[metal-emulated] kernel '" + *kernel_ + "': " + what);
}

bool Scheduler::release_simd() {
  bool released = false;
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    SimdGroup& grp = groups_[g];
    uint32_t waiting = 0, blocked = 0;
    uint64_t seq = 0;
    const void* site = nullptr;
    for (uint32_t l = 0; l < kSimdWidth; ++l) {
      if (!(grp.lanes >> l & 1)) continue;
      const Thread& t = threads_[g * kSimdWidth + l];
      if (t.state == State::Simd) {
        if (waiting && (t.simd_seq != seq || t.site != site))
          fail("lanes of simdgroup " + std::to_string(g) +
               " wait at different simd operations (divergent control flow)");
        waiting |= 1u << l;
        seq = t.simd_seq;
        site = t.site;
      } else if (t.state != State::Done) {
        blocked |= 1u << l;
      }
    }
    if (!waiting || blocked) continue;
    grp.active[seq & 1] = waiting;
    grp.shared[seq & 1] = {0, 0};
    for (uint32_t l = 0; l < kSimdWidth; ++l)
      if (waiting >> l & 1) threads_[g * kSimdWidth + l].state = State::Ready;
    released = true;
  }
  return released;
}

bool Scheduler::release_barrier() {
  const void* site = nullptr;
  uint64_t count = 0;
  bool any = false;
  for (const Thread& t : threads_) {
    if (t.state != State::Barrier) continue;
    if (any && (t.site != site || t.barriers != count))
      fail("threads wait at different threadgroup_barrier calls: " + list(State::Barrier));
    site = t.site;
    count = t.barriers;
    any = true;
  }
  if (!any) return false;
  for (const Thread& t : threads_)
    if (t.state == State::Simd) return false;  // reported by the caller as divergence
  for (const Thread& t : threads_)
    if (t.state == State::Done)
      fail("threads " + list(State::Done) +
           " returned without reaching the threadgroup_barrier "
           "that threads " +
           list(State::Barrier) +
           " wait at (every thread must reach every "
           "barrier)");
  for (Thread& t : threads_) {
    t.state = State::Ready;
    ++t.barriers;
  }
  return true;
}

void Scheduler::barrier(const void* site) {
  Thread& t = threads_[current_];
  t.state = State::Barrier;
  t.site = site;
  yield();
}

SimdView Scheduler::simd(uint64_t bits, const void* site) {
  Thread& t = threads_[current_];
  SimdGroup& grp = groups_[t.ids.sg];
  const uint64_t seq = t.simd_seq;
  // Two slot sets alternate: a lane can only reach collective seq + 2 after every lane has
  // read the results of seq.
  grp.slots[seq & 1][t.ids.lane] = bits;
  t.state = State::Simd;
  t.site = site;
  yield();
  ++t.simd_seq;
  return {grp.slots[seq & 1], grp.active[seq & 1], t.ids.lane, &grp.shared[seq & 1]};
}

}  // namespace

void run_threadgroup(const std::string& kernel, const Size3& threads, const uint3& tgid,
                     const Schedule& schedule, ThreadBody body, void* ctx) {
  scheduler().run(kernel, threads, tgid, schedule, body, ctx);
}

void barrier(const void* site) {
  if (!g_running) throw DeviceError("[metal-emulated] threadgroup_barrier outside a kernel");
  g_running->barrier(site);
}

SimdView simd_collective(uint64_t bits, const void* site) {
  if (!g_running) throw DeviceError("[metal-emulated] simd operation outside a kernel");
  return g_running->simd(bits, site);
}

}  // namespace rnncore::metal::emu
