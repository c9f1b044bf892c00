// Runs rnncore's metal-cpp executor (the object the library ships, built on Linux by the
// stand-in build) against a fake Objective-C runtime and a fake Metal, on x86-64 Linux.
//
// objc_msgSend is a trampoline, as the real one is: it looks up the method for (receiver,
// selector) and jumps to it with every argument register and the stack untouched, so each fake
// method is a plain function with the exact signature metal-cpp casts objc_msgSend to. An
// unknown selector aborts, naming it. The fakes model what the executor relies on: device
// discovery (MTLCreateSystemDefaultDevice, MTLCopyAllDevices), GPU families, the OS version
// (NSProcessInfo), libraries (the stand-in metallibs of tests/apple_host/xcrun: a metal3.1 one
// loads only on macOS 14 and later and alone has the bfloat16 kernels), buffers (with Metal's
// rule that bytes-no-copy buffers are page-aligned), pipelines (their SIMD-group width) and the
// compute encoder, which records every binding. Nothing is computed.
//
//   fake_metal <scenario>     scenarios: see run_scenario(); prints "ok ..." / "FAIL ..."
//                             lines. Each runs on macOS 14.0.0 unless it says otherwise: the
//                             oldest OS that loads the macOS 14 library, the one most run.
//
// Built and run by tests/test_apple_host.py. Each scenario is a process of its own: the
// executor probes the GPU once per process.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "metal/executor.hpp"
#include "metal/plan.hpp"
#include "rnncore/error.hpp"

#if !defined(__x86_64__) || !defined(__linux__)
#error "the fake Objective-C runtime is written for x86-64 Linux"
#endif

// The embedded libraries, from the Metal object under test (cmake/metal.cmake).
extern "C" const unsigned char rnncore_metallib[];
extern "C" const unsigned long long rnncore_metallib_size;
extern "C" const unsigned char rnncore_metallib_macos14[];
extern "C" const unsigned long long rnncore_metallib_macos14_size;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// ---- the fake runtime ---------------------------------------------------------------------

struct FakeClass;

// Every fake object, class objects included, starts with this header.
struct Object {
  const FakeClass* cls;
  int refs = 1;
  virtual ~Object() = default;
};

struct FakeClass {
  std::string name;
  std::map<std::string, void*> methods;
  const FakeClass* super = nullptr;
};

std::set<std::string>& selectors() {
  static std::set<std::string> s;
  return s;
}

const char* sel_name(const void* sel) { return static_cast<const char*>(sel); }

std::map<std::string, FakeClass>& classes();

void* find_method(const FakeClass* cls, const std::string& sel) {
  for (; cls; cls = cls->super)
    if (auto it = cls->methods.find(sel); it != cls->methods.end()) return it->second;
  return nullptr;
}

}  // namespace

extern "C" {

void fake_objc_nil();  // returns 0 in every return register, as a message to nil does

void* fake_objc_lookup(const Object* self, const void* sel) {
  if (!self) {
    // Objective-C: a message to nil returns 0. metal-cpp's SharedPtr relies on it for retain
    // and release; any other message to nil is an executor bug here.
    const std::string name = sel_name(sel);
    if (name == "release" || name == "retain" || name == "autorelease")
      return reinterpret_cast<void*>(fake_objc_nil);
    std::fprintf(stderr, "fake objc: message %s to nil\n", name.c_str());
    std::abort();
  }
  void* imp = find_method(self->cls, sel_name(sel));
  if (!imp) {
    std::fprintf(stderr, "fake objc: %s does not respond to %s\n", self->cls->name.c_str(),
                 sel_name(sel));
    std::abort();
  }
  return imp;
}

void* sel_registerName(const char* name) {
  return const_cast<char*>(selectors().insert(name).first->c_str());
}

// The trampolines: x86-64 SysV, receiver and selector in rdi/rsi (rsi/rdx for _stret).
asm(R"(
  .text
  .macro FAKE_MSGSEND name, self, sel
  .globl \name
  .type \name,@function
\name:
  push %rbp
  mov %rsp, %rbp
  sub $0xd0, %rsp
  mov %rdi, 0x00(%rsp)
  mov %rsi, 0x08(%rsp)
  mov %rdx, 0x10(%rsp)
  mov %rcx, 0x18(%rsp)
  mov %r8, 0x20(%rsp)
  mov %r9, 0x28(%rsp)
  mov %rax, 0x30(%rsp)
  movdqu %xmm0, 0x40(%rsp)
  movdqu %xmm1, 0x50(%rsp)
  movdqu %xmm2, 0x60(%rsp)
  movdqu %xmm3, 0x70(%rsp)
  movdqu %xmm4, 0x80(%rsp)
  movdqu %xmm5, 0x90(%rsp)
  movdqu %xmm6, 0xa0(%rsp)
  movdqu %xmm7, 0xb0(%rsp)
  mov \self, %rdi
  mov \sel, %rsi
  call fake_objc_lookup@PLT
  mov %rax, %r11
  mov 0x00(%rsp), %rdi
  mov 0x08(%rsp), %rsi
  mov 0x10(%rsp), %rdx
  mov 0x18(%rsp), %rcx
  mov 0x20(%rsp), %r8
  mov 0x28(%rsp), %r9
  mov 0x30(%rsp), %rax
  movdqu 0x40(%rsp), %xmm0
  movdqu 0x50(%rsp), %xmm1
  movdqu 0x60(%rsp), %xmm2
  movdqu 0x70(%rsp), %xmm3
  movdqu 0x80(%rsp), %xmm4
  movdqu 0x90(%rsp), %xmm5
  movdqu 0xa0(%rsp), %xmm6
  movdqu 0xb0(%rsp), %xmm7
  leave
  jmp *%r11
  .size \name, .-\name
  .endm
  .globl fake_objc_nil
  .type fake_objc_nil,@function
fake_objc_nil:
  xor %eax, %eax
  xor %edx, %edx
  xorps %xmm0, %xmm0
  xorps %xmm1, %xmm1
  ret
  .size fake_objc_nil, .-fake_objc_nil
  FAKE_MSGSEND objc_msgSend, %rdi, %rsi
  FAKE_MSGSEND objc_msgSend_fpret, %rdi, %rsi
  FAKE_MSGSEND objc_msgSend_stret, %rsi, %rdx
)");

}  // extern "C"

