// Stand-in for the macOS SDK's <objc/runtime.h> (see README.md), as seen from C++.
#pragma once

#include <objc/objc.h>

// Outside Objective-C, Protocol is an object type.
typedef struct objc_object Protocol;

OBJC_EXPORT Class objc_lookUpClass(const char* name);
OBJC_EXPORT Class objc_getClass(const char* name);
OBJC_EXPORT Protocol* objc_getProtocol(const char* name);
OBJC_EXPORT Class object_getClass(id obj);
OBJC_EXPORT const char* class_getName(Class cls);
OBJC_EXPORT BOOL class_respondsToSelector(Class cls, SEL sel);
