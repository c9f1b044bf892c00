// User-space context switch: callee-saved registers are pushed on the running stack, the
// stack pointer is swapped. The floating-point control words are not switched: fibers
// share their thread's (kernels never change rounding), and loading them costs more than
// the rest of the switch. x86-64 (System V) and
// AArch64 in a few lines of assembly; other machines fall back to ucontext, which works
// but makes a system call per switch (about 30 times slower).
#include "metal/emulator/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "rnncore/error.hpp"

// Sanitized builds: every switch is announced, so that AddressSanitizer knows which stack
// is running (its reports, the unpoisoning when an exception unwinds, its fake stacks) and
// ThreadSanitizer treats each fiber as a thread of its own, with its own call stack, and
// each switch as a happens-before edge (unannounced, all the fibers of an OS thread are
// one thread to it, their call stacks mixed in its reports).
#if defined(__SANITIZE_ADDRESS__)
#define RNNCORE_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define RNNCORE_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RNNCORE_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define RNNCORE_TSAN 1
#endif
#endif
#ifdef RNNCORE_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef RNNCORE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__APPLE__)
#define RNNCORE_SYM(name) "_" #name
#define RNNCORE_HIDDEN(name) ".private_extern " RNNCORE_SYM(name) "\n"
#else
#define RNNCORE_SYM(name) #name
#define RNNCORE_HIDDEN(name) ".hidden " RNNCORE_SYM(name) "\n"
#endif

#if defined(__x86_64__) || defined(__aarch64__)
#define RNNCORE_ASM_FIBERS 1
extern "C" void rnncore_emu_switch(void** save_sp, void* load_sp);
extern "C" void rnncore_emu_trampoline();
#else
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// Frame: [r15 r14 r13 r12 rbx rbp][return address]. The trampoline starts a fiber with arg
// in r12 and entry in r13.
asm(".text\n"
    ".p2align 4\n"
    ".globl " RNNCORE_SYM(rnncore_emu_switch) "\n" RNNCORE_HIDDEN(rnncore_emu_switch)
    RNNCORE_SYM(rnncore_emu_switch) ":\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".p2align 4\n"
    ".globl " RNNCORE_SYM(rnncore_emu_trampoline) "\n" RNNCORE_HIDDEN(rnncore_emu_trampoline)
    RNNCORE_SYM(rnncore_emu_trampoline) ":\n"
    "  movq %r12, %rdi\n  callq *%r13\n  ud2\n");
#elif defined(__aarch64__)
// Frame (176 bytes): x19-x30, d8-d15. The trampoline starts a fiber with arg in x19
// and entry in x20.
asm(".text\n"
    ".p2align 4\n"
    ".globl " RNNCORE_SYM(rnncore_emu_switch) "\n" RNNCORE_HIDDEN(rnncore_emu_switch)
    RNNCORE_SYM(rnncore_emu_switch) ":\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n  str x9, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n  ret\n"
    ".p2align 4\n"
    ".globl " RNNCORE_SYM(rnncore_emu_trampoline) "\n" RNNCORE_HIDDEN(rnncore_emu_trampoline)
    RNNCORE_SYM(rnncore_emu_trampoline) ":\n"
    "  mov x0, x19\n  blr x20\n  brk #0\n");
#endif

namespace rnncore::metal::emu {

struct Fiber::Impl {
  char* map = nullptr;  // the mapping: a guard page, then the stack
  size_t map_bytes = 0;
  size_t page = 0;
  Entry entry = nullptr;
  void* arg = nullptr;
  bool started = false;  // a frame was laid out: not parked at start() means abandoned
  bool parked = false;   // its entry returned: waits in Fiber::main for the next start()
#ifdef RNNCORE_ASM_FIBERS
  void* sp = nullptr;
#else
  ucontext_t ctx{};
  void (*main)(void*) = nullptr;  // Fiber::main, for ucontext_entry
#endif
#ifdef RNNCORE_ASAN
  // The stack (for the thread's own, learnt when it first switches away) and, while
  // switched out, ASan's fake stack (detect_stack_use_after_return).
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* fake_stack = nullptr;
#endif
#ifdef RNNCORE_TSAN
  void* tsan = nullptr;
  bool owns_tsan = false;
#endif
};

namespace {

#ifdef RNNCORE_ASAN
// The fiber this OS thread's last switch left (whose stack ASan reports on arrival).
thread_local Fiber::Impl* t_switching_from = nullptr;
#endif

// Around every switch: before_switch() on the fiber that leaves, after_switch() first
// thing on the one that resumes (or starts), with the fake stack it left with.
void before_switch(Fiber::Impl& from, Fiber::Impl& to) {
#ifdef RNNCORE_ASAN
  t_switching_from = &from;
  __sanitizer_start_switch_fiber(&from.fake_stack, to.stack_bottom, to.stack_size);
#endif
#ifdef RNNCORE_TSAN
  __tsan_switch_to_fiber(to.tsan, 0);  // flags 0: the switch orders the two fibers
#endif
  (void)from, (void)to;
}

void after_switch(Fiber::Impl& self) {
#ifdef RNNCORE_ASAN
  const void* bottom = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(self.fake_stack, &bottom, &size);
  Fiber::Impl* from = t_switching_from;
  if (from && !from->stack_bottom) from->stack_bottom = bottom, from->stack_size = size;
#endif
  (void)self;
}

void switch_impl(Fiber::Impl& from, Fiber::Impl& to) {
  before_switch(from, to);
#ifdef RNNCORE_ASM_FIBERS
  rnncore_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.ctx, &to.ctx);
#endif
  after_switch(from);
}

#ifndef RNNCORE_ASM_FIBERS
void ucontext_entry(unsigned hi, unsigned lo) {
  auto* impl = reinterpret_cast<Fiber::Impl*>((uintptr_t(hi) << 32) | lo);
  impl->main(impl);
}
#endif

// A fiber abandoned mid-run is restarted from a fresh frame: the frames it left keep their
// ASan redzones poisoned (the next run's frames would trip over them: a false
// stack-buffer-underflow) and their entries on TSan's shadow call stack.
void reset_abandoned(Fiber::Impl& impl) {
#ifdef RNNCORE_ASAN
  __asan_unpoison_memory_region(impl.map + impl.page, impl.map_bytes - impl.page);
#endif
#ifdef RNNCORE_TSAN
  __tsan_destroy_fiber(impl.tsan);
  impl.tsan = __tsan_create_fiber(0);
#endif
  (void)impl;
}

}  // namespace