namespace {

// ---- fake Foundation and Metal ------------------------------------------------------------

using UInteger = uintptr_t;
using SEL = const void*;
struct Size {
  UInteger width, height, depth;
};

template <class T>
T* make(const char* cls) {
  T* o = new T();
  o->cls = &classes().at(cls);
  return o;
}

struct String : Object {
  std::string text;
};
struct Array : Object {
  std::vector<Object*> items;
};
struct Device : Object {
  std::string name;
  bool apple7 = true;
  UInteger simd_width = 32;
};
struct Buffer : Object {
  std::string how;  // "length", "bytes", "nocopy"
  void* contents = nullptr;
  UInteger length = 0;
  bool owned = false;
  ~Buffer() override {
    if (owned) std::free(contents);
  }
};
struct Pipeline : Object {
  UInteger width = 32;
};
struct Data : Object {
  std::vector<unsigned char> bytes;
};
struct Library : Object {
  std::string language;  // "metal3.0", "metal3.1": the -std its .air files were compiled with
};
int live_functions = 0;
struct Function : Object {
  Function() { ++live_functions; }
  ~Function() override { --live_functions; }
};
// NS::OperatingSystemVersion: 24 bytes, so passed in memory (on the stack) on x86-64.
struct OsVersion {
  long major, minor, patch;
};

// What the executor did.
struct SetBuffer {
  Buffer* buffer;  // null: setBufferOffset (the buffer bound before at the index)
  UInteger offset, index;
};
struct Log {
  std::vector<Buffer*> buffers;  // every buffer created (kept alive for inspection)
  std::vector<SetBuffer> bindings;
  std::vector<std::string> functions;  // newFunctionWithName:constantValues:error:
  std::vector<std::string> probes;     // newFunctionWithName:
  int dispatches = 0, pipelines_set = 0, commits = 0, waits = 0, encoders = 0;
  bool ended = false, committed = false, waited = false;
  std::vector<unsigned char> library;  // the bytes of the library last loaded
  std::string library_from;            // "data" or the file's path
  std::string library_language;        // its -std, "" when refused
  std::string device_used;
} record;

Device* the_default = nullptr;
std::vector<Device*> all_devices;
OsVersion os_version = {14, 0, 0};  // the macOS the scenario runs on
std::string library_refusal;        // when set, every library load fails with this error

Object* retain(Object* self, SEL) {
  ++self->refs;
  return self;
}
void release(Object* self, SEL) {
  if (--self->refs == 0 && !dynamic_cast<Buffer*>(self) && !dynamic_cast<Device*>(self))
    delete self;  // buffers and devices stay for inspection
}
Object* self_(Object* self, SEL) { return self; }
bool responds(Object* self, SEL, SEL sel) { return find_method(self->cls, sel_name(sel)); }
Object* signature(Object* self, SEL, SEL sel) {
  return find_method(self->cls, sel_name(sel)) ? self : nullptr;
}
Object* alloc_pool(Object*, SEL) { return make<Object>("NSAutoreleasePool"); }
Object* alloc_constants(Object*, SEL) { return make<Object>("MTLFunctionConstantValues"); }
void set_constant(Object*, SEL, const void* value, UInteger type, UInteger index) {
  if (!value || (type != 53 && type != 29) || index > 64) std::abort();  // Bool, Int
}
String* string_with(Object*, SEL, const char* text, UInteger encoding) {
  if (encoding != 4) std::abort();  // NSUTF8StringEncoding
  String* s = make<String>("NSString");
  s->text = text;
  return s;
}
const char* utf8(String* self, SEL) { return self->text.c_str(); }
String* error_text(Object* self, SEL) {
  String* s = make<String>("NSString");
  s->text = static_cast<String*>(self)->text;
  return s;
}
UInteger count(Array* self, SEL) { return self->items.size(); }
Object* object_at(Array* self, SEL, UInteger i) { return self->items.at(i); }

String* device_name(Device* self, SEL) {
  String* s = make<String>("NSString");
  s->text = self->name;
  return s;
}
bool supports_family(Device* self, SEL, UInteger family) {
  if (family >= 1001 && family <= 1010) return self->apple7 || family < 1007;
  return family == 2002 || family == 3001;  // Mac2, Common1
}
Object* make_error(const std::string& text) {
  String* e = make<String>("NSError");  // an error whose description is its text
  e->text = text;
  return e;
}
bool at_least(const OsVersion& v) {
  if (os_version.major != v.major) return os_version.major > v.major;
  if (os_version.minor != v.minor) return os_version.minor > v.minor;
  return os_version.patch >= v.patch;
}

// A stand-in metallib (tests/apple_host/xcrun): its magic line, then "std <language>".
Library* load_library(Device* self, const std::vector<unsigned char>& bytes,
                      const std::string& from, Object** error) {
  record.library.assign(bytes.begin(), bytes.end());
  record.library_from = from;
  record.library_language.clear();
  record.device_used = self->name;
  const std::string text(bytes.begin(), bytes.end());
  const std::string magic = "rnncore stand-in metallib v2\nstd ";
  std::string refusal = library_refusal;
  std::string language;
  if (refusal.empty() && text.compare(0, magic.size(), magic) != 0)
    refusal = "fake: not a (stand-in) metallib";
  if (refusal.empty()) {
    language = text.substr(magic.size(), text.find('\n', magic.size()) - magic.size());
    if (language != "metal3.0" && language != "metal3.1")
      refusal = "fake: unknown Metal language " + language;
    // As on a Mac: an OS older than the library's language does not load it.
    else if (language == "metal3.1" && !at_least({14, 0, 0}))
      refusal = "fake: a metal3.1 library needs macOS 14";
  }
  if (!refusal.empty()) {
    if (error) *error = make_error(refusal);
    return nullptr;
  }
  if (error) *error = nullptr;
  record.library_language = language;
  Library* library = make<Library>("MTLLibrary");
  library->language = language;
  return library;
}
Library* new_library(Device* self, SEL, Data* data, Object** error) {
  return load_library(self, data->bytes, "data", error);
}
Library* new_library_file(Device* self, SEL, String* path, Object** error) {
  std::ifstream in(path->text, std::ios::binary);
  if (!in) {
    if (error) *error = make_error("fake: no such file " + path->text);
    return nullptr;
  }
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
  return load_library(self, bytes, path->text, error);
}
// Which kernels a library has: the bfloat16-storage ones only in the metal3.1 library (the
// shaders instantiate them only under __HAVE_BFLOAT__); any other name is taken to exist.
bool has_function(const Library* library, const std::string& name) {
  const bool bfloat16 = name == "gemm_bbb" || name == "gemm_fbb" || name == "gemm_ffb" ||
                        name == "gemm_fbf" ||
                        (name.size() > 5 && name.compare(name.size() - 5, 5, "_bf16") == 0);
  return !bfloat16 || library->language == "metal3.1";
}
Object* new_queue(Device*, SEL) { return make<Object>("MTLCommandQueue"); }
UInteger max_tg_memory(Device*, SEL) { return 32 * 1024; }
Buffer* new_buffer(Device*, SEL, UInteger length, UInteger) {
  Buffer* b = make<Buffer>("MTLBuffer");
  b->how = "length";
  b->length = length;
  b->contents = std::aligned_alloc(16384, (length + 16383) / 16384 * 16384);
  b->owned = true;
  record.buffers.push_back(b);
  return b;
}
Buffer* new_buffer_bytes(Device* d, SEL s, const void* p, UInteger length, UInteger options) {
  Buffer* b = new_buffer(d, s, length, options);
  b->how = "bytes";
  std::memcpy(b->contents, p, length);
  return b;
}
Buffer* new_buffer_nocopy(Device*, SEL, const void* p, UInteger length, UInteger, void*) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (reinterpret_cast<uintptr_t>(p) % page != 0 || length % page != 0 || length == 0)
    return nullptr;  // Metal's rule for bytes-no-copy buffers
  Buffer* b = make<Buffer>("MTLBuffer");
  b->how = "nocopy";
  b->contents = const_cast<void*>(p);
  b->length = length;
  record.buffers.push_back(b);
  return b;
}
Pipeline* new_pipeline(Device* self, SEL, Object*, Object** error) {
  if (error) *error = nullptr;
  Pipeline* p = make<Pipeline>("MTLComputePipelineState");
  p->width = self->simd_width;
  return p;
}
Function* new_function(Library* self, SEL, String* name, Object*, Object** error) {
  record.functions.push_back(name->text);
  if (!has_function(self, name->text)) {
    if (error) *error = make_error("fake: no function " + name->text + " in the library");
    return nullptr;
  }
  if (error) *error = nullptr;
  return make<Function>("MTLFunction");
}
Function* new_function_unspecialised(Library* self, SEL, String* name) {
  record.probes.push_back(name->text);
  return has_function(self, name->text) ? make<Function>("MTLFunction") : nullptr;
}
Object* process_info(Object*, SEL) {
  static Object* info = make<Object>("NSProcessInfo");
  return info;
}
// The trampoline leaves the stack as the caller set it, so the struct is where this
// signature expects it.
bool is_at_least(Object*, SEL, OsVersion v) { return at_least(v); }
UInteger pipeline_width(Pipeline* self, SEL) { return self->width; }
UInteger pipeline_max_threads(Pipeline*, SEL) { return 1024; }
UInteger pipeline_static_memory(Pipeline*, SEL) { return 0; }
Object* command_buffer(Object*, SEL) { return make<Object>("MTLCommandBuffer"); }
Object* compute_encoder(Object*, SEL) {
  ++record.encoders;
  return make<Object>("MTLComputeCommandEncoder");
}
void commit(Object*, SEL) {
  record.committed = true;
  ++record.commits;
}
void wait(Object*, SEL) {
  record.waited = true;
  ++record.waits;
}
UInteger status(Object*, SEL) { return 4; }  // Completed
Object* no_error(Object*, SEL) { return nullptr; }
void set_pipeline(Object*, SEL, Pipeline* p) {
  if (!p) std::abort();
  ++record.pipelines_set;
}
void set_buffer(Object*, SEL, Buffer* b, UInteger offset, UInteger index) {
  record.bindings.push_back({b, offset, index});
}
void set_buffer_offset(Object*, SEL, UInteger offset, UInteger index) {
  record.bindings.push_back({nullptr, offset, index});
}
void set_bytes(Object*, SEL, const void* p, UInteger length, UInteger) {
  if (!p || length == 0 || length > 4096) std::abort();
}
void set_tg_memory(Object*, SEL, UInteger length, UInteger index) {
  if (length % 16 != 0 || index != 0) std::abort();
}
void dispatch_threadgroups(Object*, SEL, Size groups, Size threads) {
  if (groups.width * groups.height * groups.depth == 0 || threads.width == 0) std::abort();
  ++record.dispatches;
}
void end_encoding(Object*, SEL) { record.ended = true; }
void* contents(Buffer* self, SEL) { return self->contents; }
UInteger length(Buffer* self, SEL) { return self->length; }

