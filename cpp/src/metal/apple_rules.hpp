// The metal-cpp executor's decisions that need no Metal: how caller memory is bound to a
// buffer, and which GPUs and pipelines it accepts. Header-only and plain C++ so that the
// tests check them on every platform (tests/cpp/test_apple_rules.cpp); apple_executor.cpp
// acts on them.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_params.h"

namespace rnncore::metal::apple {

// Caller arrays at least this large are wrapped in place instead of copied.
inline constexpr uint64_t kWrapMinBytes = 64 * 1024;

// How an array the executor did not allocate is bound.
struct HostBinding {
  enum class Kind {
    Placeholder,  // size 0: never read; a small executor-owned buffer stands in (Metal may
                  // return nil for a zero-length buffer, and the pointer is only a dummy)
    Copy,         // copied into a new shared buffer of `length` bytes (>= 1), offset 0
    Wrap,         // wrapped without a copy: the page-aligned span [begin, begin + length)
  };
  Kind kind = Kind::Placeholder;
  uintptr_t begin = 0;
  uint64_t length = 0;
  uint64_t offset = 0;  // byte offset of the array in the buffer: a multiple of element_size
};

inline bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Metal binds a buffer at an offset aligned to the element type the kernel reads, so an array
// is wrapped in place only when its address is a multiple of its element size (then so is its
// offset from the page it starts in); anything else, small arrays, and spans that would wrap
// around the address space, are copied.
inline HostBinding bind_host_memory(const void* p, uint64_t size, uint64_t element_size,
                                    uint64_t page_size) {
  HostBinding r;
  if (size == 0) return r;
  r.kind = HostBinding::Kind::Copy;
  r.length = size;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const bool aligned = is_power_of_two(element_size) && a % element_size == 0 &&
                       size % element_size == 0 && is_power_of_two(page_size) &&
                       page_size % element_size == 0;
  const bool fits = size <= UINTPTR_MAX - page_size && a <= UINTPTR_MAX - page_size - size;
  if (size < kWrapMinBytes || !aligned || !fits) return r;
  r.kind = HostBinding::Kind::Wrap;
  r.begin = a / page_size * page_size;
  r.length = (a + size + page_size - 1) / page_size * page_size - r.begin;
  r.offset = a - r.begin;
  return r;
}

// The kernels are written for 32-wide SIMD-groups (kernels::SIMD_WIDTH: lanes stride over k by
// 32 and reduce with simd_sum) and use Metal 3 SIMD-group reductions: Apple silicon, GPU family
// Apple7 (M1, A14) or later. An Intel Mac's AMD or Intel GPU runs 64- or 8/16/32-wide groups,
// where a kernel would silently skip hidden units; the paravirtual GPU of a macOS VM reports an
// older family. "" when the GPU is accepted, else the DeviceError message.
inline std::string gpu_refusal(const std::string& gpu, bool apple7) {
  if (apple7) return "";
  return "[device] 'metal' is not available: the GPU '" + gpu +
         "' is not an Apple silicon GPU (it does not support MTLGPUFamilyApple7); rnncore's "
         "Metal kernels need Apple silicon (M1 or later): their 32-wide SIMD-groups and SIMD "
         "reductions. Use device 'cpu'";
}

// "" when a pipeline's SIMD-group width is the kernels' (32), else the DeviceError message.
inline std::string simd_width_refusal(const std::string& kernel, const std::string& gpu,
                                      uint64_t width) {
  if (width == static_cast<uint64_t>(kernels::SIMD_WIDTH)) return "";
  return "[metal] kernel '" + kernel + "' runs in SIMD-groups of " + std::to_string(width) +
         " threads on the GPU '" + gpu + "', but rnncore's Metal kernels are written for " +
         std::to_string(kernels::SIMD_WIDTH) +
         " (Apple silicon) and would skip hidden units on it. Use device 'cpu'";
}

// Threads per threadgroup a dispatch runs with on a pipeline that allows at most max_threads
// (maxTotalThreadsPerThreadgroup: lower for kernels that use many registers): as planned when
// they fit; for a kernel that adapts to its threadgroup (Dispatch::adapts_threads: the
// persistent step kernels), the most whole SIMD-groups that fit; else 0, refused.
inline uint64_t threads_for_pipeline(uint64_t planned, uint64_t max_threads, bool adapts) {
  if (planned <= max_threads) return planned;
  if (!adapts) return 0;
  const auto width = static_cast<uint64_t>(kernels::SIMD_WIDTH);
  return max_threads / width * width;
}

}  // namespace rnncore::metal::apple
