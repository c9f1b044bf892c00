// The wrapper of the contract ("How every forward operation is built"), once for every
// backend: project + bias, broadcast the mask, then per direction the core recurrence
// with its time flips, writing straight into the concatenated outputs.
#include "rnncore/ops.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "core/backend.hpp"
#include "core/validate.hpp"

namespace rnncore::detail {
namespace {

Backend& backend_for(Device device) {
  if (device == Device::Auto) device = default_device();
  switch (device) {
    case Device::Metal: return metal_backend();
    case Device::MetalEmulated: return emulated_backend();
    default: return cpu_backend();
  }
}

// The backend of `device` for problem p, refusing what it cannot compute (api.md: float64
// on Metal is a TypeError naming both).
Backend& backend_for(Device device, const Problem& p, bool gradients) {
  const std::string op = std::string(op_name(p.op)) + (gradients ? "_gradients" : "");
  Backend* found = nullptr;
  try {
    found = &backend_for(device);
  } catch (const DeviceError& e) {
    // "[device] 'metal' is not available: ..." as the operation's error.
    const std::string msg = e.what();
    throw DeviceError("[" + op + "]" + (msg.rfind("[device]", 0) == 0 ? msg.substr(8) : " " + msg));
  }
  Backend& be = *found;
  if (!be.computes(p.dtype))
    throw TypeError("[" + op + "] device '" + be.name() + "' computes " + be.dtypes() + ", not " +
                    dtype_name(p.dtype) + "; " +
                    (p.dtype == DType::Float16 ? "float16 is a storage type of device 'metal'"
                                               : "float64 is computed on device 'cpu'"));
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
  template <class In>
  void gradients(In& in) {
    (*this)(in.source_gradient);
    (*this)(in.z_state);
    (*this)(in.state_gradient);
  }

 private:
  template <class In, class... Rest>
  void fields(In& in, Rest&... rest) {
    (*this)(in.source);
    (*this)(in.recurrent_weight);
    (*this)(in.input_weight);
    (*this)(in.bias);
    ((*this)(rest), ...);
  }
  std::vector<Tensor> copies_;
};

template <class T>
void broadcast_mask(const TensorView& m, int64_t N, int64_t DH, T* out) {
  const T* src = m.ptr<T>();
  const int64_t rows = m.rank() == 2 ? m.shape[0] : 1;
  const int64_t cols = m.rank() >= 1 ? m.shape.back() : 1;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < DH; ++j)
      out[n * DH + j] = src[(rows == 1 ? 0 : n) * cols + (cols == 1 ? 0 : j)];
}

// The mask broadcast to [N, D*H] (the contract's first step for a mask), or nothing.
Tensor broadcast_mask(const Problem& p, const std::optional<TensorView>& m, Backend& be) {
  if (!p.has_mask) return Tensor();
  Tensor out = be.allocate({p.N, p.dh()}, p.dtype);
  if (p.dtype == DType::Float32)
    broadcast_mask(*m, p.N, p.dh(), out.ptr<float>());
  else
    broadcast_mask(*m, p.N, p.dh(), out.ptr<double>());
  return out;
}

// Pointers `elems` elements into an array of the problem's dtype; null stays null.
struct Offset {
  int64_t es;
  const void* operator()(const void* base, int64_t elems) const {
    return base ? static_cast<const char*>(base) + elems * es : nullptr;
  }
  void* operator()(std::optional<Tensor>& t, int64_t elems) const {
    return t ? static_cast<char*>(t->data()) + elems * es : nullptr;
  }
};

// Everything the wrapper needs from the inputs, independent of the op.
struct CommonInputs {
  const TensorView* source;
  const void* recurrent_weight;
  const void* input_weight;
  const void* bias;
  const void* init_state;
  const void* init_cell;
  const std::optional<TensorView>* mask;
  const void* peephole;
  const void* secondary_bias;
};

// The inputs as a whole-op backend takes them.
ForwardArrays forward_arrays(const CommonInputs& in) {
  ForwardArrays a{in.source->data,
                  in.input_weight,
                  in.recurrent_weight,
                  in.bias,
                  in.init_state,
                  in.init_cell,
                  opt_data(*in.mask),
                  1,
                  1,
                  in.peephole,
                  in.secondary_bias,
                  nullptr,
                  nullptr,
                  nullptr};
  if (in.mask->has_value()) {
    const TensorView& m = **in.mask;
    a.mask_rows = m.rank() == 2 ? m.shape[0] : 1;
    a.mask_cols = m.rank() >= 1 ? m.shape.back() : 1;
  }
  return a;
}

struct Outputs {
  Tensor state;
  std::optional<Tensor> cell, z_state;
};

Outputs run_forward(const Problem& p, const CommonInputs& in, Backend& be) {
  const int64_t T = p.T, N = p.N, H = p.H, D = p.D, DH = p.dh();
  const int64_t dgh = D * p.gh();
  Outputs out;
  out.state = be.allocate({T, N, DH}, p.dtype);
  if (p.op == OpKind::Lstm && p.produce_cell) out.cell = be.allocate({T, N, DH}, p.dtype);
  if (p.training) out.z_state = be.allocate({T, N, D * p.ZG * H}, p.dtype);
  if (T == 0 || N == 0 || H == 0) return out;

  ForwardArrays whole = forward_arrays(in);
  whole.state = out.state.data();
  whole.cell = out.cell ? out.cell->data() : nullptr;
  whole.z_state = out.z_state ? out.z_state->data() : nullptr;
  if (be.forward_whole(p, whole)) return out;

  const int64_t es = dtype_size(p.dtype);
  const void* xp = in.source->data;
  Tensor xbuf;
  if (p.has_input_weight || p.has_bias) {
    xbuf = be.allocate({T, N, dgh}, p.dtype);
    be.project(p, in.source->data, p.I, in.input_weight, in.bias, xbuf.data());
    xp = xbuf.data();
  }
  Tensor mask = broadcast_mask(p, *in.mask, be);
  const Offset off{es}, moff{es};
  DirectionForward dirs[2];
  for (int64_t d = 0; d < D; ++d) {
    DirectionForward& a = dirs[d];
    a.xp = off(xp, d * p.gh());
    a.xp_ld = dgh;
    a.R = off(in.recurrent_weight, d * p.gh() * H);
    a.h0 = off(in.init_state, d * H);
    a.h0_ld = DH;
    a.c0 = off(in.init_cell, d * H);
    a.c0_ld = DH;
    a.mask = p.has_mask ? off(mask.data(), d * H) : nullptr;
    a.mask_ld = DH;
    a.peephole = off(in.peephole, d * 4 * H);
    a.b2 = p.reset_after ? off(in.secondary_bias, d * H) : nullptr;
    a.y = static_cast<char*>(out.state.data()) + d * H * es;
    a.y_ld = DH;
    a.c = moff(out.cell, d * H);
    a.c_ld = DH;
    a.z = moff(out.z_state, d * p.ZG * H);
    a.z_ld = D * p.ZG * H;
    // Unidirectional reverse: read flipped, write in processing order. Backward half:
    // read flipped, write flipped back to input time.
    a.flip_in = d == 1 || p.reverse;
    a.flip_out = d == 1;
  }
  be.forward(p, dirs);
  return out;
}

struct CommonGradInputs {
  CommonInputs fwd;
  const void* dy;
  const void* z_state;
  const void* h_fwd;
  const void* c_fwd;
  const void* state_gradient;
  const std::optional<TensorView>* cell_gradient;
};

struct GradOutputs {
  Tensor source, recurrent_weight;
  std::optional<Tensor> input_weight, bias, init_state, init_cell, peephole, secondary_bias;
};

// Whole-op backends write every output themselves, so they get device memory for all.
bool whole_op_backward(const Problem& p, const CommonGradInputs& in, Backend& be, GradOutputs& g) {
  if (!be.runs_whole_ops()) return false;
  BackwardArrays a;
  a.fwd = forward_arrays(in.fwd);
  a.z_state = in.z_state;
  a.h_fwd = in.h_fwd;
  a.c_fwd = in.c_fwd;
  a.dy = in.dy;
  a.dh_final = in.state_gradient;
  if (in.cell_gradient->has_value()) {
    const TensorView& c = **in.cell_gradient;
    (c.rank() == 2 ? a.dc_final : a.dc_steps) = c.data;
  }
  const auto device = [&](std::optional<Tensor>& t) {
    if (t) t = be.allocate(t->shape(), p.dtype);
    return t ? t->data() : nullptr;
  };
  Tensor source = be.allocate(in.fwd.source->shape, p.dtype);
  Tensor recurrent = be.allocate(g.recurrent_weight.shape(), p.dtype);
  a.dsource = source.data();
  a.dR = recurrent.data();
  a.dW = device(g.input_weight);
  a.dbias = device(g.bias);
  a.dh0 = g.init_state ? g.init_state->data() : nullptr;
  a.dc0 = g.init_cell ? g.init_cell->data() : nullptr;
  a.dP = device(g.peephole);
  // A reset-before GRU ignores the secondary bias: its gradient stays zero.
  if (g.secondary_bias && p.reset_after) a.db2 = device(g.secondary_bias);
  if (!be.backward_whole(p, a)) return false;
  g.source = std::move(source);
  g.recurrent_weight = std::move(recurrent);
  return true;
}

GradOutputs run_backward(const Problem& p, const CommonGradInputs& in, Backend& be,
                         bool want_secondary_bias) {
  const int64_t T = p.T, N = p.N, H = p.H, D = p.D, DH = p.dh(), GH = p.gh();
  const int64_t dgh = D * GH;
  const int64_t es = dtype_size(p.dtype);
  GradOutputs g;
  g.recurrent_weight = Tensor::zeros(D == 2 ? Shape{2, GH, H} : Shape{GH, H}, p.dtype);
  if (p.has_input_weight) g.input_weight = Tensor::zeros({dgh, p.I}, p.dtype);
  if (p.has_bias) g.bias = Tensor::zeros({dgh}, p.dtype);
  if (p.has_peephole) g.peephole = Tensor::zeros(D == 2 ? Shape{2, 4 * H} : Shape{4 * H}, p.dtype);
  if (want_secondary_bias) g.secondary_bias = Tensor::zeros({DH}, p.dtype);

  const bool final_cell = in.cell_gradient->has_value() && (*in.cell_gradient)->rank() == 2;
  // With nothing to propagate through, the initial-state gradients are the final ones.
  auto passthrough = [&](const void* src, std::optional<Tensor>& dst) {
    dst = Tensor::zeros({N, DH}, p.dtype);
    if (src) std::memcpy(dst->data(), src, static_cast<size_t>(dst->nbytes()));
  };
  if (T == 0 || N == 0 || H == 0) {
    g.source = Tensor::zeros(in.fwd.source->shape, p.dtype);
    if (p.has_init_state) passthrough(in.state_gradient, g.init_state);
    if (p.has_init_cell) passthrough(final_cell ? (*in.cell_gradient)->data : nullptr, g.init_cell);
    return g;
  }
  if (p.has_init_state) g.init_state = be.allocate({N, DH}, p.dtype);
  if (p.has_init_cell) g.init_cell = be.allocate({N, DH}, p.dtype);

  if (whole_op_backward(p, in, be, g)) return g;

  Tensor mask = broadcast_mask(p, *in.fwd.mask, be);
  // dX' of every step; without an input weight it is the source gradient itself.
  Tensor dxp = be.allocate({T, N, dgh}, p.dtype);
  const Offset off{es}, moff{es};
  DirectionBackward dirs[2];
  for (int64_t d = 0; d < D; ++d) {
    DirectionBackward& a = dirs[d];
    a.z = off(in.z_state, d * p.ZG * H);
    a.z_ld = D * p.ZG * H;
    a.h_fwd = off(in.h_fwd, d * H);
    a.h_fwd_ld = DH;
    a.c_fwd = off(in.c_fwd, d * H);
    a.c_fwd_ld = DH;
    a.R = off(in.fwd.recurrent_weight, d * GH * H);
    a.h0 = off(in.fwd.init_state, d * H);
    a.h0_ld = DH;
    a.c0 = off(in.fwd.init_cell, d * H);
    a.c0_ld = DH;
    a.mask = p.has_mask ? off(mask.data(), d * H) : nullptr;
    a.mask_ld = DH;
    a.peephole = off(in.fwd.peephole, d * 4 * H);
    a.dy = off(in.dy, d * H);
    a.dy_ld = DH;
    a.dh_final = off(in.state_gradient, d * H);
    a.dh_final_ld = DH;
    if (in.cell_gradient->has_value()) {
      if (final_cell) {
        a.dc_final = off((*in.cell_gradient)->data, d * H);
        a.dc_final_ld = DH;
      } else {
        a.dc_steps = off((*in.cell_gradient)->data, d * H);
        a.dc_steps_ld = DH;
      }
    }
    a.dxp = static_cast<char*>(dxp.data()) + d * GH * es;
    a.dxp_ld = dgh;
    a.dR = static_cast<char*>(g.recurrent_weight.data()) + d * GH * H * es;
    a.dP = moff(g.peephole, d * 4 * H);
    a.db2 = p.reset_after ? moff(g.secondary_bias, d * H) : nullptr;
    a.dh0 = moff(g.init_state, d * H);
    a.dh0_ld = DH;
    a.dc0 = moff(g.init_cell, d * H);
    a.dc0_ld = DH;
    a.flip_in = d == 1 || p.reverse;
    a.flip_out = d == 1;
  }
  be.backward(p, dirs);

  if (p.has_input_weight) g.source = be.allocate(in.fwd.source->shape, p.dtype);
  be.input_gradients(p, dxp.data(), in.fwd.source->data, in.fwd.input_weight,
                     p.has_input_weight ? g.source.data() : nullptr,
                     g.input_weight ? g.input_weight->data() : nullptr,
                     g.bias ? g.bias->data() : nullptr);
  if (!p.has_input_weight) g.source = std::move(dxp);
  return g;
}

}  // namespace
}  // namespace rnncore::detail

