// The metal-cpp executor: runs plans on the system's Apple GPU. This is the one translation
// unit that defines metal-cpp's private implementation (its class and selector tables).
// cmake/metal.cmake makes every metal-cpp symbol of this object local to it
// (cmake/private_symbols.cmake), so a C++ application that defines the same tables for its
// own metal-cpp links with rnncore without a clash; hidden visibility keeps them out of
// _core.so's exports as well.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#define METALCPP_SYMBOL_VISIBILITY_HIDDEN
#include <dispatch/dispatch.h>
#include <unistd.h>

#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "metal/apple_rules.hpp"
#include "metal/executor.hpp"
#include "rnncore/error.hpp"

// The kernels, embedded by cmake/metal.cmake: compiled with -std=metal3.0 (loads on macOS
// 13), and with -std=metal3.1 (macOS 14 and later; adds the bfloat16-storage kernels).
extern "C" const unsigned char rnncore_metallib[];
extern "C" const unsigned long long rnncore_metallib_size;
extern "C" const unsigned char rnncore_metallib_macos14[];
extern "C" const unsigned long long rnncore_metallib_macos14_size;

namespace rnncore::metal {

namespace {

// metal-cpp hands out autoreleased objects (strings, errors, command buffers); a pool per
// entry point frees them even when we leave by an exception.
class ScopedPool {
 public:
  ScopedPool() : pool_(NS::AutoreleasePool::alloc()->init()) {}
  ~ScopedPool() { pool_->release(); }
  ScopedPool(const ScopedPool&) = delete;
  ScopedPool& operator=(const ScopedPool&) = delete;

 private:
  NS::AutoreleasePool* pool_;
};

std::string describe(const NS::Error* error) {
  const NS::String* text = error ? error->localizedDescription() : nullptr;
  const char* utf8 = text ? text->utf8String() : nullptr;
  return utf8 ? utf8 : "unknown error";
}

NS::String* ns_string(const std::string& s) {
  return NS::String::string(s.c_str(), NS::UTF8StringEncoding);
}

constexpr const char* kNoGpu =
    "[device] 'metal' is not available: no Metal GPU was found on this machine";

std::string gpu_name(const MTL::Device* device) {
  const NS::String* name = device->name();
  const char* utf8 = name ? name->utf8String() : nullptr;
  return utf8 ? utf8 : "unnamed GPU";
}

// The GPU to run on (retained), or null. MTLCreateSystemDefaultDevice() can return nil in a
// command-line process (python) although a GPU is present; then the first GPU of
// MTLCopyAllDevices() that rnncore's kernels accept, else the first GPU.
MTL::Device* copy_device() {
  if (MTL::Device* device = MTL::CreateSystemDefaultDevice()) return device;
  NS::Array* all = MTL::CopyAllDevices();
  if (!all) return nullptr;
  MTL::Device* chosen = nullptr;
  for (NS::UInteger i = 0; i < all->count(); ++i) {
    MTL::Device* device = all->object<MTL::Device>(i);
    if (!chosen || (device->supportsFamily(MTL::GPUFamilyApple7) &&
                    !chosen->supportsFamily(MTL::GPUFamilyApple7)))
      chosen = device;
  }
  if (chosen) chosen->retain();
  all->release();
  return chosen;
}

// Whether this machine has a GPU the kernels run on, and if not, why: what devices() and
// apple_executor() report.
struct Probe {
  bool usable = false;
  std::string refusal;
};

const Probe& probe() {
  static const Probe result = [] {
    ScopedPool pool;
    Probe p;
    MTL::Device* device = copy_device();
    if (!device) {
      p.refusal = kNoGpu;
      return p;
    }
    p.refusal = apple::gpu_refusal(gpu_name(device), device->supportsFamily(MTL::GPUFamilyApple7));
    p.usable = p.refusal.empty();
    device->release();
    return p;
  }();
  return result;
}

// The embedded metallib this OS runs (a metal3.1 library does not load before macOS 14), or
// the file named by RNNCORE_METALLIB (for kernel development).
NS::SharedPtr<MTL::Library> load_library(MTL::Device* device) {
  NS::Error* error = nullptr;
  MTL::Library* library = nullptr;
  std::string source;
  if (const char* path = std::getenv("RNNCORE_METALLIB"); path && *path) {
    source = path;
    library = device->newLibrary(ns_string(source), &error);
  } else {
    const bool macos14 =
        NS::ProcessInfo::processInfo()->isOperatingSystemAtLeastVersion({14, 0, 0});
    const unsigned char* bytes = macos14 ? rnncore_metallib_macos14 : rnncore_metallib;
    const auto size =
        static_cast<size_t>(macos14 ? rnncore_metallib_macos14_size : rnncore_metallib_size);
    source = macos14 ? "embedded macOS 14 library, MSL 3.1" : "embedded macOS 13 library, MSL 3.0";
    // DESTRUCTOR_DEFAULT copies the bytes, so no block is needed to keep them alive.
    dispatch_data_t data =
        dispatch_data_create(bytes, size, nullptr, DISPATCH_DATA_DESTRUCTOR_DEFAULT);
    library = device->newLibrary(data, &error);
    dispatch_release(data);
  }
  if (!library)
    throw DeviceError("[metal] could not load the Metal library (" + source +
                      "): " + describe(error));
  return NS::TransferPtr(library);
}

// Whether the library has the bfloat16 kernels: asked of the library, not the OS, so a
// RNNCORE_METALLIB file answers for itself. (A kernel with function constants still comes
// back, unspecialised.)
bool has_bfloat16_kernels(MTL::Library* library) {
  MTL::Function* function = library->newFunction(ns_string("gemm_bbb"));
  if (!function) return false;
  function->release();
  return true;
}

// A buffer bound for one call, and the byte offset of the array inside it.
struct Bound {
  NS::SharedPtr<MTL::Buffer> buffer;
  uint64_t offset = 0;
};

class AppleExecutor final : public Executor {
 public:
  AppleExecutor() : page_size_(static_cast<uint64_t>(sysconf(_SC_PAGESIZE))) {
    ScopedPool pool;
    device_ = NS::TransferPtr(copy_device());
    if (!device_) throw DeviceError(kNoGpu);
    gpu_ = gpu_name(device_.get());
    const std::string refusal =
        apple::gpu_refusal(gpu_, device_->supportsFamily(MTL::GPUFamilyApple7));
    if (!refusal.empty()) throw DeviceError(refusal);
    library_ = load_library(device_.get());
    bfloat16_ = has_bfloat16_kernels(library_.get());
    queue_ = NS::TransferPtr(device_->newCommandQueue());
    if (!queue_) throw DeviceError("[metal] could not create a Metal command queue");
    placeholder_ = NS::TransferPtr(device_->newBuffer(16, MTL::ResourceStorageModePrivate));
    if (!placeholder_) throw DeviceError("[metal] could not allocate GPU memory");
    max_threadgroup_memory_ = device_->maxThreadgroupMemoryLength();
  }

