// Stand-in for the macOS SDK's <IOSurface/IOSurfaceRef.h> (see README.md).
#pragma once

#include <CoreFoundation/CoreFoundation.h>

typedef struct __IOSurface* IOSurfaceRef;