template <class F>
void* imp(F f) {
  return reinterpret_cast<void*>(f);
}

std::map<std::string, FakeClass>& classes() {
  static std::map<std::string, FakeClass> c = [] {
    std::map<std::string, FakeClass> m;
    auto add = [&](const std::string& name, std::map<std::string, void*> methods) {
      FakeClass& k = m[name];
      k.name = name;
      k.methods = std::move(methods);
      k.super = name == "NSObject" ? nullptr : &m["NSObject"];
    };
    add("NSObject", {{"retain", imp(retain)},
                     {"release", imp(release)},
                     {"autorelease", imp(self_)},
                     {"init", imp(self_)},
                     {"respondsToSelector:", imp(responds)},
                     {"methodSignatureForSelector:", imp(signature)}});
    add("NSAutoreleasePool", {});
    add("NSAutoreleasePool class", {{"alloc", imp(alloc_pool)}});
    add("NSString", {{"UTF8String", imp(utf8)}});
    add("NSString class", {{"stringWithCString:encoding:", imp(string_with)}});
    add("NSArray", {{"count", imp(count)}, {"objectAtIndex:", imp(object_at)}});
    add("NSError", {{"localizedDescription", imp(error_text)}});
    add("NSProcessInfo", {{"isOperatingSystemAtLeastVersion:", imp(is_at_least)}});
    add("NSProcessInfo class", {{"processInfo", imp(process_info)}});
    add("MTLDevice",
        {{"name", imp(device_name)},
         {"supportsFamily:", imp(supports_family)},
         {"newLibraryWithData:error:", imp(new_library)},
         {"newLibraryWithFile:error:", imp(new_library_file)},
         {"newCommandQueue", imp(new_queue)},
         {"maxThreadgroupMemoryLength", imp(max_tg_memory)},
         {"newBufferWithLength:options:", imp(new_buffer)},
         {"newBufferWithBytes:length:options:", imp(new_buffer_bytes)},
         {"newBufferWithBytesNoCopy:length:options:deallocator:", imp(new_buffer_nocopy)},
         {"newComputePipelineStateWithFunction:error:", imp(new_pipeline)}});
    add("MTLLibrary", {{"newFunctionWithName:constantValues:error:", imp(new_function)},
                       {"newFunctionWithName:", imp(new_function_unspecialised)}});
    add("MTLFunction", {});
    add("MTLFunctionConstantValues", {{"setConstantValue:type:atIndex:", imp(set_constant)}});
    add("MTLFunctionConstantValues class", {{"alloc", imp(alloc_constants)}});
    add("MTLComputePipelineState",
        {{"threadExecutionWidth", imp(pipeline_width)},
         {"maxTotalThreadsPerThreadgroup", imp(pipeline_max_threads)},
         {"staticThreadgroupMemoryLength", imp(pipeline_static_memory)}});
    add("MTLCommandQueue", {{"commandBuffer", imp(command_buffer)}});
    add("MTLCommandBuffer", {{"computeCommandEncoder", imp(compute_encoder)},
                             {"commit", imp(commit)},
                             {"waitUntilCompleted", imp(wait)},
                             {"status", imp(status)},
                             {"error", imp(no_error)}});
    add("MTLComputeCommandEncoder",
        {{"setComputePipelineState:", imp(set_pipeline)},
         {"setBuffer:offset:atIndex:", imp(set_buffer)},
         {"setBufferOffset:atIndex:", imp(set_buffer_offset)},
         {"setBytes:length:atIndex:", imp(set_bytes)},
         {"setThreadgroupMemoryLength:atIndex:", imp(set_tg_memory)},
         {"dispatchThreadgroups:threadsPerThreadgroup:", imp(dispatch_threadgroups)},
         {"endEncoding", imp(end_encoding)}});
    add("MTLBuffer", {{"contents", imp(contents)}, {"length", imp(length)}});
    return m;
  }();
  return c;
}

