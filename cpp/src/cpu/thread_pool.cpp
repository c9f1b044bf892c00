#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RNNCORE_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define RNNCORE_PAUSE() asm volatile("yield")
#else
#define RNNCORE_PAUSE() ((void)0)
#endif

namespace rnncore::cpu {

void SpinBarrier::wait() {
  const uint32_t gen = generation_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
    count_.store(0, std::memory_order_relaxed);
    generation_.store(gen + 1, std::memory_order_release);
    return;
  }
  for (int spins = 0; generation_.load(std::memory_order_acquire) == gen; ++spins) {
    if (spins < 20000)
      RNNCORE_PAUSE();
    else
      std::this_thread::yield();
  }
}

namespace {

int usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

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

void ThreadPool::set_max_threads(int n) { max_threads_ = n > 0 ? n : usable_cores(); }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::grow(int n) {
  while (static_cast<int>(workers_.size()) < n - 1) {
    const int id = static_cast<int>(workers_.size()) + 1;
    workers_.emplace_back([this, id] { worker(id); });
  }
}

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job;
    int team;
    // Spin a little before sleeping: per-step calls come back within microseconds, and a
    // futex wake-up costs tens of them.
    for (int spins = 0; spins < 4000 && job_id_.load(std::memory_order_acquire) == seen; ++spins)
      RNNCORE_PAUSE();
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stop_ || job_id_.load() != seen; });
      if (stop_) return;
      seen = job_id_;
      job = job_;
      team = team_;
    }
    if (id < team) {
      try {
        (*job)(id, team);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m_);
        if (!error_) error_ = std::current_exception();
      }
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

int ThreadPool::run(int n, const std::function<void(int, int)>& fn) {
  n = std::min(n, max_threads());
  if (n <= 1) {
    fn(0, 1);
    return 1;
  }
  std::unique_lock<std::mutex> owner(busy_, std::try_to_lock);
  if (!owner.owns_lock()) {
    fn(0, 1);
    return 1;
  }
  {
    std::lock_guard<std::mutex> lock(m_);
    grow(n);
    job_ = &fn;
    team_ = n;
    error_ = nullptr;
    remaining_.store(n - 1, std::memory_order_release);
    ++job_id_;
  }
  cv_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, n);
  } catch (...) {
    mine = std::current_exception();
  }
  for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 20000)
      RNNCORE_PAUSE();
    else
      std::this_thread::yield();
  }
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
  return n;
}

}  // namespace rnncore::cpu
