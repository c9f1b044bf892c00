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
// ThreadSanitizer keeps a shadow call stack and happens-before order per fiber (without
// that it crashes at the first switch).
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
#ifdef RNNCORE_ASM_FIBERS
  void* sp = nullptr;
#else
  ucontext_t ctx{};
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

// Around every switch: before() runs on the fiber that leaves (`exiting`: for good),
// after() first thing on the one that resumes, or starts with its fake stack `fake`.
void before_switch(Fiber::Impl& from, Fiber::Impl& to, bool exiting) {
#ifdef RNNCORE_ASAN
  t_switching_from = &from;
  // A null save slot tells ASan the leaving fiber is done: its fake stack is freed.
  __sanitizer_start_switch_fiber(exiting ? nullptr : &from.fake_stack, to.stack_bottom,
                                 to.stack_size);
#endif
#ifdef RNNCORE_TSAN
  __tsan_switch_to_fiber(to.tsan, 0);  // flags 0: the switch orders the two fibers
#endif
  (void)from, (void)to, (void)exiting;
}

void* saved_fake_stack(Fiber::Impl& impl) {
#ifdef RNNCORE_ASAN
  return impl.fake_stack;
#else
  (void)impl;
  return nullptr;
#endif
}

void after_switch(void* fake) {
#ifdef RNNCORE_ASAN
  const void* bottom = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  Fiber::Impl* from = t_switching_from;
  if (from && !from->stack_bottom) from->stack_bottom = bottom, from->stack_size = size;
#endif
  (void)fake;
}

// What every fiber runs: its entry leaves with exit_to() and never returns here.
void fiber_main(void* p) {
  auto* impl = static_cast<Fiber::Impl*>(p);
  after_switch(nullptr);
  impl->entry(impl->arg);
  std::abort();
}

}  // namespace

Fiber::Fiber(size_t stack_bytes) : impl_(std::make_unique<Impl>()) {
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
}

Fiber::~Fiber() {
  if (!impl_) return;
#ifdef RNNCORE_TSAN
  if (impl_->owns_tsan && impl_->tsan) __tsan_destroy_fiber(impl_->tsan);
#endif
  if (impl_->map) munmap(impl_->map, impl_->map_bytes);
}

std::unique_ptr<Fiber> Fiber::for_current_thread() {
  std::unique_ptr<Fiber> f(new Fiber());
  f->impl_ = std::make_unique<Impl>();
#ifdef RNNCORE_TSAN
  f->impl_->tsan = __tsan_get_current_fiber();
#endif
  return f;
}

namespace {
// A fiber being restarted was left with live frames: at its exit_to(), or anywhere when a
// scheduler error abandoned its kernel. Their ASan redzones stay poisoned (the next run's
// frames would trip over them: a false stack-buffer-underflow), and TSan keeps the old
// run's shadow call stack.
void reset_for_start(Fiber::Impl& impl) {
#ifdef RNNCORE_ASAN
  __asan_unpoison_memory_region(impl.map + impl.page, impl.map_bytes - impl.page);
  impl.fake_stack = nullptr;
#endif
#ifdef RNNCORE_TSAN
  if (impl.tsan) __tsan_destroy_fiber(impl.tsan);
  impl.tsan = __tsan_create_fiber(0);
  impl.owns_tsan = true;
#endif
  (void)impl;
}
}  // namespace

#ifdef RNNCORE_ASM_FIBERS

void Fiber::start(Entry entry, void* arg) {
  reset_for_start(*impl_);
  impl_->entry = entry;
  impl_->arg = arg;
  auto top = reinterpret_cast<uintptr_t>(impl_->map + impl_->map_bytes) & ~uintptr_t(15);
#if defined(__x86_64__)
  // The return address sits just below `top`: after `ret` the stack is 16-byte aligned, as
  // the trampoline's call expects.
  auto* f = reinterpret_cast<uint64_t*>(top - 56);
  f[0] = 0;                                        // r15
  f[1] = 0;                                        // r14
  f[2] = reinterpret_cast<uint64_t>(&fiber_main);  // r13
  f[3] = reinterpret_cast<uint64_t>(impl_.get());  // r12
  f[4] = 0;                                        // rbx
  f[5] = 0;                                        // rbp
  f[6] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);
#else
  auto* f = reinterpret_cast<uint64_t*>(top - 176);
  for (int i = 0; i < 22; ++i) f[i] = 0;
  f[0] = reinterpret_cast<uint64_t>(impl_.get());               // x19
  f[1] = reinterpret_cast<uint64_t>(&fiber_main);               // x20
  f[11] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);  // x30
#endif
  impl_->sp = f;
}

void Fiber::switch_to(Fiber& from, Fiber& to) {
  before_switch(*from.impl_, *to.impl_, false);
  rnncore_emu_switch(&from.impl_->sp, to.impl_->sp);
  after_switch(saved_fake_stack(*from.impl_));
}

#else

namespace {
void ucontext_entry(unsigned hi, unsigned lo) {
  fiber_main(reinterpret_cast<Fiber::Impl*>((uintptr_t(hi) << 32) | lo));
}
}  // namespace

void Fiber::start(Entry entry, void* arg) {
  reset_for_start(*impl_);
  impl_->entry = entry;
  impl_->arg = arg;
  getcontext(&impl_->ctx);
  impl_->ctx.uc_stack.ss_sp = impl_->map + impl_->page;
  impl_->ctx.uc_stack.ss_size = impl_->map_bytes - impl_->page;
  impl_->ctx.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(impl_.get());
  makecontext(&impl_->ctx, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(p >> 32),
              unsigned(p & 0xffffffffu));
}

void Fiber::switch_to(Fiber& from, Fiber& to) {
  before_switch(*from.impl_, *to.impl_, false);
  swapcontext(&from.impl_->ctx, &to.impl_->ctx);
  after_switch(saved_fake_stack(*from.impl_));
}

#endif

void Fiber::exit_to(Fiber& from, Fiber& to) {
  before_switch(*from.impl_, *to.impl_, true);
#ifdef RNNCORE_ASM_FIBERS
  rnncore_emu_switch(&from.impl_->sp, to.impl_->sp);
#else
  swapcontext(&from.impl_->ctx, &to.impl_->ctx);
#endif
  std::abort();  // never resumed: start() begins afresh
}

}  // namespace rnncore::metal::emu
