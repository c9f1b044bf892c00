#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <string>

#include "cpu/cpu_limit.hpp"

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace rnncore::cpu {

void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t spin_ns() { return 50000; }
int64_t idle_ns() { return 1000000; }

#if defined(__linux__)
void WaitWord::sleep(uint32_t seen) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&value), FUTEX_WAIT_PRIVATE, seen, nullptr,
          nullptr, 0);
}
void WaitWord::notify() {
  if (sleepers.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&value), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}
#else
// Elsewhere one process-wide condition variable stands in for the futex; a sleeper also
// wakes up every millisecond to look again.
namespace {
std::mutex& parking_mutex() {
  static std::mutex m;
  return m;
}
std::condition_variable& parking_cv() {
  static std::condition_variable cv;
  return cv;
}
}  // namespace
void WaitWord::sleep(uint32_t seen) {
  std::unique_lock<std::mutex> lock(parking_mutex());
  if (value.load(std::memory_order_seq_cst) == seen)
    parking_cv().wait_for(lock, std::chrono::milliseconds(1));
}
void WaitWord::notify() {
  if (sleepers.load(std::memory_order_seq_cst) != 0) {
    { std::lock_guard<std::mutex> lock(parking_mutex()); }
    parking_cv().notify_all();
  }
}
#endif

void WaitWord::bump() {
  value.fetch_add(1, std::memory_order_seq_cst);
  notify();
}

namespace {

constexpr uint32_t kOpen = 1u << 31;
constexpr uint32_t kInside = 0xffffu;
constexpr int kJoinedShift = 16;

// The CPUs the process may run on, and no more than the whole CPUs of time its control
// groups allow (a container's --cpus; as Rust's available_parallelism): past that quota
// the kernel stops every thread of the group until the next period (100 ms by default),
// and a step that waits for a stopped thread waits that long.
int usable_cores() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  n = std::max(n, 1);
  const double limit = cgroup_cpu_limit();
  return limit > 0 ? std::clamp(static_cast<int>(limit), 1, n) : n;
}

// Whether this thread is running a job's work (nested calls then run inline).
thread_local bool tls_in_job = false;

struct InJob {
  bool saved = tls_in_job;
  InJob() { tls_in_job = true; }
  ~InJob() { tls_in_job = saved; }
};

}  // namespace

ThreadPool::ThreadPool() {
  int n = usable_cores();
  if (const char* env = std::getenv("RNNCORE_NUM_THREADS"); env && *env) {
    const int v = std::atoi(env);
    if (v > 0) n = v;
  }
  max_threads_ = n;
}

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool;
  return pool;
}

void ThreadPool::set_max_threads(int n) {
  max_threads_ = std::min(n > 0 ? n : usable_cores(), static_cast<int>(kInside) / 2);
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.bump();
  for (auto& t : workers_) t.join();
}

void ThreadPool::grow(int n) {
  const uint32_t seen = generation_.value.load(std::memory_order_relaxed);
  while (static_cast<int>(workers_.size()) < n - 1)
    workers_.emplace_back([this, seen] { worker(seen); });
}

