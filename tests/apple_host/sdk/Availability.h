// Stand-in for the macOS SDK's <Availability.h> (see README.md): the SDK of macOS 15 with a
// deployment target of macOS 13.0 (what cmake/metal.cmake builds the kernels for).
#pragma once

#define __MAC_10_15 101500
#define __MAC_11_0 110000
#define __MAC_12_0 120000
#define __MAC_13_0 130000
#define __MAC_14_0 140000
#define __MAC_15_0 150000

#ifndef __MAC_OS_X_VERSION_MIN_REQUIRED
#define __MAC_OS_X_VERSION_MIN_REQUIRED __MAC_13_0
#endif
#define __MAC_OS_X_VERSION_MAX_ALLOWED __MAC_15_0
