#include "core/validate.hpp"

#include <string>

namespace rnncore::detail {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::Rnn: return "single_gate_rnn";
    case OpKind::Lstm: return "lstm";
    case OpKind::Gru: return "gru";
  }
  return "?";
}

void Checker::value_error(const std::string& msg) const {
  throw ValueError(std::string("[") + op_ + "] " + msg);
}

void Checker::type_error(const std::string& msg) const {
  throw TypeError(std::string("[") + op_ + "] " + msg);
}

void Checker::dtype(const char* name, const TensorView& v) {
  if (v.dtype != DType::Float32 && v.dtype != DType::Float64 && v.dtype != DType::Float16 &&
      v.dtype != DType::BFloat16)
    type_error(std::string(name) + " has an unsupported dtype");
  for (int64_t s : v.shape)
    if (s < 0) value_error(std::string(name) + " has a negative size " + shape_to_string(v.shape));
  int64_t numel = 0;
  try {
    numel = v.numel();
  } catch (const ValueError&) {
    value_error(std::string(name) + " has shape " + shape_to_string(v.shape) +
                ", whose element count overflows 64 bits");
  }
  if (v.data == nullptr && numel > 0)
    value_error(std::string(name) + " has shape " + shape_to_string(v.shape) + " but no data");
  if (!first_) {
    first_ = name;
    dtype_ = v.dtype;
  } else if (v.dtype != dtype_) {
    type_error(std::string(name) + " has dtype " + dtype_name(v.dtype) + " but " + first_ +
               " has dtype " + dtype_name(dtype_) + "; all arrays must share one dtype");
  }
}

void Checker::array(const char* name, const TensorView& v, const Shape& expected,
                    const char* meaning) {
  dtype(name, v);
  exact(name, v, expected, meaning);
}

void Checker::exact(const char* name, const TensorView& v, const Shape& expected,
                    const char* meaning) const {
  if (v.shape == expected) return;
  std::string m = std::string(name) + " must have shape " + shape_to_string(expected);
  if (meaning) m += std::string(" ") + meaning;
  value_error(m + " but has " + shape_to_string(v.shape));
}

void Checker::rank(const char* name, const TensorView& v, int64_t rank, const char* meaning) const {
  if (v.rank() == rank) return;
  value_error(std::string(name) + " must have rank " + std::to_string(rank) + " " + meaning +
              " but has shape " + shape_to_string(v.shape));
}

void Checker::activation(const char* field, Activation a) const {
  if (!is_valid(a))
    value_error(std::string("descriptor.") + field + " must be an Activation (0.." +
                std::to_string(kActivationCount - 1) + ") but is " +
                std::to_string(static_cast<int>(a)));
}

void Checker::sizes(const char* what,
                    std::initializer_list<std::pair<const char*, int64_t>> factors) const {
  // Every array and workspace of a call is at most a product of these factors; bounding
  // them by 2^59 elements keeps byte counts (8-byte elements) and their sums in int64.
  constexpr int64_t kMax = int64_t(1) << 59;
  int64_t n = 1;
  bool zero = false, overflow = false;
  for (const auto& f : factors) {
    zero = zero || f.second == 0;
    overflow = overflow || __builtin_mul_overflow(n, f.second, &n) || n > kMax;
  }
  if (zero || !overflow) return;
  std::string names, values;
  for (const auto& f : factors) {
    names += std::string(names.empty() ? "" : "*") + f.first;
    values += (values.empty() ? "" : "*") + std::to_string(f.second);
  }
  value_error(std::string(what) + " would have " + names + " = " + values +
              " elements, more than 2^59: the sizes are too large");
}

