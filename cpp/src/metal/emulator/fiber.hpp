// Cooperative fibers for the host emulator: one per GPU thread of a threadgroup, switched
// in user space (a few instructions, no system call) so barriers and simdgroup operations
// can suspend a thread the way the GPU does.
#pragma once

#include <cstddef>
#include <memory>

namespace rnncore::metal::emu {

// A stack and a saved context. start() prepares a fiber to run entry(arg) on its own
// stack; entry returns the fiber to switch to when it is done, and the fiber parks there
// until the next start(), which reuses the stack as it is. A fiber abandoned mid-run (a
// kernel stopped by a scheduler error) is restarted from a fresh frame instead.
// switch_to() saves the current context into `from` and resumes `to`. The switches are
// announced to AddressSanitizer and ThreadSanitizer when they instrument the build.
class Fiber {
 public:
  using Entry = Fiber& (*)(void*);
  explicit Fiber(size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  void start(Entry entry, void* arg);
  static void switch_to(Fiber& from, Fiber& to);
  // A fiber object for the thread that drives the others (no stack of its own).
  static std::unique_ptr<Fiber> for_current_thread();

  struct Impl;

 private:
  Fiber();
  [[noreturn]] static void main(void* impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rnncore::metal::emu
