// The metal-cpp executor: runs plans on the system's Apple GPU. This is the one translation
// unit that defines metal-cpp's private implementation (its class and selector tables).
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
// Keeps metal-cpp's tables out of the symbols exported by _core.so and consumers' binaries.
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

#include "metal/executor.hpp"
#include "rnncore/error.hpp"

// rnncore.metallib, embedded by cmake/metal.cmake.
extern "C" const unsigned char rnncore_metallib[];
extern "C" const unsigned long long rnncore_metallib_size;

namespace rnncore::metal {

namespace {

// Caller arrays at least this large are wrapped in place instead of copied.
constexpr uint64_t kWrapMinBytes = 64 * 1024;

DeviceError no_gpu() {
  return DeviceError("[device] 'metal' is not available: no Metal GPU was found on this machine");
}

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

// The embedded metallib, or the file named by RNNCORE_METALLIB (for kernel development).
NS::SharedPtr<MTL::Library> load_library(MTL::Device* device) {
  NS::Error* error = nullptr;
  MTL::Library* library = nullptr;
  std::string source = "embedded rnncore.metallib";
  if (const char* path = std::getenv("RNNCORE_METALLIB"); path && *path) {
    source = path;
    library = device->newLibrary(ns_string(source), &error);
  } else {
    // DESTRUCTOR_DEFAULT copies the bytes, so no block is needed to keep them alive.
    dispatch_data_t data =
        dispatch_data_create(rnncore_metallib, static_cast<size_t>(rnncore_metallib_size), nullptr,
                             DISPATCH_DATA_DESTRUCTOR_DEFAULT);
    library = device->newLibrary(data, &error);
    dispatch_release(data);
  }
  if (!library)
    throw DeviceError("[metal] could not load the Metal library (" + source +
                      "): " + describe(error));
  return NS::TransferPtr(library);
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
    device_ = NS::TransferPtr(MTL::CreateSystemDefaultDevice());
    if (!device_) throw no_gpu();
    library_ = load_library(device_.get());
    queue_ = NS::TransferPtr(device_->newCommandQueue());
    if (!queue_) throw DeviceError("[metal] could not create a Metal command queue");
    placeholder_ = NS::TransferPtr(device_->newBuffer(16, MTL::ResourceStorageModePrivate));
    if (!placeholder_) throw DeviceError("[metal] could not allocate GPU memory");
    max_threadgroup_memory_ = device_->maxThreadgroupMemoryLength();
  }

  const char* name() const override { return "metal"; }

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
        bound[i] =
            bind(static_cast<Buffer>(i), static_cast<uint64_t>(size), arrays[i], plan.writes[i]);
    }
    std::vector<MTL::ComputePipelineState*> pipelines;
    pipelines.reserve(plan.dispatches.size());
    for (const Dispatch& d : plan.dispatches) {
      MTL::ComputePipelineState* pipeline = pipeline_for(d);
      check_dispatch(d, pipeline);
      pipelines.push_back(pipeline);
    }

    MTL::CommandBuffer* commands = queue_->commandBuffer();  // autoreleased
    if (!commands) throw DeviceError("[metal] could not create a Metal command buffer");
    // The default (serial) encoder orders the dispatches: each step reads the last one's
    // output.
    MTL::ComputeCommandEncoder* encoder = commands->computeCommandEncoder();
    if (!encoder) throw DeviceError("[metal] could not create a Metal compute encoder");
    for (size_t k = 0; k < plan.dispatches.size(); ++k) {
      const Dispatch& d = plan.dispatches[k];
      encoder->setComputePipelineState(pipelines[k]);
      for (const Binding& b : d.buffers) {
        // An empty array (size 0) is bound but never read: the placeholder stands in.
        const Bound& x = bound[static_cast<int>(b.buffer)];
        MTL::Buffer* buffer = x.buffer ? x.buffer.get() : placeholder_.get();
        encoder->setBuffer(buffer, x.offset + static_cast<uint64_t>(b.offset), b.index);
      }
      for (const BytesArg& a : d.bytes) encoder->setBytes(a.data.data(), a.data.size(), a.index);
      if (d.threadgroup_memory > 0)
        encoder->setThreadgroupMemoryLength(threadgroup_length(d.threadgroup_memory), 0);
      encoder->dispatchThreadgroups(MTL::Size(d.threadgroups.x, d.threadgroups.y, d.threadgroups.z),
                                    MTL::Size(d.threads.x, d.threads.y, d.threads.z));
    }
    encoder->endEncoding();
    commands->commit();
    commands->waitUntilCompleted();
    if (commands->status() == MTL::CommandBufferStatusError)
      throw DeviceError("[metal] the GPU failed to run '" + plan.dispatches.front().kernel +
                        "': " + describe(commands->error()));
    // `bound` releases the call's workspace, wrapped and copied buffers on the way out.
  }

 private:
  struct Allocation {
    MTL::Buffer* buffer;
    uint64_t length;
  };

  // setThreadgroupMemoryLength takes multiples of 16 bytes.
  static uint64_t threadgroup_length(uint32_t bytes) { return (uint64_t{bytes} + 15) / 16 * 16; }

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

  // Caller memory (numpy): large arrays are wrapped over their page-rounded span without a
  // copy; small ones, or ones Metal will not wrap, are copied into a new shared buffer.
  NS::SharedPtr<MTL::Buffer> wrap_input(const void* p, uint64_t size, uint64_t* offset) {
    if (size >= kWrapMinBytes) {
      const auto a = reinterpret_cast<uintptr_t>(p);
      const uintptr_t begin = a / page_size_ * page_size_;
      const uintptr_t end = (a + size + page_size_ - 1) / page_size_ * page_size_;
      MTL::Buffer* wrapped = device_->newBuffer(reinterpret_cast<const void*>(begin), end - begin,
                                                MTL::ResourceStorageModeShared, nullptr);
      if (wrapped) {
        *offset = a - begin;
        return NS::TransferPtr(wrapped);
      }
    }
    *offset = 0;
    return NS::TransferPtr(device_->newBuffer(p, size, MTL::ResourceStorageModeShared));
  }

  Bound bind(Buffer b, uint64_t size, const void* host, bool written) {
    Bound r;
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
        r.buffer = wrap_input(host, size, &r.offset);
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
    pipelines_.emplace(key, pipeline);  // owned by the cache for the life of the process
    return pipeline;
  }

  // The plan checks Limits; this checks the GPU actually present and the compiled kernel.
  void check_dispatch(const Dispatch& d, MTL::ComputePipelineState* pipeline) const {
    const uint64_t max_threads = pipeline->maxTotalThreadsPerThreadgroup();
    if (d.threads.volume() > max_threads)
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

  NS::SharedPtr<MTL::Device> device_;
  NS::SharedPtr<MTL::Library> library_;
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

bool apple_gpu_available() {
  static const bool available = [] {
    ScopedPool pool;
    MTL::Device* device = MTL::CreateSystemDefaultDevice();
    const bool found = device != nullptr;
    if (found) device->release();
    return found;
  }();
  return available;
}

Executor& apple_executor() {
  if (!apple_gpu_available()) throw no_gpu();
  // Never destroyed: Tensors from allocate() may be released after static destructors run
  // (at interpreter exit) and their deleters use the executor. A throwing constructor
  // leaves the static uninitialised, so the next call tries again.
  static AppleExecutor* const executor = new AppleExecutor();
  return *executor;
}

}  // namespace rnncore::metal
