// The small interface every backend implements; the wrapper (ops.cpp) drives it.
// Pointers are untyped because the element type is problem.dtype.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore::detail {

// One direction of the core recurrence (the contract's CORE). Every pointer is already
// offset to this direction's columns; `*_ld` are row strides in elements, and time step
// t starts at row t*N. Step s reads x' at time (flip_in ? T-1-s : s) and writes its
// outputs at time (flip_out ? T-1-s : s).
struct DirectionForward {
  const void* xp = nullptr;  // x' = projected input + bias, [T, N, G*H] of stride xp_ld
  int64_t xp_ld = 0;
  const void* R = nullptr;  // [G*H, H]
  const void* h0 = nullptr;  // [N, H] or null (zeros)
  int64_t h0_ld = 0;
  const void* c0 = nullptr;  // LSTM [N, H] or null (zeros)
  int64_t c0_ld = 0;
  const void* mask = nullptr;  // [N, H] or null (ones)
  int64_t mask_ld = 0;
  const void* peephole = nullptr;  // LSTM [4H] or null
  const void* b2 = nullptr;        // GRU secondary bias [H] or null
  void* y = nullptr;               // [T, N, H]
  int64_t y_ld = 0;
  void* c = nullptr;  // LSTM cell output [T, N, H] or null
  int64_t c_ld = 0;
  void* z = nullptr;  // training state [T, N, ZG*H] or null
  int64_t z_ld = 0;
  bool flip_in = false;
  bool flip_out = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Memory the backend can compute on and the caller can read.
  virtual Tensor allocate(const Shape& shape, DType dtype) = 0;
  // xp[T*N, D*G*H] = source[T*N, K] * W^T (+ bias); W is null when absent (then K equals
  // D*G*H and source is copied), bias is null when absent.
  virtual void project(const Problem& p, const void* source, int64_t K, const void* W,
                       const void* bias, void* xp) = 0;
  // Runs every direction of the core recurrence (independent of each other).
  virtual void forward(const Problem& p, const DirectionForward* dirs) = 0;
};

Backend& cpu_backend();
// Throws DeviceError when Metal is not built or not usable here.
Backend& metal_backend();
bool metal_available();

}  // namespace rnncore::detail
