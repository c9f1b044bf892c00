#include "rnncore/descriptors.hpp"

#include <tuple>

namespace rnncore {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::None: return "none";
    case Activation::Relu: return "relu";
    case Activation::Tanh: return "tanh";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::HardSigmoid: return "hard_sigmoid";
  }
  return "invalid";
}

bool is_valid(Activation a) {
  const auto v = static_cast<int32_t>(a);
  return v >= 0 && v <= 4;
}

bool RNNDescriptor::operator==(const RNNDescriptor& o) const {
  return std::tie(reverse, bidirectional, training, activation) ==
         std::tie(o.reverse, o.bidirectional, o.training, o.activation);
}

bool LSTMDescriptor::operator==(const LSTMDescriptor& o) const {
  return std::tie(reverse, bidirectional, produce_cell, training, forget_gate_last,
                  input_gate_activation, forget_gate_activation, cell_gate_activation,
                  output_gate_activation, activation) ==
         std::tie(o.reverse, o.bidirectional, o.produce_cell, o.training, o.forget_gate_last,
                  o.input_gate_activation, o.forget_gate_activation, o.cell_gate_activation,
                  o.output_gate_activation, o.activation);
}

bool GRUDescriptor::operator==(const GRUDescriptor& o) const {
  return std::tie(reverse, bidirectional, training, reset_gate_first, reset_after, flip_z,
                  update_gate_activation, reset_gate_activation, output_gate_activation) ==
         std::tie(o.reverse, o.bidirectional, o.training, o.reset_gate_first, o.reset_after,
                  o.flip_z, o.update_gate_activation, o.reset_gate_activation,
                  o.output_gate_activation);
}

}  // namespace rnncore
