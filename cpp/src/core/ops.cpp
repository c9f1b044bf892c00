// The public operations: validate, pick the device, prepare the inputs, allocate the
// outputs once (answering the empty cases here), and hand the whole op to the backend.
#include "rnncore/ops.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/backend.hpp"
#include "core/lengths.hpp"
#include "core/validate.hpp"

namespace rnncore::detail {
namespace {

// The backend of `device` for problem p, refusing what it cannot compute (docs/api.md: float64
// on Metal is a TypeError naming both).
Backend& backend_for(Device device, const Problem& p, bool gradients) {
  const std::string op = std::string(op_name(p.op)) + (gradients ? "_gradients" : "");
  Backend* found = nullptr;
  try {
    found = &backend_of(device);
  } catch (const DeviceError& e) {
    // "[device] 'metal' is not available: ..." as the operation's error.
    const std::string msg = e.what();
    throw DeviceError("[" + op + "]" + (msg.rfind("[device]", 0) == 0 ? msg.substr(8) : " " + msg));
  }
  Backend& be = *found;
  if (!be.computes(p.dtype))
    throw TypeError("[" + op + "] device '" + be.name() + "' computes " + be.dtypes() + ", not " +
                    dtype_name(p.dtype) + "; " +
                    (p.dtype == DType::BFloat16
                         ? "bfloat16 storage on Metal needs macOS 14 (MSL 3.1's bfloat); "
                           "device 'cpu' computes it everywhere"
                         : std::string(dtype_name(p.dtype)) + " is computed on device 'cpu'"));
  be.admit(p, gradients);
  return be;
}

const void* opt_data(const std::optional<TensorView>& v) { return v ? v->data : nullptr; }

// The inputs as backends may take them: a present array always has a non-null pointer (a
// zero-size array from DLPack may have none, and null means "absent" to a backend), and
// one aligned to its element type (a misaligned view is copied; reading it in place is
// undefined behaviour).
class Prepared {
 public:
  void operator()(TensorView& v) {
    static const std::max_align_t kEmpty{};
    if (v.data == nullptr) {
      v.data = &kEmpty;  // validated: only zero-size arrays come without data
      return;
    }
    if (reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(dtype_size(v.dtype)) == 0)
      return;
    Tensor copy = Tensor::empty(v.shape, v.dtype);
    std::memcpy(copy.data(), v.data, static_cast<size_t>(copy.nbytes()));
    v.data = copy.data();
    copies_.push_back(std::move(copy));
  }
  void operator()(std::optional<TensorView>& v) {
    if (v) (*this)(*v);
  }
  void operator()(RNNInputs& in) { fields(in, in.init_state, in.mask); }
  void operator()(GRUInputs& in) { fields(in, in.init_state, in.mask, in.secondary_bias); }
  void operator()(LSTMInputs& in) { fields(in, in.init_state, in.init_cell, in.mask, in.peephole); }
  // Gradient inputs: the forward inputs (the base), then the gradient-only arrays.
  void operator()(RNNGradientInputs& in) { gradient_fields<RNNInputs>(in); }
  void operator()(LSTMGradientInputs& in) {
    gradient_fields<LSTMInputs>(in, in.cell_output_fwd, in.cell_gradient);
  }
  void operator()(GRUGradientInputs& in) { gradient_fields<GRUInputs>(in, in.output_fwd); }