  const char* name() const override { return "metal"; }

  bool computes_bfloat16() const override { return bfloat16_; }

  Tensor allocate(const Shape& shape, DType dtype) override {
    const auto bytes = static_cast<uint64_t>(shape_numel(shape) * dtype_size(dtype));
    // Never empty: Metal rejects zero-length buffers and contents() keys the registry.
    const uint64_t length = std::max<uint64_t>(bytes, 4);
    MTL::Buffer* buffer = device_->newBuffer(length, MTL::ResourceStorageModeShared);
    if (!buffer)
      throw DeviceError("[metal] could not allocate " + std::to_string(bytes) +
                        " bytes of GPU memory");
    void* contents = buffer->contents();
    // The deleter runs on whatever thread drops the last reference (numpy included); the
    // executor is never destroyed, so `this` stays valid.
    std::shared_ptr<void> storage(contents, [this, buffer](void* p) {
      forget(p);  // before release: the address may be handed out again at once
      buffer->release();
    });
    {
      std::lock_guard<std::mutex> lock(allocations_mutex_);
      allocations_[reinterpret_cast<uintptr_t>(contents)] = {buffer, length};
    }
    return Tensor::adopt(std::move(storage), shape, dtype);
  }

  void run(const Plan& plan, const HostArrays& arrays) override {
    if (plan.dispatches.empty()) return;
    check_limits(plan);
    ScopedPool pool;

    // Everything that can throw happens before encoding: an encoder abandoned without
    // endEncoding is a Metal error of its own.
    std::array<Bound, kBufferCount> bound;
    for (int i = 0; i < kBufferCount; ++i) {
      const int64_t size = plan.sizes[i];
      if (size > 0)
        bound[i] = bind(static_cast<Buffer>(i), static_cast<uint64_t>(size), element_size(plan, i),
                        arrays[i], plan.writes[i]);
    }
    // A plan's steps repeat one kernel with the same constants: its pipeline is looked up
    // (key built, cache locked) once per run of equal dispatches, not once per step.
    std::vector<MTL::ComputePipelineState*> pipelines;
    pipelines.reserve(plan.dispatches.size());
    for (size_t k = 0; k < plan.dispatches.size(); ++k) {
      const Dispatch& d = plan.dispatches[k];
      const bool same = k > 0 && d.kernel == plan.dispatches[k - 1].kernel &&
                        same_constants(d, plan.dispatches[k - 1]);
      MTL::ComputePipelineState* pipeline = same ? pipelines.back() : pipeline_for(d);
      if (!same) check_dispatch(d, pipeline);
      check_offsets(plan, d, bound);
      pipelines.push_back(pipeline);
    }

    // Command buffers of kDispatchesPerCommandBuffer dispatches, each committed as soon as
    // it is encoded: the GPU starts on the first while the CPU encodes the rest, and no one
    // command buffer runs long enough for the GPU watchdog. One queue runs them in order.
    std::vector<MTL::CommandBuffer*> committed;
    MTL::CommandBuffer* commands = nullptr;
    MTL::ComputeCommandEncoder* encoder = nullptr;
    Encoded state;
    for (size_t k = 0; k < plan.dispatches.size(); ++k) {
      if (!encoder) {
        commands = queue_->commandBuffer();  // autoreleased
        if (!commands) throw DeviceError("[metal] could not create a Metal command buffer");
        // The default (serial) encoder orders the dispatches: each step reads the last one's
        // output.
        encoder = commands->computeCommandEncoder();
        if (!encoder) throw DeviceError("[metal] could not create a Metal compute encoder");
        state = Encoded();
      }
      encode(encoder, plan.dispatches[k], pipelines[k], bound, state);
      if ((k + 1) % kDispatchesPerCommandBuffer == 0 || k + 1 == plan.dispatches.size()) {
        encoder->endEncoding();
        commands->commit();
        committed.push_back(commands);
        encoder = nullptr;
      }
    }
    committed.back()->waitUntilCompleted();  // the last one ends after all the others
    for (MTL::CommandBuffer* c : committed)
      if (c->status() == MTL::CommandBufferStatusError)
        throw DeviceError("[metal] the GPU failed to run '" + plan.dispatches.front().kernel +
                          "': " + describe(c->error()));
    // `bound` releases the call's workspace, wrapped and copied buffers on the way out.
  }

