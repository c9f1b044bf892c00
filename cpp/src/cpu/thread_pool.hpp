// Worker threads that live across calls, and jobs they help with without ever being waited
// for: a job is a set of chunks claimed from shared atomic counters, the caller alone can
// finish every job, and a worker the OS has descheduled (or that wakes late) only joins a
// job while work remains. Nothing here decides how work is split: the callers fix their
// chunks from the problem's shape, so results never depend on which thread ran a chunk,
// on the thread count or on what else runs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace rnncore::cpu {

// A 32-bit word threads can sleep on until it changes (a futex on Linux), and the count of
// sleepers, so that a change wakes no one (no system call) when nobody sleeps.
struct WaitWord {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
  // Bumps the value and wakes every sleeper.
  void bump();
  // Wakes every sleeper, after the caller changed the value itself.
  void notify();
  // Spins for at most about spin_ns, then yields the core between checks until yield_ns
  // from the start, then sleeps until the value is not `seen`, or until done() (checked
  // first and after every wake) holds. start: now_ns() at the start, when the caller has it.
  template <class Done>
  void wait(uint32_t seen, int64_t spin_ns, Done&& done, int64_t yield_ns = 0, int64_t start = -1);
  // Sleeps while the value equals `seen` (may return early).
  void sleep(uint32_t seen);
};

// Spin budgets (nanoseconds) before a waiting thread goes to the OS: long enough to cover
// the usual imbalance of a step on a quiet machine, short enough that a thread waiting for
// one the OS has descheduled soon gives it its core.
int64_t spin_ns();
// How long an idle worker stays awake for the next job, yielding its core to any other
// thread that wants it: a sleeping worker took 20-50 us to wake here, more than a one-step
// call's whole time, and callers that do their own work between calls (a layer's Python,
// a generation loop) call again within this.
int64_t idle_ns();
void cpu_relax();
int64_t now_ns();

// Runs done-checks with a bounded spin, then sleeps on `word`.
template <class Done>
void WaitWord::wait(uint32_t seen, int64_t spin, Done&& done, int64_t yield_ns, int64_t start) {
  if (done()) return;
  if (start < 0) start = now_ns();
  const int64_t until = start + spin;
  for (int i = 1;; ++i) {
    cpu_relax();
    if (done()) return;
    if ((i & 15) == 0 && now_ns() > until) break;
  }
  while (now_ns() < start + yield_ns) {
    std::this_thread::yield();
    if (done()) return;
  }
  for (;;) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (done() || value.load(std::memory_order_seq_cst) != seen) {
      sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (done()) return;
    } else {
      sleep(seen);
      sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (done()) return;
    }
    seen = value.load(std::memory_order_seq_cst);
  }
}

// What the pool runs: work(slot) is called once by the caller (slot 0) and once by every
// worker that joins (slots 1, 2, ... in joining order), possibly after all the work has
// been claimed. It must return when no work is left to claim, and the caller's work() must
// not return before every claimed chunk is done.
class Job {
 public:
  virtual void work(int slot) = 0;

 protected:
  ~Job() = default;
};

class ThreadPool {
 public:
  static ThreadPool& instance();
  // Threads a call may use: RNNCORE_NUM_THREADS, set_num_threads, or the usable cores.
  int max_threads() const { return max_threads_.load(); }
  void set_max_threads(int n);

  // Runs job with the caller and up to participants - 1 workers (capped by max_threads),
  // and returns once the caller's work() has returned and every worker that joined has
  // left: a worker never touches the job after that, so it can live on the caller's
  // stack. A call that finds the pool in use (another thread's job, or a job calling back
  // in) runs job.work(0) alone. Returns the most participants the job may have had.
  int run(Job& job, int participants);

