// Stand-in for the macOS SDK's <objc/objc.h> (see README.md), as seen from C++.
#pragma once

#include <Availability.h>
#include <TargetConditionals.h>

#ifndef OBJC_OLD_DISPATCH_PROTOTYPES
#define OBJC_OLD_DISPATCH_PROTOTYPES 0
#endif

#define OBJC_EXPORT extern "C" __attribute__((visibility("default")))

typedef struct objc_class* Class;

struct objc_object {
  Class isa;
};

typedef struct objc_object* id;
typedef struct objc_selector* SEL;

#if !OBJC_OLD_DISPATCH_PROTOTYPES
typedef void (*IMP)(void);
#else
typedef id (*IMP)(id, SEL, ...);
#endif

// arm64 Macs: BOOL is bool; Intel Macs: signed char.
#if defined(__arm64__) || defined(__aarch64__)
typedef bool BOOL;
#else
typedef signed char BOOL;
#endif

OBJC_EXPORT const char* sel_getName(SEL sel);
OBJC_EXPORT SEL sel_registerName(const char* str);
OBJC_EXPORT const char* object_getClassName(id obj);