 private:
  // Dispatches per command buffer (MLX commits every few dozen operations).
  static constexpr size_t kDispatchesPerCommandBuffer = 64;

  // What the open encoder has set, so that a step re-sets only what changed: a buffer
  // already bound at an index moves by setBufferOffset, the pipeline and the threadgroup
  // memory length are set when they differ.
  struct Encoded {
    std::array<std::pair<const MTL::Buffer*, uint64_t>, 32> at{};
    MTL::ComputePipelineState* pipeline = nullptr;
    uint64_t threadgroup_memory = 0;
  };

  static bool same_constants(const Dispatch& a, const Dispatch& b) {
    if (a.constants.size() != b.constants.size()) return false;
    for (size_t k = 0; k < a.constants.size(); ++k)
      if (a.constants[k].index != b.constants[k].index ||
          a.constants[k].type != b.constants[k].type ||
          a.constants[k].value != b.constants[k].value)
        return false;
    return true;
  }

  void encode(MTL::ComputeCommandEncoder* encoder, const Dispatch& d,
              MTL::ComputePipelineState* pipeline, const std::array<Bound, kBufferCount>& bound,
              Encoded& state) {
    if (pipeline != state.pipeline) encoder->setComputePipelineState(pipeline);
    state.pipeline = pipeline;
    for (const Binding& b : d.buffers) {
      // An empty array (size 0) is bound but never read: the placeholder stands in at offset
      // 0 (an offset into an empty array may exceed the placeholder's length), whatever
      // (non-null dummy) pointer the caller gave for it.
      const Bound& x = bound[static_cast<int>(b.buffer)];
      const MTL::Buffer* buffer = x.buffer ? x.buffer.get() : placeholder_.get();
      const uint64_t offset = x.buffer ? x.offset + static_cast<uint64_t>(b.offset) : 0;
      if (b.index >= state.at.size()) {
        encoder->setBuffer(buffer, offset, b.index);
        continue;
      }
      auto& was = state.at[b.index];
      if (was.first == buffer && was.second == offset) continue;
      if (was.first == buffer)
        encoder->setBufferOffset(offset, b.index);
      else
        encoder->setBuffer(buffer, offset, b.index);
      was = {buffer, offset};
    }
    for (const BytesArg& a : d.bytes) encoder->setBytes(a.data.data(), a.data.size(), a.index);
    const uint64_t tg = d.threadgroup_memory > 0 ? threadgroup_length(d.threadgroup_memory) : 0;
    if (tg > 0 && tg != state.threadgroup_memory) encoder->setThreadgroupMemoryLength(tg, 0);
    state.threadgroup_memory = tg > 0 ? tg : state.threadgroup_memory;
    // Planned threads are one-dimensional; an adapting kernel may get fewer (check_dispatch).
    const uint64_t threads = apple::threads_for_pipeline(
        d.threads.x, pipeline->maxTotalThreadsPerThreadgroup(), d.adapts_threads);
    encoder->dispatchThreadgroups(MTL::Size(d.threadgroups.x, d.threadgroups.y, d.threadgroups.z),
                                  MTL::Size(threads, d.threads.y, d.threads.z));
  }

