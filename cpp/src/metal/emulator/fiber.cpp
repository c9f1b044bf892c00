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
#include <new>

#include "rnncore/error.hpp"

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
#ifdef RNNCORE_ASM_FIBERS
  void* sp = nullptr;
#else
  ucontext_t ctx{};
  Entry entry = nullptr;
  void* arg = nullptr;
#endif
};

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
}

Fiber::~Fiber() {
  if (impl_ && impl_->map) munmap(impl_->map, impl_->map_bytes);
}

std::unique_ptr<Fiber> Fiber::for_current_thread() {
  std::unique_ptr<Fiber> f(new Fiber());
  f->impl_ = std::make_unique<Impl>();
  return f;
}

#ifdef RNNCORE_ASM_FIBERS

void Fiber::start(Entry entry, void* arg) {
  auto top = reinterpret_cast<uintptr_t>(impl_->map + impl_->map_bytes) & ~uintptr_t(15);
#if defined(__x86_64__)
  // The return address sits just below `top`: after `ret` the stack is 16-byte aligned, as
  // the trampoline's call expects.
  auto* f = reinterpret_cast<uint64_t*>(top - 56);
  f[0] = 0;                                  // r15
  f[1] = 0;                                  // r14
  f[2] = reinterpret_cast<uint64_t>(entry);  // r13
  f[3] = reinterpret_cast<uint64_t>(arg);    // r12
  f[4] = 0;                                  // rbx
  f[5] = 0;                                  // rbp
  f[6] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);
#else
  auto* f = reinterpret_cast<uint64_t*>(top - 176);
  for (int i = 0; i < 22; ++i) f[i] = 0;
  f[0] = reinterpret_cast<uint64_t>(arg);                       // x19
  f[1] = reinterpret_cast<uint64_t>(entry);                     // x20
  f[11] = reinterpret_cast<uint64_t>(&rnncore_emu_trampoline);  // x30
#endif
  impl_->sp = f;
}

void Fiber::switch_to(Fiber& from, Fiber& to) { rnncore_emu_switch(&from.impl_->sp, to.impl_->sp); }

#else

namespace {
void ucontext_entry(unsigned hi, unsigned lo) {
  auto* impl = reinterpret_cast<Fiber::Impl*>((uintptr_t(hi) << 32) | lo);
  impl->entry(impl->arg);
}
}  // namespace

void Fiber::start(Entry entry, void* arg) {
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

void Fiber::switch_to(Fiber& from, Fiber& to) { swapcontext(&from.impl_->ctx, &to.impl_->ctx); }

#endif

}  // namespace rnncore::metal::emu
