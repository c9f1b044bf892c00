// Layer descriptors with MPSGraph's defaults. The meaning of every field is the
// contract's (docs/semantics.md); names follow the Python API.
#pragma once

#include <cstdint>

namespace rnncore {

enum class Activation : int32_t { None = 0, Relu = 1, Tanh = 2, Sigmoid = 3, HardSigmoid = 4 };

const char* activation_name(Activation a);
// True for the five values of the contract; anything else is refused at the boundary.
bool is_valid(Activation a);

struct RNNDescriptor {
  bool reverse = false;
  bool bidirectional = false;
  bool training = false;
  Activation activation = Activation::Relu;

  bool operator==(const RNNDescriptor& o) const;
  bool operator!=(const RNNDescriptor& o) const { return !(*this == o); }
};

struct LSTMDescriptor {
  bool reverse = false;
  bool bidirectional = false;
  bool produce_cell = false;
  bool training = false;
  bool forget_gate_last = false;
  Activation input_gate_activation = Activation::Sigmoid;
  Activation forget_gate_activation = Activation::Sigmoid;
  Activation cell_gate_activation = Activation::Tanh;
  Activation output_gate_activation = Activation::Sigmoid;
  Activation activation = Activation::Tanh;

  bool operator==(const LSTMDescriptor& o) const;
  bool operator!=(const LSTMDescriptor& o) const { return !(*this == o); }
};

struct GRUDescriptor {
  bool reverse = false;
  bool bidirectional = false;
  bool training = false;
  bool reset_gate_first = false;
  bool reset_after = false;
  bool flip_z = false;
  Activation update_gate_activation = Activation::Sigmoid;
  Activation reset_gate_activation = Activation::Sigmoid;
  Activation output_gate_activation = Activation::Tanh;

  bool operator==(const GRUDescriptor& o) const;
  bool operator!=(const GRUDescriptor& o) const { return !(*this == o); }
};

}  // namespace rnncore