namespace {

// Shapes shared by every op: source, recurrent weight and the optional inputs common to
// all three; fills T, N, I, H, D, G and the has_* flags.
template <class In>
void validate_common(Checker& c, Problem& p, const In& in, bool bidirectional) {
  p.D = bidirectional ? 2 : 1;
  c.dtype("source", in.source);
  c.dtype("recurrent_weight", in.recurrent_weight);
  c.rank("source", in.source, 3, "(T, N, features)");
  const auto& rw = in.recurrent_weight;
  const char* g = p.G == 1 ? "" : (p.G == 3 ? "3" : "4");
  if (p.D == 2) {
    if (rw.rank() != 3)
      c.value_error(std::string("recurrent_weight must have rank 3 (2, ") + g +
                    "H, H) for a bidirectional layer but has shape " + shape_to_string(rw.shape));
  } else if (rw.rank() != 2) {
    c.value_error(std::string("recurrent_weight must have rank 2 (") + g +
                  "H, H) for a unidirectional layer but has shape " + shape_to_string(rw.shape));
  }
  p.H = rw.shape.back();
  Shape rw_expected = {p.G * p.H, p.H};
  if (p.D == 2) rw_expected.insert(rw_expected.begin(), 2);
  c.exact("recurrent_weight", rw, rw_expected);

  p.T = in.source.shape[0];
  p.N = in.source.shape[1];
  const int64_t dgh = p.D * p.G * p.H, dh = p.D * p.H;
  if (in.input_weight) {
    p.has_input_weight = true;
    c.dtype("input_weight", *in.input_weight);
    p.I = in.source.shape[2];
    c.exact("input_weight", *in.input_weight, {dgh, p.I}, "(D*G*H, I)");
  } else {
    p.I = dgh;
    c.exact("source", in.source, {p.T, p.N, dgh}, "(T, N, D*G*H) without input_weight");
  }
  if (in.bias) {
    p.has_bias = true;
    c.array("bias", *in.bias, {dgh}, "(D*G*H)");
  }
  if (in.init_state) {
    p.has_init_state = true;
    c.array("init_state", *in.init_state, {p.N, dh}, "(N, D*H)");
  }
  if (in.mask) {
    p.has_mask = true;
    const auto& m = *in.mask;
    c.dtype("mask", m);
    const std::string want = shape_to_string({p.N, dh});
    if (m.rank() > 2)
      c.value_error("mask must broadcast to (N, D*H) = " + want +
                    " and has no time axis, but has shape " + shape_to_string(m.shape));
    bool ok = true;
    if (m.rank() >= 1) ok = ok && (m.shape.back() == 1 || m.shape.back() == dh);
    if (m.rank() == 2) ok = ok && (m.shape[0] == 1 || m.shape[0] == p.N);
    if (!ok)
      c.value_error("mask must broadcast to (N, D*H) = " + want + " but has shape " +
                    shape_to_string(m.shape));
  }
  if (in.sequence_lengths) {
    const auto& L = *in.sequence_lengths;
    if (static_cast<int64_t>(L.size()) != p.N)
      c.value_error("sequence_lengths must have shape (N,) = (" + std::to_string(p.N) +
                    ",) but has shape (" + std::to_string(L.size()) + ",)");
    for (size_t n = 0; n < L.size(); ++n)
      if (L[n] < 0 || L[n] > p.T)
        c.value_error("sequence_lengths[" + std::to_string(n) + "] = " + std::to_string(L[n]) +
                      (L[n] < 0 ? " is negative" : " is above T = " + std::to_string(p.T)) +
                      "; each length must lie in [0, T] = [0, " + std::to_string(p.T) + "]");
  }
  p.dtype = c.dtype_value();
  // The largest arrays of a call (outputs, training state, projected input, weights and
  // their gradients); each must have an element count that byte arithmetic can hold.
  c.sizes("the state output", {{"T", p.T}, {"N", p.N}, {"D", p.D}, {"H", p.H}});
  c.sizes("the projected input", {{"T", p.T}, {"N", p.N}, {"D", p.D}, {"G", p.G}, {"H", p.H}});
  c.sizes("recurrent_weight", {{"D", p.D}, {"G", p.G}, {"H", p.H}, {"H", p.H}});
  c.sizes("input_weight", {{"D", p.D}, {"G", p.G}, {"H", p.H}, {"I", p.I}});
  c.sizes("source", {{"T", p.T}, {"N", p.N}, {"I", p.I}});
  c.sizes("z_state", {{"T", p.T}, {"N", p.N}, {"D", p.D}, {"ZG", p.ZG}, {"H", p.H}});
}

Problem validate_inputs(Checker& c, const RNNInputs& in, const RNNDescriptor& d) {
  c.activation("activation", d.activation);
  Problem p;
  p.op = OpKind::Rnn;
  p.G = p.ZG = 1;
  validate_common(c, p, in, d.bidirectional);
  p.reverse = d.reverse && !d.bidirectional;
  p.training = d.training;
  p.gate_act[0] = d.activation;
  return p;
}

Problem validate_inputs(Checker& c, const LSTMInputs& in, const LSTMDescriptor& d) {
  c.activation("input_gate_activation", d.input_gate_activation);
  c.activation("forget_gate_activation", d.forget_gate_activation);
  c.activation("cell_gate_activation", d.cell_gate_activation);
  c.activation("output_gate_activation", d.output_gate_activation);
  c.activation("activation", d.activation);
  Problem p;
  p.op = OpKind::Lstm;
  p.G = p.ZG = 4;
  validate_common(c, p, in, d.bidirectional);
  if (in.init_cell) {
    p.has_init_cell = true;
    c.array("init_cell", *in.init_cell, {p.N, p.D * p.H}, "(N, D*H)");
  }
  if (in.peephole) {
    p.has_peephole = true;
    c.dtype("peephole", *in.peephole);
    Shape want = p.D == 2 ? Shape{2, 4 * p.H} : Shape{4 * p.H};
    c.exact("peephole", *in.peephole, want, p.D == 2 ? "(2, 4H)" : "(4H)");
  }
  p.dtype = c.dtype_value();
  p.reverse = d.reverse && !d.bidirectional;
  p.training = d.training;
  p.produce_cell = d.produce_cell || d.training;
  p.lstm_i = 0;
  p.lstm_f = d.forget_gate_last ? 2 : 1;
  p.lstm_z = d.forget_gate_last ? 1 : 2;
  p.lstm_o = 3;
  p.gate_act[p.lstm_i] = d.input_gate_activation;
  p.gate_act[p.lstm_f] = d.forget_gate_activation;
  p.gate_act[p.lstm_z] = d.cell_gate_activation;
  p.gate_act[p.lstm_o] = d.output_gate_activation;
  p.cell_act = d.activation;
  return p;
}

Problem validate_inputs(Checker& c, const GRUInputs& in, const GRUDescriptor& d) {
  c.activation("update_gate_activation", d.update_gate_activation);
  c.activation("reset_gate_activation", d.reset_gate_activation);
  c.activation("output_gate_activation", d.output_gate_activation);
  Problem p;
  p.op = OpKind::Gru;
  p.G = 3;
  p.ZG = d.reset_after ? 4 : 3;
  validate_common(c, p, in, d.bidirectional);
  if (in.secondary_bias) {
    p.has_secondary_bias = true;
    c.array("secondary_bias", *in.secondary_bias, {p.D * p.H}, "(D*H)");
  }
  p.dtype = c.dtype_value();
  p.reverse = d.reverse && !d.bidirectional;
  p.training = d.training;
  p.gru = d;
  p.gru_z = d.reset_gate_first ? 1 : 0;
  p.gru_r = d.reset_gate_first ? 0 : 1;
  p.gate_act[p.gru_z] = d.update_gate_activation;
  p.gate_act[p.gru_r] = d.reset_gate_activation;
  p.gate_act[2] = d.output_gate_activation;
  return p;
}

// The forward op's inputs, and those every gradient op adds to them.
template <class In, class Desc>
Problem validate_gradient_inputs(Checker& c, const In& in, const Desc& d) {
  const Problem p = validate_inputs(c, in, d);
  const Shape seq = {p.T, p.N, p.dh()};
  c.array("source_gradient", in.source_gradient, seq, "(T, N, D*H)");
  c.array("z_state", in.z_state, {p.T, p.N, p.D * p.ZG * p.H},
          "(the training state of a forward run with this descriptor)");
  if (in.state_gradient) c.array("state_gradient", *in.state_gradient, {p.N, p.dh()}, "(N, D*H)");
  return p;
}

}  // namespace

