// Stand-in for the macOS SDK's <dispatch/dispatch.h> (see README.md), as seen from C++ that is
// not Objective-C (OS_OBJECT_USE_OBJC 0): dispatch objects are opaque classes that C++ can
// neither construct, copy nor destroy, and each type converts to dispatch_object_t only.
#pragma once

#include <stddef.h>

#include <Availability.h>
#include <TargetConditionals.h>

#define DISPATCH_EXPORT extern "C" __attribute__((visibility("default")))
#define DISPATCH_NONNULL_ALL __attribute__((__nonnull__))
#define DISPATCH_WARN_RESULT __attribute__((__warn_unused_result__))
#define DISPATCH_NOTHROW __attribute__((__nothrow__))

typedef struct dispatch_object_s {
 private:
  dispatch_object_s();
  ~dispatch_object_s();
  dispatch_object_s(const dispatch_object_s&);
  void operator=(const dispatch_object_s&);
} * dispatch_object_t;

#define DISPATCH_DECL(name) typedef struct name##_s : public dispatch_object_s{} * name##_t

DISPATCH_DECL(dispatch_queue);
DISPATCH_DECL(dispatch_data);

typedef void (^dispatch_block_t)(void);

DISPATCH_EXPORT DISPATCH_NONNULL_ALL DISPATCH_NOTHROW void dispatch_retain(
    dispatch_object_t object);
DISPATCH_EXPORT DISPATCH_NONNULL_ALL DISPATCH_NOTHROW void dispatch_release(
    dispatch_object_t object);

// The default destructor copies the buffer when the data object is created.
#define DISPATCH_DATA_DESTRUCTOR_DEFAULT NULL

DISPATCH_EXPORT DISPATCH_WARN_RESULT DISPATCH_NOTHROW dispatch_data_t dispatch_data_create(
    const void* buffer, size_t size, dispatch_queue_t queue, dispatch_block_t destructor);
DISPATCH_EXPORT DISPATCH_NONNULL_ALL DISPATCH_NOTHROW size_t
dispatch_data_get_size(dispatch_data_t data);
