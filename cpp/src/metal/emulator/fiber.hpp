// Cooperative fibers for the host emulator: one per GPU thread of a threadgroup, switched
// in user space (a few instructions, no system call) so barriers and simdgroup operations
// can suspend a thread the way the GPU does.
#pragma once

#include <cstddef>
#include <memory>

namespace rnncore::metal::emu {

// A stack and a saved context. start() prepares it to run entry(arg) on its own stack
// (again: a fiber that finished or was abandoned mid-run can be restarted); switch_to()
// saves the current context into `from` and resumes `to`; exit_to() leaves a fiber that
// will not be resumed (only restarted). The switches are announced to AddressSanitizer
// and ThreadSanitizer when they instrument the build.
class Fiber {
 public:
  using Entry = void (*)(void*);
  explicit Fiber(size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  void start(Entry entry, void* arg);
  static void switch_to(Fiber& from, Fiber& to);
  [[noreturn]] static void exit_to(Fiber& from, Fiber& to);
  // A fiber object for the thread that drives the others (no stack of its own).
  static std::unique_ptr<Fiber> for_current_thread();

  struct Impl;

 private:
  Fiber() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rnncore::metal::emu