  struct Allocation {
    MTL::Buffer* buffer;
    uint64_t length;
  };

  // setThreadgroupMemoryLength takes multiples of 16 bytes.
  static uint64_t threadgroup_length(uint32_t bytes) { return (uint64_t{bytes} + 15) / 16 * 16; }

  static uint64_t element_size(const Plan& plan, int buffer) {
    const int64_t size =
        plan.element_sizes[buffer] > 0 ? plan.element_sizes[buffer] : plan.element_size;
    return static_cast<uint64_t>(size);
  }

  void forget(void* contents) {
    std::lock_guard<std::mutex> lock(allocations_mutex_);
    allocations_.erase(reinterpret_cast<uintptr_t>(contents));
  }

  // The allocate() buffer holding [p, p + size), retained for the call; null for other memory.
  NS::SharedPtr<MTL::Buffer> find_allocation(const void* p, uint64_t size, uint64_t* offset) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(allocations_mutex_);
    auto it = allocations_.upper_bound(a);
    if (it == allocations_.begin()) return {};
    --it;
    if (a + size > it->first + it->second.length) return {};
    *offset = a - it->first;
    return NS::RetainPtr(it->second.buffer);
  }

  // Caller memory (numpy): large arrays aligned to their element size are wrapped over their
  // page-rounded span without a copy; the rest (small, misaligned, or refused by Metal) are
  // copied into a new shared buffer (apple::bind_host_memory decides).
  NS::SharedPtr<MTL::Buffer> wrap_input(const void* p, uint64_t size, uint64_t element,
                                        uint64_t* offset) {
    const apple::HostBinding how = apple::bind_host_memory(p, size, element, page_size_);
    if (how.kind == apple::HostBinding::Kind::Wrap) {
      MTL::Buffer* wrapped =
          device_->newBuffer(reinterpret_cast<const void*>(how.begin), how.length,
                             MTL::ResourceStorageModeShared, nullptr);
      if (wrapped) {
        *offset = how.offset;
        return NS::TransferPtr(wrapped);
      }
    }
    *offset = 0;
    return NS::TransferPtr(device_->newBuffer(p, size, MTL::ResourceStorageModeShared));
  }

  // size > 0: an empty array is never bound (the placeholder stands in), so neither a
  // zero-length buffer nor a copy from its dummy pointer is ever asked of Metal.
  Bound bind(Buffer b, uint64_t size, uint64_t element, const void* host, bool written) {
    Bound r;
    if (size == 0) return r;
    if (is_workspace(b)) {
      // Only the GPU touches workspace.
      r.buffer = NS::TransferPtr(device_->newBuffer(size, MTL::ResourceStorageModePrivate));
    } else if (!host) {
      throw DeviceError(std::string("[metal] the plan uses ") + buffer_name(b) +
                        " but no array was given for it");
    } else {
      r.buffer = find_allocation(host, size, &r.offset);
      if (!r.buffer) {
        // Outputs are written in place, which only allocate()'s shared buffers allow.
        if (written)
          throw DeviceError(std::string("[metal] output ") + buffer_name(b) +
                            " is not memory from Executor::allocate");
        r.buffer = wrap_input(host, size, element, &r.offset);
      }
    }
    if (!r.buffer)
      throw DeviceError("[metal] could not allocate " + std::to_string(size) + " bytes for " +
                        buffer_name(b));
    return r;
  }

