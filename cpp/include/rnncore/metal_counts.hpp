// What the Metal kernels do, counted by the host emulator (device 'metal-emulated'): per
// dispatch of the plans an op runs, the bytes its kernel code reads and writes in device
// memory (every load and store of the instrumented copy of the kernels) and its
// floating-point operations (2 per fma, the products' multiply-adds). The cost model
// (python -m rnncore cost) turns them into expected times on Apple GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rnncore {

struct DispatchCount {
  uint64_t plan = 0;  // which plan (one op call) it belongs to, counted from 0
  std::string kernel;
  uint64_t threadgroups = 0, threads_per_threadgroup = 0;
  uint64_t bytes_read = 0, bytes_written = 0, flops = 0;
  // Threadgroup barriers one threadgroup passes (the most of the threadgroups counted): the
  // chain of dependent phases a dispatch cannot run faster than (a persistent kernel's steps).
  uint64_t barriers = 0;
  // A step repeated with the same kernel, grid and constants after two measured ones: its
  // counts are the last measured one's, and it was not run (the results of a counted call
  // are not meant to be read).
  bool repeated = false;
};

// Starts or stops counting the ops then run on device 'metal-emulated' (process-wide). A
// build without the emulator raises DeviceError.
void set_metal_counting(bool on);
// The counts recorded since counting started, in dispatch order, and clears them.
std::vector<DispatchCount> take_metal_counts();

}  // namespace rnncore