 private:
  template <class In, class... Rest>
  void fields(In& in, Rest&... rest) {
    (*this)(in.source);
    (*this)(in.recurrent_weight);
    (*this)(in.input_weight);
    (*this)(in.bias);
    ((*this)(rest), ...);
  }
  template <class Forward, class In, class... Rest>
  void gradient_fields(In& in, Rest&... rest) {
    (*this)(static_cast<Forward&>(in));
    (*this)(in.source_gradient);
    (*this)(in.z_state);
    (*this)(in.state_gradient);
    ((*this)(rest), ...);
  }
  std::vector<Tensor> copies_;
};

// The inputs every op has, as the backends take them.
template <class In>
ForwardArrays common_arrays(const In& in) {
  ForwardArrays a;
  a.source = in.source.data;
  a.input_weight = opt_data(in.input_weight);
  a.recurrent_weight = in.recurrent_weight.data;
  a.bias = opt_data(in.bias);
  a.init_state = opt_data(in.init_state);
  if (in.mask) {
    a.mask = in.mask->data;
    a.mask_rows = in.mask->rank() == 2 ? in.mask->shape[0] : 1;
    a.mask_cols = in.mask->rank() >= 1 ? in.mask->shape.back() : 1;
  }
  return a;
}
ForwardArrays arrays(const RNNInputs& in) { return common_arrays(in); }
ForwardArrays arrays(const LSTMInputs& in) {
  ForwardArrays a = common_arrays(in);
  a.init_cell = opt_data(in.init_cell);
  a.peephole = opt_data(in.peephole);
  return a;
}
ForwardArrays arrays(const GRUInputs& in) {
  ForwardArrays a = common_arrays(in);
  a.secondary_bias = opt_data(in.secondary_bias);
  return a;
}

template <class In>
BackwardArrays gradient_arrays(const In& in) {
  BackwardArrays a;
  a.fwd = arrays(in);
  a.z_state = in.z_state.data;
  a.dy = in.source_gradient.data;
  a.dh_final = opt_data(in.state_gradient);
  if constexpr (std::is_same_v<In, LSTMGradientInputs>) {
    a.c_fwd = in.cell_output_fwd.data;
    if (in.cell_gradient)
      (in.cell_gradient->rank() == 2 ? a.dc_final : a.dc_steps) = in.cell_gradient->data;
  }
  if constexpr (std::is_same_v<In, GRUGradientInputs>) a.h_fwd = in.output_fwd.data;
  return a;
}

// One call, validated: its problem, its backend, and its inputs as the backend takes them.
template <class In>
struct Call {
  template <class Desc>
  Call(const In& given, const Desc& desc, Device device, bool gradients)
      : p(validate(given, desc)), be(backend_for(device, p, gradients)), in(given) {
    prepared(in);
  }
  const Problem p;
  Backend& be;
  In in;
  Prepared prepared;  // owns the aligned copies `in` may point to
};

bool empty_problem(const Problem& p) { return p.T == 0 || p.N == 0 || p.H == 0; }

// The lengths when some row is shorter than T; every row at full length is the op without
// lengths, bit for bit.
const int64_t* short_rows(const Problem& p, const std::optional<std::vector<int64_t>>& lengths) {
  if (!lengths) return nullptr;
  for (int64_t L : *lengths)
    if (L != p.T) return lengths->data();
  return nullptr;
}

// A backend's zero-size array may come without memory, and null is no memset/memcpy argument.
void fill_zeros(Tensor& t) {
  if (t.nbytes() > 0) std::memset(t.data(), 0, static_cast<size_t>(t.nbytes()));
}

void copy_into(std::optional<Tensor>& dst, const void* src) {
  if (dst && src && dst->nbytes() > 0)
    std::memcpy(dst->data(), src, static_cast<size_t>(dst->nbytes()));
}

struct Outputs {
  Tensor state;
  std::optional<Tensor> cell, z_state;
};

template <class In, class Desc>
Outputs run_forward(const In& given, const Desc& desc, Device device) {
  Call<In> call(given, desc, device, false);
  const Problem& p = call.p;
  Backend& be = call.be;
  const int64_t T = p.T, N = p.N, DH = p.dh();
  const int64_t* lengths = short_rows(p, call.in.sequence_lengths);
  // With lengths, every position past a row's length stays zero.
  const auto alloc = [&](const Shape& shape) {
    return lengths ? be.allocate_zeroed(shape, p.dtype) : be.allocate(shape, p.dtype);
  };
  Outputs out;
  out.state = alloc({T, N, DH});
  if (p.op == OpKind::Lstm && p.produce_cell) out.cell = alloc({T, N, DH});
  if (p.training) out.z_state = alloc({T, N, p.D * p.ZG * p.H});
  if (empty_problem(p)) return out;  // every output is empty
  ForwardArrays a = arrays(call.in);
  a.state = out.state.data();
  a.cell = out.cell ? out.cell->data() : nullptr;
  a.z_state = out.z_state ? out.z_state->data() : nullptr;
  if (lengths)
    forward_with_lengths(be, p, a, lengths);
  else
    be.forward(p, a);
  return out;
}

struct GradOutputs {
  Tensor source, recurrent_weight;
  std::optional<Tensor> input_weight, bias, init_state, init_cell, peephole, secondary_bias;
};

template <class In, class Desc>
GradOutputs run_backward(const In& given, const Desc& desc, Device device) {
  Call<In> call(given, desc, device, true);
  const Problem& p = call.p;
  Backend& be = call.be;
  BackwardArrays a = gradient_arrays(call.in);

  const int64_t N = p.N, H = p.H, D = p.D, DH = p.dh(), GH = p.gh();
  GradOutputs g;
  const auto make = [&](std::optional<Tensor>& t, bool wanted, const Shape& shape) -> void* {
    if (wanted) t = be.allocate(shape, p.dtype);
    return t ? t->data() : nullptr;
  };
  const int64_t* lengths = short_rows(p, call.in.sequence_lengths);
  // With lengths, the source gradient past each row's length stays zero.
  g.source = lengths ? be.allocate_zeroed(call.in.source.shape, p.dtype)
                     : be.allocate(call.in.source.shape, p.dtype);
  g.recurrent_weight = be.allocate(D == 2 ? Shape{2, GH, H} : Shape{GH, H}, p.dtype);
  a.dsource = g.source.data();
  a.dR = g.recurrent_weight.data();
  a.dW = make(g.input_weight, p.has_input_weight, {D * GH, p.I});
  a.dbias = make(g.bias, p.has_bias, {D * GH});
  a.dP = make(g.peephole, p.has_peephole, D == 2 ? Shape{2, 4 * H} : Shape{4 * H});
  a.dh0 = make(g.init_state, p.has_init_state, {N, DH});
  a.dc0 = make(g.init_cell, p.has_init_cell, {N, DH});
  a.db2 = make(g.secondary_bias, p.has_secondary_bias, {DH});

  if (empty_problem(p)) {
    // Nothing to propagate through: zeros, and the initial-state gradients are the final.
    for (Tensor* t : {&g.source, &g.recurrent_weight}) fill_zeros(*t);
    for (auto* t :
         {&g.input_weight, &g.bias, &g.peephole, &g.init_state, &g.init_cell, &g.secondary_bias})
      if (*t) fill_zeros(**t);
    copy_into(g.init_state, a.dh_final);
    copy_into(g.init_cell, a.dc_final);
    return g;
  }
  // A reset-before GRU ignores the secondary bias: its gradient stays zero.
  if (g.secondary_bias && !p.gru.reset_after) {
    fill_zeros(*g.secondary_bias);
    a.db2 = nullptr;
  }
  if (lengths)
    backward_with_lengths(be, p, a, lengths);
  else
    be.backward(p, a);
  return g;
}

// Runs one operation; allocation failures anywhere inside surface as OutOfMemoryError
// naming the operation (with the array's size and shape when the allocator knows them).
template <class F>
auto guarded(const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(std::string("[") + op + "] " + e.what());
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(std::string("[") + op + "] out of memory");
  }
}

}  // namespace
}  // namespace rnncore::detail

