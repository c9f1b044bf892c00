// Stand-in for the macOS SDK's <CoreFoundation/CoreFoundation.h> (see README.md). The SDK's
// umbrella header brings in the C library's headers and <dispatch/dispatch.h> (through
// CFStream.h); metal-cpp relies on both (INFINITY from <math.h>, dispatch_data_t).
#pragma once

#include <Availability.h>
#include <TargetConditionals.h>
#include <assert.h>
#include <ctype.h>
#include <dispatch/dispatch.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CF_EXPORT extern "C" __attribute__((visibility("default")))

typedef unsigned char Boolean;
typedef signed long CFIndex;
typedef const void* CFTypeRef;
typedef const struct __CFString* CFStringRef;
typedef double CFTimeInterval;
typedef CFTimeInterval CFAbsoluteTime;

CF_EXPORT CFStringRef __CFStringMakeConstantString(const char* cStr);
CF_EXPORT CFTypeRef CFRetain(CFTypeRef cf);
CF_EXPORT void CFRelease(CFTypeRef cf);
CF_EXPORT CFAbsoluteTime CFAbsoluteTimeGetCurrent(void);
