// The recurrent operations. Equations, layouts and shapes: shared/spec/semantics.md.
// Inputs are read in place (C-contiguous); all array inputs of one call share a dtype.
#pragma once

#include <optional>

#include "rnncore/descriptors.hpp"
#include "rnncore/device.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore {

struct RNNInputs {
  TensorView source;            // [T, N, I], or [T, N, D*H] without input_weight
  TensorView recurrent_weight;  // [H, H], or [2, H, H] when bidirectional
  std::optional<TensorView> input_weight;  // [D*H, I]
  std::optional<TensorView> bias;          // [D*H]
  std::optional<TensorView> init_state;    // [N, D*H]
  std::optional<TensorView> mask;          // broadcastable to [N, D*H]
};

struct RNNResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> z_state;  // [T, N, D*H] when training
};

struct LSTMInputs {
  TensorView source;            // [T, N, I], or [T, N, D*4H] without input_weight
  TensorView recurrent_weight;  // [4H, H], or [2, 4H, H]
  std::optional<TensorView> input_weight;  // [D*4H, I]
  std::optional<TensorView> bias;          // [D*4H]
  std::optional<TensorView> init_state;    // [N, D*H]
  std::optional<TensorView> init_cell;     // [N, D*H]
  std::optional<TensorView> mask;          // broadcastable to [N, D*H]
  std::optional<TensorView> peephole;      // [4H], or [2, 4H]
};

struct LSTMResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> cell;     // [T, N, D*H] when produce_cell or training
  std::optional<Tensor> z_state;  // [T, N, D*4H] when training
};

struct GRUInputs {
  TensorView source;            // [T, N, I], or [T, N, D*3H] without input_weight
  TensorView recurrent_weight;  // [3H, H], or [2, 3H, H]
  std::optional<TensorView> input_weight;    // [D*3H, I]
  std::optional<TensorView> bias;            // [D*3H]
  std::optional<TensorView> init_state;      // [N, D*H]
  std::optional<TensorView> mask;            // broadcastable to [N, D*H]
  std::optional<TensorView> secondary_bias;  // [D*H]; used when reset_after
};

struct GRUResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> z_state;  // [T, N, D*3H], or [T, N, D*4H] when reset_after
};

RNNResults single_gate_rnn(const RNNInputs& inputs, const RNNDescriptor& descriptor = {},
                           Device device = Device::Auto);
LSTMResults lstm(const LSTMInputs& inputs, const LSTMDescriptor& descriptor = {},
                 Device device = Device::Auto);
GRUResults gru(const GRUInputs& inputs, const GRUDescriptor& descriptor = {},
               Device device = Device::Auto);

}  // namespace rnncore