// Class objects, for objc_lookUpClass.
Object* class_object(const char* name) {
  static std::map<std::string, std::unique_ptr<Object>> objects;
  const std::string meta = std::string(name) + " class";
  if (!classes().count(meta)) return nullptr;
  auto& o = objects[name];
  if (!o) {
    o = std::make_unique<Object>();
    o->cls = &classes().at(meta);
  }
  return o.get();
}

Device* device(const char* name, bool apple7, UInteger width = 32) {
  Device* d = make<Device>("MTLDevice");
  d->name = name;
  d->apple7 = apple7;
  d->simd_width = width;
  return d;
}

}  // namespace

extern "C" {
void* objc_lookUpClass(const char* name) { return class_object(name); }
void* objc_getProtocol(const char*) { return nullptr; }
Device* MTLCreateSystemDefaultDevice() {
  if (the_default) ++the_default->refs;
  return the_default;
}
Array* MTLCopyAllDevices() {
  Array* a = make<Array>("NSArray");
  for (Device* d : all_devices) a->items.push_back(d);
  return a;
}
void* MTLCopyAllDevicesWithObserver(void*, void*) { std::abort(); }
void MTLRemoveDeviceObserver(const void*) { std::abort(); }
Data* dispatch_data_create(const void* p, size_t size, void* queue, void* destructor) {
  if (queue || destructor) std::abort();  // DISPATCH_DATA_DESTRUCTOR_DEFAULT: copied now
  Data* d = make<Data>("NSObject");
  d->bytes.assign(static_cast<const unsigned char*>(p),
                  static_cast<const unsigned char*>(p) + size);
  return d;
}
void dispatch_release(Data* d) { delete d; }
// Referenced by metal-cpp's block-based helpers, which the executor never calls.
void* _NSConcreteStackBlock[32];
void _Block_object_assign(void*, const void*, int) { std::abort(); }
void _Block_object_dispose(const void*, int) { std::abort(); }
}

