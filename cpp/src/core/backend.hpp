// The interface every backend implements: whole ops over the caller's arrays. The wrapper
// (ops.cpp) validates, allocates the outputs and hands over. Pointers are untyped because
// the element type is problem.dtype.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/problem.hpp"
#include "rnncore/device.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore::detail {

// The caller's arrays of one forward call as the contract lays them out (directions
// concatenated; the mask as given, broadcasting to [N, D*H]), outputs allocated by the
// wrapper through the backend's allocate().
struct ForwardArrays {
  const void* source = nullptr;
  const void* input_weight = nullptr;
  const void* recurrent_weight = nullptr;
  const void* bias = nullptr;
  const void* init_state = nullptr;
  const void* init_cell = nullptr;
  const void* mask = nullptr;
  int64_t mask_rows = 1, mask_cols = 1;
  const void* peephole = nullptr;
  const void* secondary_bias = nullptr;
  void* state = nullptr;
  void* cell = nullptr;
  void* z_state = nullptr;
};

// One gradient call: the forward inputs, the gradient inputs, and the outputs (allocated
// by the wrapper through allocate(); null when not wanted).
struct BackwardArrays {
  ForwardArrays fwd;  // its state/cell/z_state outputs are unused
  const void* z_state = nullptr;
  const void* h_fwd = nullptr;  // GRU output_fwd
  const void* c_fwd = nullptr;  // LSTM cell_output_fwd
  const void* dy = nullptr;
  const void* dh_final = nullptr;
  const void* dc_final = nullptr;  // LSTM cell_gradient [N, D*H]
  const void* dc_steps = nullptr;  // LSTM cell_gradient [T, N, D*H]
  void* dsource = nullptr;
  void* dR = nullptr;
  void* dW = nullptr;
  void* dbias = nullptr;
  void* dh0 = nullptr;
  void* dc0 = nullptr;
  void* dP = nullptr;
  void* db2 = nullptr;  // GRU reset-after with a secondary bias
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The dtypes the backend computes ("float32 and float64") and whether it takes `d`.
  virtual const char* dtypes() const { return "float32 and float64"; }
  virtual bool computes(DType d) const { return d == DType::Float32 || d == DType::Float64; }
  // Refuses (with an error naming the op) a problem the backend cannot index, before any
  // memory is allocated for it.
  virtual void admit(const Problem&, bool /*gradients*/) const {}
  // Memory the backend can compute on and the caller can read.
  virtual Tensor allocate(const Shape& shape, DType dtype) = 0;
  // allocate() with every element zero.
  virtual Tensor allocate_zeroed(const Shape& shape, DType dtype) {
    Tensor t = allocate(shape, dtype);
    if (t.nbytes() > 0) std::memset(t.data(), 0, static_cast<size_t>(t.nbytes()));
    return t;
  }
  // One whole forward op (T, N and H all positive): writes every output array given.
  virtual void forward(const Problem& p, const ForwardArrays& a) = 0;
  // One whole gradient op (T, N and H all positive): writes every non-null output, each
  // allocated through allocate().
  virtual void backward(const Problem& p, const BackwardArrays& a) = 0;
};

// The backend of `device` (Auto resolved through default_device()), from the device table
// (device.cpp); throws DeviceError saying why when this build or machine cannot run it.
Backend& backend_of(Device device);

}  // namespace rnncore::detail