  // fn(i) for every i in [0, chunks), chunks claimed from a shared counter by the caller
  // and up to participants - 1 workers. The first exception is rethrown on the caller (no
  // further chunks start).
  void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn,
                    int participants = 1 << 30);

  // The participants a job started now would get: max_threads, or 1 when the pool is in
  // use, contended, or this thread is inside a job.
  int available() const;

  // Contention. A thread that waited for a chunk another thread claimed much longer than
  // chunks take (that thread was descheduled: the machine has more runnable threads than
  // cores) reports the time it waited. Multi-threaded jobs that end without a stall earn a
  // credit (a quarter of their time, at most 20 ms) that pays for stalls; once stalls cost
  // more than it, jobs run on their callers alone for a while (50 ms, doubling while this
  // recurs, up to 1 s), so that no call keeps waiting for threads the OS does not run. A
  // brief stall beside another pool's spinning threads costs little and keeps the threads;
  // a competing process soon exhausts the credit. The bits never depend on this.
  void report_stall(int64_t waited_ns);
  bool contended() const;
  // The longest wait for others that is not a stall, given the mean duration of a chunk.
  static int64_t stall_after_ns(int64_t mean_chunk_ns);
  // Whether waiting wait_ns for others while working work_ns means they are starved of
  // cores: more than twice the work, and over a millisecond.
  static bool starved(int64_t wait_ns, int64_t work_ns) { return wait_ns > 1000000 + 2 * work_ns; }

  // The older interface (the Metal emulator's): fn(tid, team) for every tid in [0, team),
  // team = min(n, max_threads), each tid a chunk of parallel_for. Returns team.
  int run(int n, const std::function<void(int tid, int team)>& fn);

  ~ThreadPool();

 private:
  ThreadPool();
  void worker(uint32_t seen);
  void grow(int n);

  std::atomic<int> max_threads_{1};
  std::atomic<bool> busy_{false};  // a job is published (one at a time)
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  // bit 31: open for joining; bits 16..30: workers that joined; bits 0..15: still inside.
  WaitWord ticket_;
  WaitWord generation_;  // bumped when a job is published
  std::atomic<int> want_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> contended_until_{0}, backoff_ns_{0};
  void earn(int64_t worked_ns);
  static constexpr int64_t kMaxCreditNs = 20000000, kCreditShare = 4;
  std::mutex stall_m_;
  std::atomic<int64_t> stalls_{0};
  int64_t credit_ns_ = kMaxCreditNs;  // guarded by stall_m_
};