Problem validate(const RNNInputs& in, const RNNDescriptor& d) {
  Checker c("single_gate_rnn");
  return validate_inputs(c, in, d);
}

Problem validate(const LSTMInputs& in, const LSTMDescriptor& d) {
  Checker c("lstm");
  return validate_inputs(c, in, d);
}

Problem validate(const GRUInputs& in, const GRUDescriptor& d) {
  Checker c("gru");
  return validate_inputs(c, in, d);
}

Problem validate(const RNNGradientInputs& in, const RNNDescriptor& d) {
  Checker c("single_gate_rnn_gradients");
  return validate_gradient_inputs(c, in, d);
}

Problem validate(const LSTMGradientInputs& in, const LSTMDescriptor& d) {
  Checker c("lstm_gradients");
  const Problem p = validate_gradient_inputs(c, in, d);
  c.array("cell_output_fwd", in.cell_output_fwd, {p.T, p.N, p.dh()}, "(T, N, D*H)");
  if (in.cell_gradient) {
    const TensorView& g = *in.cell_gradient;
    c.dtype("cell_gradient", g);
    const Shape fin = {p.N, p.dh()}, steps = {p.T, p.N, p.dh()};
    if (g.shape != fin && g.shape != steps)
      c.value_error("cell_gradient must have shape " + shape_to_string(fin) +
                    " (N, D*H: the final cell) or " + shape_to_string(steps) +
                    " (T, N, D*H: every step) but has " + shape_to_string(g.shape));
  }
  return p;
}

Problem validate(const GRUGradientInputs& in, const GRUDescriptor& d) {
  Checker c("gru_gradients");
  const Problem p = validate_gradient_inputs(c, in, d);
  c.array("output_fwd", in.output_fwd, {p.T, p.N, p.dh()}, "(T, N, D*H)");
  return p;
}

}  // namespace rnncore::detail
