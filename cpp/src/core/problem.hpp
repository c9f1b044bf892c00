// The validated shape of one operation call: sizes, which optional inputs exist, and the
// descriptor reduced to what the backends need (gate positions and activations).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "rnncore/descriptors.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore::detail {

enum class OpKind { Rnn, Lstm, Gru };

const char* op_name(OpKind op);  // "single_gate_rnn", "lstm", "gru"

struct Problem {
  OpKind op = OpKind::Rnn;
  DType dtype = DType::Float32;
  int64_t T = 0, N = 0, I = 0, H = 0;
  int64_t D = 1;   // directions
  int64_t G = 1;   // gate blocks: 1, 4 (LSTM), 3 (GRU)
  int64_t ZG = 1;  // blocks per direction in z_state: G, or 4 for a reset-after GRU

  bool has_input_weight = false, has_bias = false, has_init_state = false, has_init_cell = false,
       has_mask = false, has_peephole = false, has_secondary_bias = false;

  bool reverse = false;  // unidirectional only (ignored when D == 2)
  bool training = false;
  bool produce_cell = false;  // LSTM: cell output returned (produce_cell or training)

  // Activation of each gate block, by block position (as stored in the weights).
  std::array<Activation, 4> gate_act{};
  Activation cell_act = Activation::Tanh;  // LSTM phi

  // Block positions of the logical gates. LSTM: i, f, z (cell), o. GRU: z, r, o.
  int64_t lstm_i = 0, lstm_f = 1, lstm_z = 2, lstm_o = 3;
  int64_t gru_z = 0, gru_r = 1;  // the GRU candidate block is always 2
  // The GRU's descriptor as given: its flags (reset_after, flip_z, ...) are read where they
  // act, so a new flag is not copied field by field on its way to the kernels.
  GRUDescriptor gru;

  // The callers' arrays' type where the CPU runs float16 or bfloat16 storage as a float32
  // problem (dtype is then Float32): some products may use it (bfloat16 tiles).
  DType storage = DType::Float32;
  // The CPU's fused LSTM forward multiplies each step's source rows by W itself (no x' made
  // beforehand; DirectionForward::x, W and bias): backend.cpp decides, the kernels follow.
  bool fused_projection = false;
  // At batch 1 (an LSTM or a reset-after GRU): the fused forward fills x' itself (the same
  // DirectionForward fields), by blocks of steps' rows and a chunk's panels, ahead of the
  // steps that read them, in the time threads would otherwise wait for a step.
  bool lazy_projection = false;

  int64_t gh() const { return G * H; }
  int64_t dh() const { return D * H; }
};

}  // namespace rnncore::detail