void ThreadPool::worker(uint32_t seen) {
  for (;;) {
    generation_.wait(
        seen, spin_ns(),
        [&] {
          return generation_.value.load(std::memory_order_acquire) != seen ||
                 stop_.load(std::memory_order_relaxed);
        },
        idle_ns());
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.value.load(std::memory_order_acquire);
    // Join the open job, if it still wants a worker: joining and being inside are one
    // atomic word, so the caller that closes the job knows exactly whom to wait for.
    int slot = 0;
    uint32_t t = ticket_.value.load(std::memory_order_acquire);
    while (t & kOpen) {
      const int joined = static_cast<int>((t & ~kOpen) >> kJoinedShift);
      if (joined >= want_.load(std::memory_order_relaxed)) break;
      if (ticket_.value.compare_exchange_weak(t, t + (1u << kJoinedShift) + 1,
                                              std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
        slot = joined + 1;
        break;
      }
    }
    if (!slot) continue;
    // A worker that gets a core late (another pool's threads spinning, or another process)
    // still joins: jobs take late joiners, and the caller has worked meanwhile. Only a wait
    // for a thread descheduled with a chunk in hand costs anything, and is reported.
    {
      InJob in;
      job_->work(slot);  // jobs catch their own errors
    }
    const uint32_t left = ticket_.value.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if ((left & kInside) == 0 && !(left & kOpen)) ticket_.notify();
  }
}

int64_t ThreadPool::stall_after_ns(int64_t mean_chunk_ns) {
  return std::max<int64_t>(250000, 16 * mean_chunk_ns);
}

void ThreadPool::report_stall(int64_t waited_ns) {
  const int64_t base = 50000000, cap = 1000000000;
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(stall_m_);
  stalls_.fetch_add(1, std::memory_order_relaxed);
  // Stalls are paid from a credit that multi-threaded work earns; a machine whose stalls
  // cost more than the credit runs jobs alone for a while.
  credit_ns_ -= waited_ns;
  if (credit_ns_ >= 0) return;
  credit_ns_ = 0;
  int64_t b = backoff_ns_.load(std::memory_order_relaxed);
  // Back-offs that recur soon after the last one ended double; one long after resets it.
  const int64_t until = contended_until_.load(std::memory_order_relaxed);
  b = b == 0 || now - until > 2 * cap ? base : std::min(cap, 2 * b);
  backoff_ns_.store(b, std::memory_order_relaxed);
  contended_until_.store(now + b, std::memory_order_relaxed);
}

void ThreadPool::earn(int64_t worked_ns) {
  std::lock_guard<std::mutex> lock(stall_m_);
  credit_ns_ = std::min(kMaxCreditNs, credit_ns_ + worked_ns / kCreditShare);
}

int ThreadPool::available() const {
  if (tls_in_job || busy_.load(std::memory_order_relaxed) || contended()) return 1;
  return max_threads();
}

bool ThreadPool::contended() const {
  return now_ns() < contended_until_.load(std::memory_order_relaxed);
}

int ThreadPool::run(Job& job, int participants) {
  const int n = std::min(participants, max_threads());
  if (n <= 1 || tls_in_job || contended() || busy_.exchange(true, std::memory_order_acquire)) {
    InJob in;
    job.work(0);
    return 1;
  }
  grow(n);
  job_ = &job;
  want_.store(n - 1, std::memory_order_relaxed);
  const int64_t stalls = stalls_.load(std::memory_order_relaxed);
  ticket_.value.store(kOpen, std::memory_order_release);
  generation_.bump();
  std::exception_ptr error;
  const int64_t work_start = now_ns();
  {
    InJob in;
    try {
      job.work(0);
    } catch (...) {
      error = std::current_exception();
    }
  }
  const int64_t work_end = now_ns();
  // Close: no worker joins from now on; wait for those inside (each is finishing a chunk
  // it claimed, or about to find nothing left).
  const uint32_t closed = ticket_.value.fetch_and(~kOpen, std::memory_order_acq_rel) & ~kOpen;
  ticket_.wait(closed, spin_ns(),
               [&] { return (ticket_.value.load(std::memory_order_acquire) & kInside) == 0; });
  // Waiting for a worker much longer than the caller's whole share took (it was
  // descheduled inside its last chunk), or for over half as long (it runs at a fraction
  // of a core: on a quiet machine the shares end together).
  const int64_t waited = now_ns() - work_end, worked = work_end - work_start;
  if (waited > stall_after_ns(worked) || (waited > 250000 && 2 * waited > worked))
    report_stall(waited);
  else if (stalls_.load(std::memory_order_relaxed) == stalls)
    earn(worked + waited);
  job_ = nullptr;
  busy_.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
  return n;
}

namespace {

class FlatJob final : public Job {
 public:
  FlatJob(int64_t n, const std::function<void(int64_t)>& fn) : n_(n), fn_(fn) {}
  void work(int) override {
    for (;;) {
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_) return;
      try {
        fn_(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_, std::memory_order_relaxed);  // no further chunks start
      }
    }
  }
  std::exception_ptr error() const { return error_; }

 private:
  const int64_t n_;
  const std::function<void(int64_t)>& fn_;
  std::atomic<int64_t> next_{0};
  std::mutex m_;
  std::exception_ptr error_;
};

}  // namespace

void ThreadPool::parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn,
                              int participants) {
  if (chunks <= 0) return;
  if (chunks == 1) return fn(0);
  FlatJob job(chunks, fn);
  run(job, static_cast<int>(std::min<int64_t>(participants, chunks)));
  if (job.error()) std::rethrow_exception(job.error());
}

int ThreadPool::run(int n, const std::function<void(int, int)>& fn) {
  const int team = std::max(1, std::min(n, max_threads()));
  parallel_for(team, [&](int64_t tid) { fn(static_cast<int>(tid), team); });
  return team;
}

}  // namespace rnncore::cpu
