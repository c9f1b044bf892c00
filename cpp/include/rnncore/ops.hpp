// The recurrent operations. Equations, layouts and shapes: docs/semantics.md.
// Inputs are read in place (C-contiguous); all array inputs of one call share a dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "rnncore/descriptors.hpp"
#include "rnncore/device.hpp"
#include "rnncore/tensor.hpp"

namespace rnncore {

struct RNNInputs {
  TensorView source;                       // [T, N, I], or [T, N, D*H] without input_weight
  TensorView recurrent_weight;             // [H, H], or [2, H, H] when bidirectional
  std::optional<TensorView> input_weight;  // [D*H, I]
  std::optional<TensorView> bias;          // [D*H]
  std::optional<TensorView> init_state;    // [N, D*H]
  std::optional<TensorView> mask;          // broadcastable to [N, D*H]
  // [N]: row n runs for its first sequence_lengths[n] steps (contract: "Sequence lengths").
  std::optional<std::vector<int64_t>> sequence_lengths;
};

struct RNNResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> z_state;  // [T, N, D*H] when training
};

struct LSTMInputs {
  TensorView source;                       // [T, N, I], or [T, N, D*4H] without input_weight
  TensorView recurrent_weight;             // [4H, H], or [2, 4H, H]
  std::optional<TensorView> input_weight;  // [D*4H, I]
  std::optional<TensorView> bias;          // [D*4H]
  std::optional<TensorView> init_state;    // [N, D*H]
  std::optional<TensorView> init_cell;     // [N, D*H]
  std::optional<TensorView> mask;          // broadcastable to [N, D*H]
  std::optional<TensorView> peephole;      // [4H], or [2, 4H]
  // [N]: row n runs for its first sequence_lengths[n] steps (contract: "Sequence lengths").
  std::optional<std::vector<int64_t>> sequence_lengths;
};

struct LSTMResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> cell;     // [T, N, D*H] when produce_cell or training
  std::optional<Tensor> z_state;  // [T, N, D*4H] when training
};

struct GRUInputs {
  TensorView source;                         // [T, N, I], or [T, N, D*3H] without input_weight
  TensorView recurrent_weight;               // [3H, H], or [2, 3H, H]
  std::optional<TensorView> input_weight;    // [D*3H, I]
  std::optional<TensorView> bias;            // [D*3H]
  std::optional<TensorView> init_state;      // [N, D*H]
  std::optional<TensorView> mask;            // broadcastable to [N, D*H]
  std::optional<TensorView> secondary_bias;  // [D*H]; used when reset_after
  // [N]: row n runs for its first sequence_lengths[n] steps (contract: "Sequence lengths").
  std::optional<std::vector<int64_t>> sequence_lengths;
};

struct GRUResults {
  Tensor state;                   // [T, N, D*H]
  std::optional<Tensor> z_state;  // [T, N, D*3H], or [T, N, D*4H] when reset_after
};

// ---- Gradients (contract: "Gradient operations") -------------------------------------------
// Each takes the forward inputs again plus the gradient of the first output, the training
// state of a forward run with the same descriptor and, for GRU / LSTM, the forward h / c.
// A gradient is returned for every differentiable input that was given.

struct RNNGradientInputs : RNNInputs {
  TensorView source_gradient;                // [T, N, D*H], laid out as the state output
  TensorView z_state;                        // [T, N, D*H]
  std::optional<TensorView> state_gradient;  // [N, D*H]: into each direction's final state
};

struct RNNGradients {
  Tensor source;
  Tensor recurrent_weight;
  std::optional<Tensor> input_weight, bias, init_state;
};

struct LSTMGradientInputs : LSTMInputs {
  TensorView source_gradient;                // [T, N, D*H]
  TensorView z_state;                        // [T, N, D*4H]
  TensorView cell_output_fwd;                // [T, N, D*H]: the forward cell output
  std::optional<TensorView> state_gradient;  // [N, D*H]
  std::optional<TensorView> cell_gradient;   // [N, D*H] (final cell) or [T, N, D*H] (per step)
};

struct LSTMGradients {
  Tensor source;
  Tensor recurrent_weight;
  std::optional<Tensor> input_weight, bias, peephole, init_state, init_cell;
};

struct GRUGradientInputs : GRUInputs {
  TensorView source_gradient;                // [T, N, D*H]
  TensorView z_state;                        // [T, N, D*3H], or [T, N, D*4H] with reset_after
  TensorView output_fwd;                     // [T, N, D*H]: the forward state output
  std::optional<TensorView> state_gradient;  // [N, D*H]
};

struct GRUGradients {
  Tensor source;
  Tensor recurrent_weight;
  std::optional<Tensor> input_weight, bias, init_state, secondary_bias;
};

RNNResults single_gate_rnn(const RNNInputs& inputs, const RNNDescriptor& descriptor = {},
                           Device device = Device::Auto);
LSTMResults lstm(const LSTMInputs& inputs, const LSTMDescriptor& descriptor = {},
                 Device device = Device::Auto);
GRUResults gru(const GRUInputs& inputs, const GRUDescriptor& descriptor = {},
               Device device = Device::Auto);

// The descriptor is that of the forward run (no default: the defaults would silently give
// the gradients of another operation); its `training` field is ignored.
RNNGradients single_gate_rnn_gradients(const RNNGradientInputs& inputs,
                                       const RNNDescriptor& descriptor,
                                       Device device = Device::Auto);
LSTMGradients lstm_gradients(const LSTMGradientInputs& inputs, const LSTMDescriptor& descriptor,
                             Device device = Device::Auto);
GRUGradients gru_gradients(const GRUGradientInputs& inputs, const GRUDescriptor& descriptor,
                           Device device = Device::Auto);

}  // namespace rnncore