namespace {

using rnncore::DeviceError;
namespace m = rnncore::metal;

std::string run_error(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const DeviceError& e) {
    return e.what();
  }
  expect(false, what + " raised no DeviceError");
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A one-dispatch plan binding caller inputs (wrapped, misaligned, small, empty), an output and
// workspace, as the plans do.
m::Plan plan_with(const std::vector<std::pair<m::Buffer, int64_t>>& sizes) {
  m::Plan plan;
  m::Dispatch d;
  d.kernel = "gemm_fff";
  d.threadgroups = {1, 1, 1};
  d.threads = {256, 1, 1};
  d.threadgroup_memory = 8192;
  uint32_t index = 0;
  for (auto [b, size] : sizes) {
    plan.sizes[static_cast<int>(b)] = size;
    plan.element_sizes[static_cast<int>(b)] = 4;
    d.buffers.push_back({index++, b, 0});
  }
  d.bytes.push_back({8, std::vector<uint8_t>(16, 0)});
  plan.writes[static_cast<int>(m::Buffer::State)] = true;
  plan.writes[static_cast<int>(m::Buffer::Projected)] = true;
  plan.dispatches.push_back(d);
  return plan;
}

int scenario_run() {
  m::Executor& ex = m::apple_executor();
  expect(record.device_used == "Apple M2 (fake)", "runs on the default device");
  expect(!record.library.empty(), "loads an embedded metallib");
  const int64_t big = 64 * 1024 * 4;
  rnncore::Tensor out = ex.allocate({big / 4}, rnncore::DType::Float32);
  // Caller memory: page-aligned storage, so the offsets below are exact.
  void* storage = std::aligned_alloc(16384, 4 * big);
  auto* base = static_cast<unsigned char*>(storage);
  const void* aligned = base + 4096 + 8;        // float32-aligned, 64 KiB+: wrapped
  const void* misaligned = base + big + 16386;  // 2 bytes off: copied
  const void* small = base + 2 * big + 40;      // under 64 KiB: copied
  const void* dummy = reinterpret_cast<const void*>(uintptr_t{1});  // zero-size input
  m::Plan plan = plan_with({{m::Buffer::Source, big},
                            {m::Buffer::InputWeight, big},
                            {m::Buffer::RecurrentWeight, 1024},
                            {m::Buffer::Mask, 0},
                            {m::Buffer::State, big},
                            {m::Buffer::Projected, 4096}});
  m::HostArrays arrays{};
  arrays[static_cast<int>(m::Buffer::Source)] = aligned;
  arrays[static_cast<int>(m::Buffer::InputWeight)] = misaligned;
  arrays[static_cast<int>(m::Buffer::RecurrentWeight)] = small;
  arrays[static_cast<int>(m::Buffer::Mask)] = dummy;
  arrays[static_cast<int>(m::Buffer::State)] = out.data();
  const size_t before = record.buffers.size();
  ex.run(plan, arrays);
  expect(record.dispatches == 1 && record.ended && record.committed && record.waited,
         "encodes, commits and waits for the dispatch");
  expect(record.bindings.size() == 6, "binds the six buffers");
  std::map<UInteger, SetBuffer> at;
  for (const SetBuffer& s : record.bindings) at[s.index] = s;
  const SetBuffer src = at[0], w = at[1], r = at[2], mask = at[3], state = at[4], ws = at[5];
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  expect(src.buffer->how == "nocopy" && addr(src.buffer->contents) + src.offset == addr(aligned) &&
             src.offset % 4 == 0,
         "an aligned 256 KiB input is wrapped in place at an element-aligned offset");
  expect(w.buffer->how == "bytes" && w.offset == 0 && w.buffer->length == uint64_t(big) &&
             std::memcmp(w.buffer->contents, misaligned, big) == 0,
         "a misaligned 256 KiB input is copied, bound at offset 0 (issue 11, item 2)");
  expect(r.buffer->how == "bytes" && r.offset == 0, "a small input is copied");
  expect(mask.offset == 0 && mask.buffer->length >= 16 && mask.buffer->how == "length",
         "a zero-size input (dummy pointer) binds the placeholder at offset 0");
  expect(state.buffer->contents == out.data() && state.offset == 0,
         "an output from allocate() is bound in place");
  expect(ws.buffer->how == "length" && ws.buffer->length == 4096, "workspace is a new buffer");
  bool zero_length = false;
  for (size_t i = 0; i < record.buffers.size(); ++i) zero_length |= record.buffers[i]->length == 0;
  expect(!zero_length, "no zero-length buffer was asked for");
  expect(record.buffers.size() - before == 4, "one buffer per wrapped/copied input + workspace");
  expect(record.functions == std::vector<std::string>{"gemm_fff"}, "one pipeline, gemm_fff");
  std::free(storage);
  return failures;
}

// A plan of 150 steps, as a forward op's: one kernel and constants, the same buffers, the
// state buffer at a moving offset.
int scenario_steps() {
  m::Executor& ex = m::apple_executor();
  const int64_t big = 64 * 1024 * 4;
  rnncore::Tensor out = ex.allocate({big / 4}, rnncore::DType::Float32);
  m::Plan plan = plan_with({{m::Buffer::RecurrentWeight, 1024}, {m::Buffer::State, big}});
  const m::Dispatch step = plan.dispatches[0];
  plan.dispatches.clear();
  for (int s = 0; s < 150; ++s) {
    m::Dispatch d = step;
    d.buffers[1].offset = 1024 * s;  // this step's state
    plan.dispatches.push_back(d);
  }
  std::vector<float> r(256, 1.0f);
  m::HostArrays arrays{};
  arrays[static_cast<int>(m::Buffer::RecurrentWeight)] = r.data();
  arrays[static_cast<int>(m::Buffer::State)] = out.data();
  ex.run(plan, arrays);
  expect(record.dispatches == 150, "encodes every step");
  expect(record.commits == 3 && record.encoders == 3,
         "three command buffers of at most 64 dispatches, each committed");
  expect(record.waits == 1, "waits once, for the last command buffer");
  expect(record.functions.size() == 1, "one pipeline");
  expect(record.pipelines_set == 3, "the pipeline is set once per encoder");
  int full = 0, moved = 0;
  for (const SetBuffer& s : record.bindings) (s.buffer ? full : moved) += 1;
  expect(full == 2 * 3, "each buffer is bound once per encoder");
  expect(moved == 150 - 3, "the moving state offset is set by setBufferOffset at the other steps");
  return failures;
}

int scenario_nil_default() {
  expect(m::apple_gpu_available(), "a GPU is found when MTLCreateSystemDefaultDevice() is nil");
  m::apple_executor();
  expect(record.device_used == "Apple M1 (fake)",
         "MTLCopyAllDevices() supplies it, Apple silicon first (issue 11, item 1)");
  return failures;
}

int scenario_no_gpu() {
  expect(!m::apple_gpu_available(), "no GPU: 'metal' is not available");
  const std::string e = run_error("no GPU", [] { m::apple_executor(); });
  expect(contains(e, "no Metal GPU was found"), "the error says no GPU was found: " + e);
  return failures;
}

int scenario_not_apple_silicon() {
  expect(!m::apple_gpu_available(), "an AMD GPU is not offered as 'metal'");
  const std::string e = run_error("AMD GPU", [] { m::apple_executor(); });
  expect(contains(e, "'AMD Radeon Pro 5500M (fake)'") && contains(e, "not an Apple silicon GPU"),
         "the error names the GPU and says why (issue 11, item 5): " + e);
  return failures;
}

int scenario_simd_width() {
  m::Executor& ex = m::apple_executor();
  m::Plan plan = plan_with({{m::Buffer::Projected, 4096}});
  const std::string e = run_error("64-wide pipeline", [&] { ex.run(plan, m::HostArrays{}); });
  expect(contains(e, "SIMD-groups of 64 threads") && contains(e, "gemm_fff"),
         "a pipeline of another SIMD-group width is refused (issue 11, item 5): " + e);
  expect(record.dispatches == 0, "nothing was dispatched");
  return failures;
}

bool loaded(const unsigned char* bytes, unsigned long long size) {
  return record.library.size() == size && std::memcmp(record.library.data(), bytes, size) == 0;
}

std::string os_name() {
  return "macOS " + std::to_string(os_version.major) + "." + std::to_string(os_version.minor) +
         "." + std::to_string(os_version.patch);
}

// The embedded library the executor picks for the OS, and whether it then offers bfloat16.
int scenario_os(bool macos14) {
  m::Executor& ex = m::apple_executor();
  const std::string os = os_name();
  if (macos14) {
    expect(record.library_language == "metal3.1" &&
               loaded(rnncore_metallib_macos14, rnncore_metallib_macos14_size),
           os + ": loads the embedded macOS 14 library (metal3.1)");
    expect(ex.computes_bfloat16(), os + ": computes bfloat16 (the library has gemm_bbb)");
  } else {
    expect(record.library_language == "metal3.0" && loaded(rnncore_metallib, rnncore_metallib_size),
           os + ": loads the embedded macOS 13 library (metal3.0)");
    expect(!ex.computes_bfloat16(), os + ": no bfloat16 (the library has no gemm_bbb)");
  }
  expect(record.probes == std::vector<std::string>{"gemm_bbb"}, "asks the library for gemm_bbb");
  ex.computes_bfloat16();
  expect(record.probes.size() == 1, "once, at construction");
  expect(live_functions == 0, "and releases the function it got");
  expect(record.functions.empty(), "no kernel was specialised");
  return failures;
}

// RNNCORE_METALLIB (set by the test to the metal3.0 library) on macOS 14: the file is loaded,
// and it, not the OS, decides bfloat16.
int scenario_metallib_env() {
  const char* path = std::getenv("RNNCORE_METALLIB");
  expect(path && *path, "RNNCORE_METALLIB names a file");
  if (!path || !*path) return failures;
  m::Executor& ex = m::apple_executor();
  expect(record.library_from == path, "loads the file RNNCORE_METALLIB names");
  expect(record.library_language == "metal3.0" && !ex.computes_bfloat16(),
         "a metal3.0 file on " + os_name() + " computes no bfloat16 (the library answers)");
  return failures;
}

// Metal refuses the library: the error names the embedded library that failed, and a later
// call tries again.
int scenario_load_error() {
  library_refusal = "fake: refused by the GPU";
  for (const OsVersion& v : {OsVersion{13, 6, 0}, OsVersion{14, 2, 1}}) {
    os_version = v;
    const std::string which = v.major >= 14 ? "macOS 14 library" : "macOS 13 library";
    const std::string e = run_error(os_name(), [] { m::apple_executor(); });
    expect(contains(e, "could not load the Metal library") && contains(e, which) &&
               contains(e, library_refusal),
           os_name() + ": the error names the " + which + " and Metal's reason: " + e);
  }
  library_refusal.clear();
  expect(m::apple_executor().computes_bfloat16() && record.library_language == "metal3.1",
         "once Metal accepts it, the next call loads the macOS 14 library");
  return failures;
}

}  // namespace

