// Worker threads that live across calls and across time steps: a recurrence needs one
// synchronisation per step, which a fork/join per step (or per BLAS call) makes costly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rnncore::cpu {

// Sense-reversing barrier for a fixed team; spins briefly, then yields.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait();

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<uint32_t> generation_{0};
};

class ThreadPool {
 public:
  static ThreadPool& instance();
  // Threads a call may use: RNNCORE_NUM_THREADS, set_num_threads, or the usable cores.
  int max_threads() const { return max_threads_.load(); }
  void set_max_threads(int n);
  // Runs fn(tid) for tid in [0, n) (n capped at max_threads) with the caller as tid 0 and
  // returns when all are done.
  // A call that finds the pool busy (another thread of the process is using it) runs with
  // what it is given alone on the caller instead, so nothing waits on anything.
  // Returns the team size actually used; fn must then handle n == 1.
  int run(int n, const std::function<void(int tid, int team)>& fn);
  ~ThreadPool();

 private:
  ThreadPool();
  void worker(int id);
  void grow(int n);

  std::atomic<int> max_threads_{1};
  std::mutex busy_;  // held by the call that owns the workers
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  int team_ = 0;
  std::atomic<uint64_t> job_id_{0};
  std::atomic<int> remaining_{0};
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace rnncore::cpu