  MTL::ComputePipelineState* pipeline_for(const Dispatch& d) {
    const std::string key = d.pipeline_key();
    // Held while compiling: a pipeline is built once even when threads race for it.
    std::lock_guard<std::mutex> lock(pipelines_mutex_);
    if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;

    // Values stay alive until newFunction, whether or not Metal copies them when set.
    struct Value {
      bool b;
      int32_t i;
    };
    std::vector<Value> values(d.constants.size());
    auto constants = NS::TransferPtr(MTL::FunctionConstantValues::alloc()->init());
    for (size_t k = 0; k < d.constants.size(); ++k) {
      const FunctionConstant& c = d.constants[k];
      if (c.type == FunctionConstant::Type::Bool) {
        values[k].b = c.value != 0;  // a Metal bool constant reads one byte
        constants->setConstantValue(&values[k].b, MTL::DataTypeBool, c.index);
      } else {
        values[k].i = c.value;
        constants->setConstantValue(&values[k].i, MTL::DataTypeInt, c.index);
      }
    }
    NS::Error* error = nullptr;
    auto function =
        NS::TransferPtr(library_->newFunction(ns_string(d.kernel), constants.get(), &error));
    if (!function)
      throw DeviceError("[metal] kernel '" + d.kernel +
                        "' could not be specialised: " + describe(error));
    MTL::ComputePipelineState* pipeline = device_->newComputePipelineState(function.get(), &error);
    if (!pipeline)
      throw DeviceError("[metal] could not build the pipeline for kernel '" + d.kernel +
                        "': " + describe(error));
    const std::string refusal =
        apple::simd_width_refusal(d.kernel, gpu_, pipeline->threadExecutionWidth());
    if (!refusal.empty()) {
      pipeline->release();
      throw DeviceError(refusal);
    }
    pipelines_.emplace(key, pipeline);  // owned by the cache for the life of the process
    return pipeline;
  }

  // The plan checks Limits; this checks the GPU actually present and the compiled kernel.
  void check_dispatch(const Dispatch& d, MTL::ComputePipelineState* pipeline) const {
    const uint64_t max_threads = pipeline->maxTotalThreadsPerThreadgroup();
    if (apple::threads_for_pipeline(d.threads.volume(), max_threads, d.adapts_threads) == 0)
      throw DeviceError(
          "[metal] kernel '" + d.kernel + "' needs " + std::to_string(d.threads.volume()) +
          " threads per threadgroup but this GPU allows " + std::to_string(max_threads));
    const uint64_t memory =
        threadgroup_length(d.threadgroup_memory) + pipeline->staticThreadgroupMemoryLength();
    if (memory > max_threadgroup_memory_)
      throw DeviceError("[metal] kernel '" + d.kernel + "' needs " + std::to_string(memory) +
                        " bytes of threadgroup memory but this GPU has " +
                        std::to_string(max_threadgroup_memory_));
  }

  // Metal binds a buffer at an offset aligned to the element type the kernel reads; wrapped
  // arrays and allocate() buffers start aligned and the plan's offsets are whole elements, so
  // this only fails if one of those promises is broken (before anything is encoded).
  static void check_offsets(const Plan& plan, const Dispatch& d,
                            const std::array<Bound, kBufferCount>& bound) {
    for (const Binding& b : d.buffers) {
      const int i = static_cast<int>(b.buffer);
      if (!bound[i].buffer) continue;
      const uint64_t offset = bound[i].offset + static_cast<uint64_t>(b.offset);
      if (offset % element_size(plan, i) != 0)
        throw DeviceError("[metal] kernel '" + d.kernel + "' would bind " + buffer_name(b.buffer) +
                          " at byte offset " + std::to_string(offset) +
                          ", which is not a multiple of its element size " +
                          std::to_string(element_size(plan, i)));
    }
  }

  NS::SharedPtr<MTL::Device> device_;
  std::string gpu_;
  NS::SharedPtr<MTL::Library> library_;
  bool bfloat16_ = false;  // the library has the bfloat16 kernels
  NS::SharedPtr<MTL::CommandQueue> queue_;
  NS::SharedPtr<MTL::Buffer> placeholder_;
  uint64_t page_size_;  // 16 KiB on Apple silicon
  uint64_t max_threadgroup_memory_ = 0;

  std::mutex pipelines_mutex_;
  std::unordered_map<std::string, MTL::ComputePipelineState*> pipelines_;

  // Start of contents() -> buffer, for every live allocate() result: lets run() bind an
  // output (or a previous output fed back as input) without a copy.
  std::mutex allocations_mutex_;
  std::map<uintptr_t, Allocation> allocations_;
};

}  // namespace

bool apple_gpu_available() { return probe().usable; }

Executor& apple_executor() {
  if (!probe().usable) throw DeviceError(probe().refusal);
  // Never destroyed: Tensors from allocate() may be released after static destructors run
  // (at interpreter exit) and their deleters use the executor. A throwing constructor
  // leaves the static uninitialised, so the next call tries again.
  static AppleExecutor* const executor = new AppleExecutor();
  return *executor;
}

}  // namespace rnncore::metal
