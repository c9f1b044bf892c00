// Layer descriptors with MPSGraph's defaults. The meaning of every field is the
// contract's (docs/semantics.md); names follow the Python API. Each descriptor's fields
// are listed once more in a table below it: comparison, the Python binding (keywords,
// properties, repr, pickling) and anything else that walks the fields reads the table.
#pragma once

#include <cstdint>
#include <iterator>

namespace rnncore {

enum class Activation : int32_t { None = 0, Relu = 1, Tanh = 2, Sigmoid = 3, HardSigmoid = 4 };

// The contract's activation table ("Activations"), indexed by value: the Python enum's
// members are these names upper-cased.
struct ActivationInfo {
  Activation value;
  const char* name;
  const char* formula;  // f(x), for the Python member's docstring
};
inline constexpr ActivationInfo kActivations[] = {
    {Activation::None, "none", "x"},
    {Activation::Relu, "relu", "max(x, 0)"},
    {Activation::Tanh, "tanh", "tanh(x)"},
    {Activation::Sigmoid, "sigmoid", "1 / (1 + exp(-x))"},
    {Activation::HardSigmoid, "hard_sigmoid", "clamp(0.2 * x + 0.5, 0, 1)"},
};
inline constexpr int32_t kActivationCount = static_cast<int32_t>(std::size(kActivations));

constexpr bool activations_in_value_order() {
  for (int32_t i = 0; i < kActivationCount; ++i)
    if (static_cast<int32_t>(kActivations[i].value) != i) return false;
  return true;
}
static_assert(activations_in_value_order(), "kActivations is indexed by value");

const char* activation_name(Activation a);
// True for the values of the table; anything else is refused at the boundary.
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

// ---- The field tables ------------------------------------------------------------------
// One entry per field, in declaration order: exactly one of `flag` and `activation` is
// set. `doc` is the field's one-line description (from the contract), shown by Python's
// help(). Defaults are the member initializers above.

template <class D>
struct Field {
  const char* name;
  bool D::*flag;
  Activation D::*activation;
  const char* doc;
};

// DescriptorTraits<D>: the class name (as in Python) and the field table of descriptor D.
template <class D>
struct DescriptorTraits;

inline constexpr const char* kReverseDoc =
    "Process the sequence from its last step; outputs stay in processing order. Ignored when "
    "bidirectional.";
inline constexpr const char* kBidirectionalDoc =
    "Two directions (D = 2): forward then backward halves of every weight and output.";
inline constexpr const char* kTrainingDoc =
    "Also return z_state (the pre-activations), which the gradient operation takes; ignored "
    "by the gradient operation.";

template <>
struct DescriptorTraits<RNNDescriptor> {
  using D = RNNDescriptor;
  static constexpr const char* name = "RNNDescriptor";
  static constexpr Field<D> fields[] = {
      {"reverse", &D::reverse, nullptr, kReverseDoc},
      {"bidirectional", &D::bidirectional, nullptr, kBidirectionalDoc},
      {"training", &D::training, nullptr, kTrainingDoc},
      {"activation", nullptr, &D::activation, "The activation of the state, h = act(z)."},
  };
};

template <>
struct DescriptorTraits<LSTMDescriptor> {
  using D = LSTMDescriptor;
  static constexpr const char* name = "LSTMDescriptor";
  static constexpr Field<D> fields[] = {
      {"reverse", &D::reverse, nullptr, kReverseDoc},
      {"bidirectional", &D::bidirectional, nullptr, kBidirectionalDoc},
      {"produce_cell", &D::produce_cell, nullptr, "Also return the cell state c."},
      {"training", &D::training, nullptr,
       "Also return z_state (the pre-activations) and the cell state c, which the gradient "
       "operation takes; ignored by the gradient operation."},
      {"forget_gate_last", &D::forget_gate_last, nullptr,
       "Gate blocks in the order i, z, f, o instead of i, f, z, o."},
      {"input_gate_activation", nullptr, &D::input_gate_activation, "Activation of gate i."},
      {"forget_gate_activation", nullptr, &D::forget_gate_activation, "Activation of gate f."},
      {"cell_gate_activation", nullptr, &D::cell_gate_activation,
       "Activation of the cell (candidate) gate z."},
      {"output_gate_activation", nullptr, &D::output_gate_activation, "Activation of gate o."},
      {"activation", nullptr, &D::activation, "Activation of the cell in h = o * act(c)."},
  };
};

template <>
struct DescriptorTraits<GRUDescriptor> {
  using D = GRUDescriptor;
  static constexpr const char* name = "GRUDescriptor";
  static constexpr Field<D> fields[] = {
      {"reverse", &D::reverse, nullptr, kReverseDoc},
      {"bidirectional", &D::bidirectional, nullptr, kBidirectionalDoc},
      {"training", &D::training, nullptr, kTrainingDoc},
      {"reset_gate_first", &D::reset_gate_first, nullptr,
       "Gate blocks in the order r, z, o instead of z, r, o."},
      {"reset_after", &D::reset_after, nullptr,
       "Apply the reset gate after the recurrent product: o = act(x_o + r * (h R_o^T + b2))."},
      {"flip_z", &D::flip_z, nullptr,
       "Blend as h = (1 - z) * h_prev + z * o instead of z * h_prev + (1 - z) * o."},
      {"update_gate_activation", nullptr, &D::update_gate_activation,
       "Activation of the update gate z."},
      {"reset_gate_activation", nullptr, &D::reset_gate_activation,
       "Activation of the reset gate r."},
      {"output_gate_activation", nullptr, &D::output_gate_activation,
       "Activation of the candidate (output) gate o."},
  };
};

}  // namespace rnncore