int run_scenario(const std::string& scenario) {
  if (scenario == "run") {
    the_default = device("Apple M2 (fake)", true);
    return scenario_run();
  }
  if (scenario == "steps") {
    the_default = device("Apple M2 (fake)", true);
    return scenario_steps();
  }
  if (scenario == "nil-default") {
    all_devices = {device("AMD Radeon Pro 5500M (fake)", false), device("Apple M1 (fake)", true)};
    return scenario_nil_default();
  }
  if (scenario == "no-gpu") return scenario_no_gpu();
  if (scenario == "not-apple-silicon") {
    the_default = device("AMD Radeon Pro 5500M (fake)", false, 64);
    all_devices = {the_default};
    return scenario_not_apple_silicon();
  }
  if (scenario == "simd-width") {
    the_default = device("Apple M9 (fake, 64-wide)", true, 64);
    return scenario_simd_width();
  }
  if (scenario == "macos13" || scenario == "macos14" || scenario == "macos15") {
    the_default = device("Apple M2 (fake)", true);
    os_version = scenario == "macos13"   ? OsVersion{13, 7, 1}
                 : scenario == "macos14" ? OsVersion{14, 0, 0}
                                         : OsVersion{15, 3, 2};
    return scenario_os(scenario != "macos13");
  }
  if (scenario == "metallib-env") {
    the_default = device("Apple M2 (fake)", true);
    return scenario_metallib_env();
  }
  if (scenario == "load-error") {
    the_default = device("Apple M2 (fake)", true);
    return scenario_load_error();
  }
  std::fprintf(stderr,
               "usage: fake_metal run|steps|nil-default|no-gpu|not-apple-silicon|simd-width|"
               "macos13|macos14|macos15|metallib-env|load-error\n");
  return 2;
}

int main(int argc, char** argv) {
  try {
    return run_scenario(argc > 1 ? argv[1] : "");
  } catch (const std::exception& e) {
    std::printf("FAIL unexpected exception: %s\n", e.what());
    return 1;
  }
}
