// Stand-in for the macOS SDK's <objc/message.h> (see README.md). With
// OBJC_OLD_DISPATCH_PROTOTYPES 0 (the SDK's default outside Swift) the dispatch functions take
// no arguments and must be cast to the right function pointer type before a call.
#pragma once

#include <objc/objc.h>
#include <objc/runtime.h>

#if defined(__arm64__) || defined(__aarch64__)
#define OBJC_ARM64_UNAVAILABLE __attribute__((unavailable("not available in arm64")))
#else
#define OBJC_ARM64_UNAVAILABLE
#endif

#if !OBJC_OLD_DISPATCH_PROTOTYPES
OBJC_EXPORT void objc_msgSend(void /* id self, SEL op, ... */);
OBJC_EXPORT void objc_msgSend_stret(void /* id self, SEL op, ... */) OBJC_ARM64_UNAVAILABLE;
#if defined(__i386__) || defined(__x86_64__)
OBJC_EXPORT void objc_msgSend_fpret(void /* id self, SEL op, ... */);
#endif
#else
OBJC_EXPORT id objc_msgSend(id self, SEL op, ...);
OBJC_EXPORT void objc_msgSend_stret(id self, SEL op, ...) OBJC_ARM64_UNAVAILABLE;
#if defined(__x86_64__)
OBJC_EXPORT long double objc_msgSend_fpret(id self, SEL op, ...);
#endif
#endif