namespace rnncore::detail {
namespace {

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
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, false);
    RNNInputs in = given;
    Prepared prepared;
    prepared(in);
    CommonInputs ci{&in.source,
                    in.recurrent_weight.data,
                    opt_data(in.input_weight),
                    opt_data(in.bias),
                    opt_data(in.init_state),
                    nullptr,
                    &in.mask,
                    nullptr,
                    nullptr};
    Outputs o = run_forward(p, ci, be);
    return {std::move(o.state), std::move(o.z_state)};
  });
}

LSTMResults lstm(const LSTMInputs& given, const LSTMDescriptor& desc, Device device) {
  return guarded("lstm", [&]() -> LSTMResults {
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, false);
    LSTMInputs in = given;
    Prepared prepared;
    prepared(in);
    CommonInputs ci{&in.source,        in.recurrent_weight.data, opt_data(in.input_weight),
                    opt_data(in.bias), opt_data(in.init_state),  opt_data(in.init_cell),
                    &in.mask,          opt_data(in.peephole),    nullptr};
    Outputs o = run_forward(p, ci, be);
    return {std::move(o.state), std::move(o.cell), std::move(o.z_state)};
  });
}

GRUResults gru(const GRUInputs& given, const GRUDescriptor& desc, Device device) {
  return guarded("gru", [&]() -> GRUResults {
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, false);
    GRUInputs in = given;
    Prepared prepared;
    prepared(in);
    CommonInputs ci{&in.source,
                    in.recurrent_weight.data,
                    opt_data(in.input_weight),
                    opt_data(in.bias),
                    opt_data(in.init_state),
                    nullptr,
                    &in.mask,
                    nullptr,
                    opt_data(in.secondary_bias)};
    Outputs o = run_forward(p, ci, be);
    return {std::move(o.state), std::move(o.z_state)};
  });
}