Fiber::Fiber() : impl_(std::make_unique<Impl>()) {}

Fiber::Fiber(size_t stack_bytes) : Fiber() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = (stack_bytes + page - 1) / page * page + page;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  // A stack overflow in a kernel faults on the guard page instead of corrupting memory.
  mprotect(m, page, PROT_NONE);
  impl_->map = static_cast<char*>(m);
  impl_->map_bytes = bytes;
  impl_->page = page;
#ifdef RNNCORE_ASAN
  impl_->stack_bottom = impl_->map + page;
  impl_->stack_size = bytes - page;
#endif
#ifdef RNNCORE_TSAN
  impl_->tsan = __tsan_create_fiber(0);
  impl_->owns_tsan = true;
#endif
}

Fiber::~Fiber() {
#ifdef RNNCORE_TSAN
  if (impl_->owns_tsan) __tsan_destroy_fiber(impl_->tsan);
#endif
  if (impl_->map) munmap(impl_->map, impl_->map_bytes);
}

std::unique_ptr<Fiber> Fiber::for_current_thread() {
  std::unique_ptr<Fiber> f(new Fiber());
#ifdef RNNCORE_TSAN
  f->impl_->tsan = __tsan_get_current_fiber();
#endif
  return f;
}

void Fiber::main(void* p) {
  auto& impl = *static_cast<Impl*>(p);
  after_switch(impl);
  for (;;) {
    Fiber& next = impl.entry(impl.arg);
    impl.parked = true;
    switch_impl(impl, *next.impl_);  // resumed by the next start() and switch_to()
  }
}

void Fiber::start(Entry entry, void* arg) {
  Impl& impl = *impl_;
  impl.entry = entry;
  impl.arg = arg;
  if (impl.parked) {
    impl.parked = false;
    return;
  }
  if (impl.started) reset_abandoned(impl);
  impl.started = true;
#ifdef RNNCORE_ASM_FIBERS
  auto top = reinterpret_cast<uintptr_t>(impl.map + impl.map_bytes) & ~uintptr_t(15);
#if defined(__x86_64__)
  // The return address sits just below `top`: after `ret` the stack is 16-byte aligned, as
  // the trampoline's call expects.
  auto* f = reinterpret_cast<uint64_t*>(top - 56);
  f[0] = 0;                                         // r15
  f[1] = 0;                                         // r14
  f[2] = reinterpret_cast<uint64_t>(&Fiber::main);  // r13
  f[3] = reinterpret_cast<uint64_t>(&impl);         // r12
  f[4] = 0;                                         // rbx
  f[5] = 0;                                         // rbp
  f[6] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);
#else
  auto* f = reinterpret_cast<uint64_t*>(top - 176);
  for (int i = 0; i < 22; ++i) f[i] = 0;
  f[0] = reinterpret_cast<uint64_t>(&impl);                     // x19
  f[1] = reinterpret_cast<uint64_t>(&Fiber::main);              // x20
  f[11] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);  // x30
#endif
  impl.sp = f;
#else
  getcontext(&impl.ctx);
  impl.ctx.uc_stack.ss_sp = impl.map + impl.page;
  impl.ctx.uc_stack.ss_size = impl.map_bytes - impl.page;
  impl.ctx.uc_link = nullptr;
  impl.main = &Fiber::main;
  const auto p = reinterpret_cast<uintptr_t>(&impl);
  makecontext(&impl.ctx, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(p >> 32),
              unsigned(p & 0xffffffffu));
#endif
}

void Fiber::switch_to(Fiber& from, Fiber& to) { switch_impl(*from.impl_, *to.impl_); }

}  // namespace rnncore::metal::emu
