// The CPU backend's unit of work: one direction of a layer, its arrays already offset to
// the direction's columns (backend.cpp sets them up from the caller's whole arrays).
#pragma once

#include <cstdint>

namespace rnncore::cpu {

// What both passes of one direction read of the layer's inputs. Every pointer is already
// offset to this direction's columns; `*_ld` are row strides in elements, and time step
// t starts at row t*N.
struct DirectionInputs {
  const void* R = nullptr;  // [G*H, H]
  // float16 or bfloat16 storage: R as the caller gave it (16 bits, R_bfloat16 says which),
  // for the fused forward's panels; R above is its float32 copy. Null otherwise.
  const uint16_t* R_narrow = nullptr;
  bool R_bfloat16 = false;
  // float16 R_narrow packed into float32 panels, widened once (forward_narrow says when).
  bool R_widen = false;
  const void* h0 = nullptr;  // [N, H] or null (zeros)
  int64_t h0_ld = 0;
  const void* c0 = nullptr;  // LSTM [N, H] or null (zeros)
  int64_t c0_ld = 0;
  const void* mask = nullptr;  // [N, H] or null (ones)
  int64_t mask_ld = 0;
  const void* peephole = nullptr;  // LSTM [4H] or null
  bool flip_in = false;
  bool flip_out = false;
};

// One direction of the core recurrence (docs/semantics.md, CORE). Step s reads x' at time
// (flip_in ? T-1-s : s) and writes its outputs at time (flip_out ? T-1-s : s).
struct DirectionForward : DirectionInputs {
  const void* xp = nullptr;  // x' = projected input + bias, [T, N, G*H] of stride xp_ld
  int64_t xp_ld = 0;
  // With Problem::fused_projection (xp null): the source [T, N, I] (x_ld apart), this
  // direction's W [G*H, I] and bias [G*H] (or null), for the step to project its own rows.
  // On the vdpbf16ps path (bfloat16 storage) the source and W are the caller's bfloat16
  // bits (x_bits, W_bits) instead, the source's rows read in place as pairs (I even).
  // float16 storage with Problem::lazy_projection: W is the caller's float16 bits (W_bits,
  // W null), packed as they are and widened by the tiles.
  const void* x = nullptr;
  const uint16_t* x_bits = nullptr;
  int64_t x_ld = 0;
  const void* W = nullptr;
  const uint16_t* W_bits = nullptr;
  const void* bias = nullptr;
  const void* b2 = nullptr;  // GRU secondary bias [H] or null
  void* y = nullptr;         // [T, N, H]
  int64_t y_ld = 0;
  void* c = nullptr;  // LSTM cell output [T, N, H] or null
  int64_t c_ld = 0;
  // A bfloat16 LSTM on the vdpbf16ps path: the caller's bfloat16 state, cell and training
  // state outputs (y_ld, c_ld and z_ld apart), which the steps write directly (y, c and z
  // are then null). The cell carried between steps stays float32 in the workspace, and so
  // does the state of a training forward (whose products split it); in inference the next
  // step's product takes its pairs from y_bits.
  uint16_t* y_bits = nullptr;
  uint16_t* c_bits = nullptr;
  uint16_t* z_bits = nullptr;
  void* z = nullptr;  // training state [T, N, ZG*H] or null
  int64_t z_ld = 0;
};

// One direction of back-propagation through time (contract: "Gradient operations").
// Forward data and dy are read at output time (flip_out), dX' is written at input time
// (flip_in). Null pointers mean "absent" (zeros for inputs, not wanted for outputs).
struct DirectionBackward : DirectionInputs {
  const void* z = nullptr;  // training state [T, N, ZG*H]
  int64_t z_ld = 0;
  // bfloat16 storage's LSTM: the training state as the caller gave it (z_ld apart), each row
  // widened by the step that reads it (z is then null): no float32 copy of all of it. So are
  // the forward's cell output (c_bits, c_fwd_ld apart; c_fwd null) and dy (dy_bits, dy_ld).
  const uint16_t* z_bits = nullptr;
  const uint16_t* c_bits = nullptr;
  const uint16_t* dy_bits = nullptr;
  // Where dW is computed with dR (joint_input_gradient): the source [T*N, I] and this
  // direction's dW [G*H, I]; else null.
  const void* source = nullptr;
  void* dW = nullptr;
  const void* h_fwd = nullptr;  // GRU forward state output [T, N, H]
  int64_t h_fwd_ld = 0;
  const void* c_fwd = nullptr;  // LSTM forward cell output [T, N, H]
  int64_t c_fwd_ld = 0;
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
  // dX' as bfloat16 bits [T, N, G*H] (dxp_ld apart; recurrence.hpp's dxp_bits_wanted), dxp
  // then being one step's float32 rows [N, G*H]; else null.
  uint16_t* dxp_bits = nullptr;
  void* dR = nullptr;   // [G*H, H]
  void* dP = nullptr;   // LSTM [4H] or null
  void* db2 = nullptr;  // GRU reset-after secondary-bias gradient [H] or null
  void* dh0 = nullptr;  // [N, H] or null
  int64_t dh0_ld = 0;
  void* dc0 = nullptr;  // LSTM [N, H] or null
  int64_t dc0_ld = 0;
};

}  // namespace rnncore::cpu