RNNGradients single_gate_rnn_gradients(const RNNGradientInputs& given, const RNNDescriptor& desc,
                                       Device device) {
  return guarded("single_gate_rnn_gradients", [&]() -> RNNGradients {
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, true);
    RNNGradientInputs in = given;
    Prepared prepared;
    prepared(in);
    prepared.gradients(in);
    static const std::optional<TensorView> none;
    CommonGradInputs ci{
        {&in.source, in.recurrent_weight.data, opt_data(in.input_weight), opt_data(in.bias),
         opt_data(in.init_state), nullptr, &in.mask, nullptr, nullptr},
        in.source_gradient.data,
        in.z_state.data,
        nullptr,
        nullptr,
        opt_data(in.state_gradient),
        &none};
    GradOutputs g = run_backward(p, ci, be, false);
    return {std::move(g.source), std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias), std::move(g.init_state)};
  });
}

LSTMGradients lstm_gradients(const LSTMGradientInputs& given, const LSTMDescriptor& desc,
                             Device device) {
  return guarded("lstm_gradients", [&]() -> LSTMGradients {
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, true);
    LSTMGradientInputs in = given;
    Prepared prepared;
    prepared(in);
    prepared.gradients(in);
    prepared(in.cell_output_fwd);
    prepared(in.cell_gradient);
    CommonGradInputs ci{
        {&in.source, in.recurrent_weight.data, opt_data(in.input_weight), opt_data(in.bias),
         opt_data(in.init_state), opt_data(in.init_cell), &in.mask, opt_data(in.peephole), nullptr},
        in.source_gradient.data,
        in.z_state.data,
        nullptr,
        in.cell_output_fwd.data,
        opt_data(in.state_gradient),
        &in.cell_gradient};
    GradOutputs g = run_backward(p, ci, be, false);
    return {std::move(g.source),   std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias),     std::move(g.peephole),         std::move(g.init_state),
            std::move(g.init_cell)};
  });
}

GRUGradients gru_gradients(const GRUGradientInputs& given, const GRUDescriptor& desc,
                           Device device) {
  return guarded("gru_gradients", [&]() -> GRUGradients {
    const Problem p = validate(given, desc);
    Backend& be = backend_for(device, p, true);
    GRUGradientInputs in = given;
    Prepared prepared;
    prepared(in);
    prepared.gradients(in);
    prepared(in.output_fwd);
    static const std::optional<TensorView> none;
    CommonGradInputs ci{
        {&in.source, in.recurrent_weight.data, opt_data(in.input_weight), opt_data(in.bias),
         opt_data(in.init_state), nullptr, &in.mask, nullptr, opt_data(in.secondary_bias)},
        in.source_gradient.data,
        in.z_state.data,
        in.output_fwd.data,
        nullptr,
        opt_data(in.state_gradient),
        &none};
    GradOutputs g = run_backward(p, ci, be, p.has_secondary_bias);
    return {std::move(g.source), std::move(g.recurrent_weight), std::move(g.input_weight),
            std::move(g.bias),   std::move(g.init_state),       std::move(g.secondary_bias)};
  });
}

}  // namespace rnncore
