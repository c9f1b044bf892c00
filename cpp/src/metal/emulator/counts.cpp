// The instrumentation hooks of the counting kernels (kernels_counted.cpp, compiled with the
// compiler's kernel-address instrumentation in outlined-call mode: every load and store
// calls one of these with its address). They only count, into the calling thread's
// CountContext; there is no sanitizer runtime.
#include <cstddef>
#include <cstdint>

#include "metal/emulator/registry.hpp"

namespace {
inline void note(uintptr_t address, uint64_t size, bool write) {
  if (auto* c = rnncore::metal::emu::g_count) c->note(address, size, write);
}
}  // namespace

extern "C" {
#define RNNCORE_COUNT_HOOKS(size)                                         \
  void __asan_load##size##_noabort(uintptr_t a) { note(a, size, false); } \
  void __asan_store##size##_noabort(uintptr_t a) { note(a, size, true); }
RNNCORE_COUNT_HOOKS(1)
RNNCORE_COUNT_HOOKS(2)
RNNCORE_COUNT_HOOKS(4)
RNNCORE_COUNT_HOOKS(8)
RNNCORE_COUNT_HOOKS(16)
#undef RNNCORE_COUNT_HOOKS
void __asan_loadN_noabort(uintptr_t a, size_t n) { note(a, n, false); }
void __asan_storeN_noabort(uintptr_t a, size_t n) { note(a, n, true); }
void __asan_handle_no_return() {}
// Initialisation-order bracketing of the file's static constructors: nothing to check here.
void __asan_before_dynamic_init(const char*) {}
void __asan_after_dynamic_init() {}
}
