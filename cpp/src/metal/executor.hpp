// "Run this plan": the one seam between the Metal backend's portable part (plans) and a
// device. Two implementations: metal-cpp on Apple GPUs (apple_executor.cpp) and the host
// emulator (emulator/executor.cpp) that runs the same .metal sources compiled as C++.
#pragma once

#include <array>

#include "metal/plan.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore::metal {

// Where each buffer of a plan lives in host-visible memory: the caller's inputs as given,
// outputs as returned by Executor::allocate. Null for buffers the plan does not use and
// for workspace (the executor provides that).
using HostArrays = std::array<const void*, kBufferCount>;

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;  // "metal", "metal-emulated"
  // Whether its kernels include bfloat16 storage (MSL 3.1's bfloat: macOS 14 and later).
  virtual bool computes_bfloat16() const = 0;
  // Output memory the device writes and the caller reads in place (on Apple: a
  // shared-storage MTLBuffer kept alive by the returned Tensor).
  virtual Tensor allocate(const Shape& shape, DType dtype) = 0;
  // Runs every dispatch of the plan in order and returns when the results are in the
  // output arrays. Thread-safe; throws rnncore::DeviceError when the device fails.
  virtual void run(const Plan& plan, const HostArrays& arrays) = 0;
};

// The metal-cpp executor (Apple builds only). Throws DeviceError when there is no GPU.
Executor& apple_executor();
bool apple_gpu_available();
// The host emulator (builds with RNNCORE_METAL_EMULATOR).
Executor& emulator_executor();

}  // namespace rnncore::metal
