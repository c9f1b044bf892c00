// The metal-cpp executor's decisions that need no Metal (cpp/src/metal/apple_rules.hpp): how
// caller memory is bound, and which GPUs and pipelines are refused. The executor itself only
// runs on a Mac (.github/workflows/macos.yml); these run everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "metal/apple_rules.hpp"

namespace {

using rnncore::metal::apple::bind_host_memory;
using rnncore::metal::apple::gpu_refusal;
using rnncore::metal::apple::HostBinding;
using rnncore::metal::apple::kWrapMinBytes;
using rnncore::metal::apple::simd_width_refusal;
using rnncore::metal::apple::threads_for_pipeline;

constexpr uint64_t kPage = 16 * 1024;  // Apple silicon

const void* at(uintptr_t address) { return reinterpret_cast<const void*>(address); }

TEST(AppleRules, AlignedLargeArraysAreWrappedAtAnElementAlignedOffset) {
  for (uint64_t element : {2, 4}) {
    for (uintptr_t address : {uintptr_t{0x100000}, uintptr_t{0x100000 + 4 * 1000},
                              uintptr_t{0x100000 + kPage - element}}) {
      const HostBinding b = bind_host_memory(at(address), kWrapMinBytes, element, kPage);
      ASSERT_EQ(b.kind, HostBinding::Kind::Wrap) << element << " " << address;
      EXPECT_EQ(b.begin % kPage, 0u);
      EXPECT_EQ(b.length % kPage, 0u);
      EXPECT_EQ(b.begin + b.offset, address);
      EXPECT_EQ(b.offset % element, 0u);
      EXPECT_GE(b.begin + b.length, address + kWrapMinBytes);
      EXPECT_LT(b.offset, kPage);
    }
  }
}

// Issue 11, item 2: a view of 64 KiB or more whose address is not a multiple of its element
// size was wrapped in place at that (misaligned) offset.
TEST(AppleRules, MisalignedLargeArraysAreCopied) {
  const uintptr_t base = 0x100000;
  for (uint64_t element : {2, 4}) {
    for (uintptr_t shift = 1; shift < element; ++shift) {
      for (uint64_t size : {kWrapMinBytes, 4 * kWrapMinBytes, uint64_t{1} << 30}) {
        const HostBinding b = bind_host_memory(at(base + shift), size, element, kPage);
        EXPECT_EQ(b.kind, HostBinding::Kind::Copy) << element << " +" << shift << " " << size;
        EXPECT_EQ(b.length, size);
        EXPECT_EQ(b.offset, 0u);
      }
    }
  }
  // float16 data at an odd address, float32 data 2 bytes off.
  EXPECT_EQ(bind_host_memory(at(base + 2), kWrapMinBytes, 4, kPage).kind, HostBinding::Kind::Copy);
  EXPECT_EQ(bind_host_memory(at(base + 2), kWrapMinBytes, 2, kPage).kind, HostBinding::Kind::Wrap);
}

TEST(AppleRules, SmallArraysAreCopied) {
  const HostBinding b = bind_host_memory(at(0x100000), kWrapMinBytes - 4, 4, kPage);
  EXPECT_EQ(b.kind, HostBinding::Kind::Copy);
  EXPECT_EQ(b.length, kWrapMinBytes - 4);
}

// Zero-size inputs reach the executor with a non-null dummy pointer: nothing is wrapped or
// copied from it and no zero-length buffer is asked for.
TEST(AppleRules, EmptyArraysGetThePlaceholder) {
  for (uintptr_t address : {uintptr_t{1}, uintptr_t{0x100000}, uintptr_t{0x100003}}) {
    const HostBinding b = bind_host_memory(at(address), 0, 4, kPage);
    EXPECT_EQ(b.kind, HostBinding::Kind::Placeholder);
    EXPECT_EQ(b.length, 0u);
  }
}

TEST(AppleRules, NonsenseSizesAreCopiedNotWrapped) {
  // Element sizes that are no power of two, a size that is not whole elements, a span that
  // would pass the end of the address space.
  EXPECT_EQ(bind_host_memory(at(0x100000), kWrapMinBytes, 3, kPage).kind, HostBinding::Kind::Copy);
  EXPECT_EQ(bind_host_memory(at(0x100000), kWrapMinBytes, 0, kPage).kind, HostBinding::Kind::Copy);
  EXPECT_EQ(bind_host_memory(at(0x100000), kWrapMinBytes + 2, 4, kPage).kind,
            HostBinding::Kind::Copy);
  EXPECT_EQ(bind_host_memory(at(UINTPTR_MAX - kWrapMinBytes - 4 + 1), kWrapMinBytes, 4, kPage).kind,
            HostBinding::Kind::Copy);
}

// Issue 11, item 5: GPUs that are not Apple silicon (an Intel Mac's AMD GPU with 64-wide
// SIMD-groups, a VM's paravirtual GPU) are refused with a message that says why.
TEST(AppleRules, OnlyAppleSiliconGpusAreAccepted) {
  EXPECT_EQ(gpu_refusal("Apple M2", true), "");
  const std::string why = gpu_refusal("AMD Radeon Pro 5500M", false);
  EXPECT_NE(why.find("[device] 'metal' is not available"), std::string::npos) << why;
  EXPECT_NE(why.find("'AMD Radeon Pro 5500M'"), std::string::npos) << why;
  EXPECT_NE(why.find("MTLGPUFamilyApple7"), std::string::npos) << why;
  EXPECT_NE(why.find("Apple silicon"), std::string::npos) << why;
  EXPECT_NE(why.find("32-wide"), std::string::npos) << why;
  EXPECT_NE(why.find("device 'cpu'"), std::string::npos) << why;
}

TEST(AppleRules, PipelinesMustRunIn32WideSimdgroups) {
  EXPECT_EQ(simd_width_refusal("gru_step_b1_f32", "Apple M1", 32), "");
  for (uint64_t width : {8, 16, 64}) {
    const std::string why = simd_width_refusal("gru_step_b1_f32", "AMD Radeon Pro 5500M", width);
    EXPECT_NE(why.find("'gru_step_b1_f32'"), std::string::npos) << why;
    EXPECT_NE(why.find("SIMD-groups of " + std::to_string(width) + " threads"), std::string::npos)
        << why;
    EXPECT_NE(why.find("written for 32"), std::string::npos) << why;
    EXPECT_NE(why.find("skip hidden units"), std::string::npos) << why;
  }
}

// A pipeline that allows fewer threads than planned (a kernel with many registers): the
// persistent kernels take the most whole simdgroups that fit, the others are refused.
TEST(AppleRules, OnlyAdaptingKernelsRunWithFewerThreads) {
  EXPECT_EQ(threads_for_pipeline(256, 1024, false), 256u);
  EXPECT_EQ(threads_for_pipeline(1024, 1024, true), 1024u);
  EXPECT_EQ(threads_for_pipeline(1024, 896, true), 896u);
  EXPECT_EQ(threads_for_pipeline(1024, 900, true), 896u);  // whole simdgroups only
  EXPECT_EQ(threads_for_pipeline(1024, 896, false), 0u);
  EXPECT_EQ(threads_for_pipeline(64, 31, true), 0u);  // not even one simdgroup
}

}  // namespace