// Stages run in order, each split into the same `chunks` chunks, and a stage starts only
// when every chunk of the one before is done: fn(slot, stage, chunk). The chunks are split
// into one home range per expected participant; a participant claims chunks of its own
// range first (so a chunk tends to run on the same thread stage after stage and keep its
// data in that core's cache), then takes what is left in the others. A stage is complete
// when its done-counter reaches the chunk count, whoever ran the chunks; a participant
// that finds nothing to claim waits for that (a short spin, then sleep), and a worker that
// joins late starts at the stage in progress. fn must not depend on the slot for its
// results (the slot only picks scratch memory).
// Idle: a participant about to wait for stage s to open first calls idle(slot, s, begin,
// end), with its home range [begin, end), until it returns false (nothing left to do ahead)
// or the stage opens: work that stage s's chunks would otherwise do themselves.
struct NoIdle {
  bool operator()(int, int64_t, int64_t, int64_t) const { return false; }
};
template <class F, class Idle = NoIdle>
class StagedJob final : public Job {
 public:
  StagedJob(int64_t stages, int64_t chunks, int participants, F fn, Idle idle = Idle())
      : stages_(stages),
        chunks_(chunks),
        ranges_(static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(participants, chunks)))),
        claims_(static_cast<size_t>(ranges_)),
        fn_(std::move(fn)),
        idle_(std::move(idle)) {}

  // Runs every stage on the pool (or on the caller alone) and rethrows the first error.
  void run(ThreadPool& pool) {
    if (stages_ > 0 && chunks_ > 0) pool.run(*this, ranges_);
    if (error_) std::rethrow_exception(error_);
  }

  void work(int slot) override {
    const int home = slot % ranges_;
    Own own;
    // The clock's last reading, where nothing but a check or a claim has run since: a stage's
    // work ends when its wait starts, and a wait ends when the next stage's work starts. (Five
    // readings a stage took 2.2-2.7% of a batch-1 bfloat16 LSTM's samples, the two left 1.8%.)
    int64_t clock = now_ns();
    for (int64_t s = 0;;) {
      const int64_t complete = done_.load(std::memory_order_acquire) / chunks_;
      if (s < complete) s = complete;  // a late joiner starts at the stage in progress
      if (s >= stages_) return;
      wait_open(s, own, slot, home, clock);
      if (slot != 0 && solo_.load(std::memory_order_relaxed)) return;
      int64_t c;
      const int64_t t0 = clock, n0 = own.chunks;
      while ((slot == 0 || !solo_.load(std::memory_order_relaxed)) && claim(s, home, &c)) {
        ++own.chunks;
        if (!failed_.load(std::memory_order_relaxed)) {
          try {
            fn_(slot, s, c);
          } catch (...) {
            std::lock_guard<std::mutex> lock(error_m_);
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
          }
        }
        if ((done_.fetch_add(1, std::memory_order_acq_rel) + 1) % chunks_ == 0) epoch_.bump();
      }
      clock = now_ns();
      if (own.chunks > n0) {
        own.ns += clock - t0;
        const int64_t mean = own.ns / own.chunks;
        if (mean > chunk_ns_.load(std::memory_order_relaxed))
          chunk_ns_.store(mean, std::memory_order_relaxed);
      }
      if (++s == stages_) {
        if (slot == 0) wait_open(s, own, slot, home, clock);  // returns when the last stage is done
        return;
      }
    }
  }

 private:
  struct alignas(64) Claim {
    // stage << 32 | chunks of the range taken in that stage
    std::atomic<uint64_t> word{0};
  };

  struct Own {                                // what one participant ran
    int64_t chunks = 0, ns = 0, wait_ns = 0;  // and how long it waited for others
  };

  // Waits until stage s may start: every chunk of stage s - 1 is done. A wait far longer
  // than a chunk takes was a wait for a descheduled thread: the rest of the job runs on
  // the caller alone, and the pool is told. clock: now_ns() as of the call, and as of the
  // return when it waited.
  void wait_open(int64_t s, Own& own, int slot, int home, int64_t& clock) {
    const int64_t need = s * chunks_;
    auto open = [&] { return done_.load(std::memory_order_acquire) >= need; };
    if (open()) return;
    if constexpr (!std::is_same_v<Idle, NoIdle>) {
      if (s < stages_ && !failed_.load(std::memory_order_relaxed)) {
        // (Work done here is neither a chunk's nor waiting, for the stall heuristics.)
        const int64_t begin = chunks_ * home / ranges_, end = chunks_ * (home + 1) / ranges_;
        bool idled = false;
        while (idle_(slot, s, begin, end)) {
          idled = true;
          if (open()) {
            clock = now_ns();
            return;
          }
        }
        if (idled) clock = now_ns();
      }
    } else {
      (void)slot, (void)home;
    }
    const int64_t t0 = clock;
    epoch_.wait(epoch_.value.load(std::memory_order_seq_cst), spin_ns(), open, 0, t0);
    clock = now_ns();
    const int64_t dt = clock - t0;
    own.wait_ns += dt;
    const int64_t mean =
        std::max(own.chunks ? own.ns / own.chunks : 0, chunk_ns_.load(std::memory_order_relaxed));
    // One long wait, or waits adding up to more than twice the work done (the others run
    // at a fraction of a core).
    if ((dt > ThreadPool::stall_after_ns(mean) || ThreadPool::starved(own.wait_ns, own.ns)) &&
        !solo_.exchange(true, std::memory_order_relaxed))
      ThreadPool::instance().report_stall(dt);
  }

  bool claim(int64_t s, int home, int64_t* chunk) {
    for (int k = 0; k < ranges_; ++k) {
      const int r = (home + k) % ranges_;
      const int64_t begin = chunks_ * r / ranges_, len = chunks_ * (r + 1) / ranges_ - begin;
      std::atomic<uint64_t>& w = claims_[static_cast<size_t>(r)].word;
      uint64_t v = w.load(std::memory_order_relaxed);
      for (;;) {
        const int64_t vs = static_cast<int64_t>(v >> 32);
        if (vs > s) break;  // a stale view: the range has moved on
        const int64_t taken = vs < s ? 0 : static_cast<int64_t>(v & 0xffffffffu);
        if (taken >= len) break;
        const uint64_t next = static_cast<uint64_t>(s) << 32 | static_cast<uint64_t>(taken + 1);
        if (w.compare_exchange_weak(v, next, std::memory_order_relaxed)) {
          *chunk = begin + taken;
          return true;
        }
      }
    }
    return false;
  }

  const int64_t stages_, chunks_;
  const int ranges_;
  std::vector<Claim> claims_;
  std::atomic<int64_t> done_{0};  // chunks done, over all stages
  WaitWord epoch_;                // bumped when a stage completes
  std::atomic<bool> failed_{false};
  std::atomic<bool> solo_{false};     // a stall was seen: workers stop claiming
  std::atomic<int64_t> chunk_ns_{0};  // the longest mean chunk time a participant saw
  std::mutex error_m_;
  std::exception_ptr error_;
  F fn_;
  Idle idle_;
};

}  // namespace rnncore::cpu
