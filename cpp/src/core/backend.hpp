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
  const void* R = nullptr;   // [G*H, H]
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

// One direction of back-propagation through time (contract: "Gradient operations").
// Forward data and dy are read at output time (flip_out), dX' is written at input time
// (flip_in). Null pointers mean "absent" (zeros for inputs, not wanted for outputs).
struct DirectionBackward {
  const void* z = nullptr;  // training state [T, N, ZG*H]
  int64_t z_ld = 0;
  const void* h_fwd = nullptr;  // GRU forward state output [T, N, H]
  int64_t h_fwd_ld = 0;
  const void* c_fwd = nullptr;  // LSTM forward cell output [T, N, H]
  int64_t c_fwd_ld = 0;
  const void* R = nullptr;
  const void* h0 = nullptr;
  int64_t h0_ld = 0;
  const void* c0 = nullptr;
  int64_t c0_ld = 0;
  const void* mask = nullptr;
  int64_t mask_ld = 0;
  const void* peephole = nullptr;
  const void* dy = nullptr;  // source_gradient [T, N, H]
  int64_t dy_ld = 0;
  const void* dh_final = nullptr;  // state_gradient [N, H]
  int64_t dh_final_ld = 0;
  const void* dc_final = nullptr;  // LSTM final-cell gradient [N, H]
  int64_t dc_final_ld = 0;
  const void* dc_steps = nullptr;  // LSTM per-step cell gradient [T, N, H]
  int64_t dc_steps_ld = 0;

  void* dxp = nullptr;  // dX' [T, N, G*H] (input time)
  int64_t dxp_ld = 0;
  void* dR = nullptr;   // [G*H, H]
  void* dP = nullptr;   // LSTM [4H] or null
  void* db2 = nullptr;  // GRU reset-after secondary-bias gradient [H] or null
  void* dh0 = nullptr;  // [N, H] or null
  int64_t dh0_ld = 0;
  void* dc0 = nullptr;  // LSTM [N, H] or null
  int64_t dc0_ld = 0;
  bool flip_in = false;
  bool flip_out = false;
};

// The caller's arrays of one forward call as the contract lays them out (directions
// concatenated; the mask as given, broadcasting to [N, D*H]). Backends that submit a whole
// op at once (Metal) take these and encode the wrapper's steps in their plan.
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

// One gradient call for a whole-op backend: the forward inputs, the gradient inputs, and
// the outputs (allocated by the wrapper through allocate(); null when not wanted).
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
  // Whether the backend takes whole ops (forward_whole / backward_whole) rather than being
  // driven step by step through project() ... input_gradients().
  virtual bool runs_whole_ops() const { return false; }
  // Whole-op forward; returns false for backends driven step by step (the CPU).
  virtual bool forward_whole(const Problem&, const ForwardArrays&) { return false; }
  // Whole-op gradients; false for backends driven step by step.
  virtual bool backward_whole(const Problem&, const BackwardArrays&) { return false; }
  // The dtypes the backend computes ("float32 and float64") and whether it takes `d`.
  virtual const char* dtypes() const { return "float32 and float64"; }
  virtual bool computes(DType d) const { return d == DType::Float32 || d == DType::Float64; }
  // Refuses (with an error naming the op) a problem the backend cannot index, before any
  // memory is allocated for it.
  virtual void admit(const Problem&, bool /*gradients*/) const {}
  // Memory the backend can compute on and the caller can read.
  virtual Tensor allocate(const Shape& shape, DType dtype) = 0;
  // xp[T*N, D*G*H] = source[T*N, K] * W^T (+ bias); W is null when absent (then K equals
  // D*G*H and source is copied), bias is null when absent.
  virtual void project(const Problem& p, const void* source, int64_t K, const void* W,
                       const void* bias, void* xp) = 0;
  // Runs every direction of the core recurrence (independent of each other).
  virtual void forward(const Problem& p, const DirectionForward* dirs) = 0;
  // Runs every direction of BPTT; fills dX' and the recurrent-side gradients.
  virtual void backward(const Problem& p, const DirectionBackward* dirs) = 0;
  // From dX' [T*N, D*G*H]: dsource = dX' W (or dX' without W; dsource may be null then),
  // dW = dX'^T source, dbias = column sums of dX'. Null outputs are not wanted.
  virtual void input_gradients(const Problem& p, const void* dxp, const void* source, const void* W,
                               void* dsource, void* dW, void* dbias) = 0;
};

Backend& cpu_backend();
// Throws DeviceError when Metal is not built or not usable here.
Backend& metal_backend();
bool metal_available();
// The Metal backend on the host emulator (builds with RNNCORE_METAL_EMULATOR).
Backend& emulated_backend();
bool emulator_available();

}  // namespace rnncore::detail