namespace rnncore {
using namespace detail;

RNNResults single_gate_rnn(const RNNInputs& given, const RNNDescriptor& desc, Device device) {
  return guarded("single_gate_rnn", [&]() -> RNNResults {
    Outputs o = run_forward(given, desc, device);
    return {std::move(o.state), std::move(o.z_state)};
  });
}

LSTMResults lstm(const LSTMInputs& given, const LSTMDescriptor& desc, Device device) {
  return guarded("lstm", [&]() -> LSTMResults {
    Outputs o = run_forward(given, desc, device);
    return {std::move(o.state), std::move(o.cell), std::move(o.z_state)};
  });
}

GRUResults gru(const GRUInputs& given, const GRUDescriptor& desc, Device device) {
  return guarded("gru", [&]() -> GRUResults {
    Outputs o = run_forward(given, desc, device);
    return {std::move(o.state), std::move(o.z_state)};
  });
}

RNNGradients single_gate_rnn_gradients(const RNNGradientInputs& given, const RNNDescriptor& desc,
                                       Device device) {
  return guarded("single_gate_rnn_gradients", [&]() -> RNNGradients {
    GradOutputs g = run_backward(given, desc, device);
    return {std::move(g.source), std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias), std::move(g.init_state)};
  });
}

LSTMGradients lstm_gradients(const LSTMGradientInputs& given, const LSTMDescriptor& desc,
                             Device device) {
  return guarded("lstm_gradients", [&]() -> LSTMGradients {
    GradOutputs g = run_backward(given, desc, device);
    return {std::move(g.source),   std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias),     std::move(g.peephole),         std::move(g.init_state),
            std::move(g.init_cell)};
  });
}

GRUGradients gru_gradients(const GRUGradientInputs& given, const GRUDescriptor& desc,
                           Device device) {
  return guarded("gru_gradients", [&]() -> GRUGradients {
    GradOutputs g = run_backward(given, desc, device);
    return {std::move(g.source), std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias),   std::move(g.init_state),       std::move(g.secondary_bias)};
  });
}

}  // namespace rnncore
