// The wrapper of the contract ("How every forward operation is built"), once for every
// backend: project + bias, broadcast the mask, then per direction the core recurrence
// with its time flips, writing straight into the concatenated outputs.
#include <cstring>

#include "core/backend.hpp"
#include "core/validate.hpp"
#include "rnncore/ops.hpp"

namespace rnncore::detail {
namespace {

Backend& backend_for(Device device) {
  if (device == Device::Auto) device = default_device();
  switch (device) {
    case Device::Metal: return metal_backend();
    default: return cpu_backend();
  }
}

const void* opt_data(const std::optional<TensorView>& v) { return v ? v->data : nullptr; }

template <class T>
void broadcast_mask(const TensorView& m, int64_t N, int64_t DH, T* out) {
  const T* src = m.ptr<T>();
  const int64_t rows = m.rank() == 2 ? m.shape[0] : 1;
  const int64_t cols = m.rank() >= 1 ? m.shape.back() : 1;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < DH; ++j)
      out[n * DH + j] = src[(rows == 1 ? 0 : n) * cols + (cols == 1 ? 0 : j)];
}

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

  const int64_t es = dtype_size(p.dtype);
  const void* xp = in.source->data;
  Tensor xbuf;
  if (p.has_input_weight || p.has_bias) {
    xbuf = be.allocate({T, N, dgh}, p.dtype);
    be.project(p, in.source->data, p.I, in.input_weight, in.bias, xbuf.data());
    xp = xbuf.data();
  }
  Tensor mask;
  if (p.has_mask) {
    mask = be.allocate({N, DH}, p.dtype);
    if (p.dtype == DType::Float32)
      broadcast_mask(**in.mask, N, DH, mask.ptr<float>());
    else
      broadcast_mask(**in.mask, N, DH, mask.ptr<double>());
  }

  auto off = [es](const void* base, int64_t elems) -> const void* {
    return base ? static_cast<const char*>(base) + elems * es : nullptr;
  };
  auto moff = [es](std::optional<Tensor>& t, int64_t elems) -> void* {
    return t ? static_cast<char*>(t->data()) + elems * es : nullptr;
  };
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

}  // namespace
}  // namespace rnncore::detail

namespace rnncore {
using namespace detail;

RNNResults single_gate_rnn(const RNNInputs& in, const RNNDescriptor& desc, Device device) {
  const Problem p = validate(in, desc);
  Backend& be = backend_for(device);
  CommonInputs ci{&in.source, in.recurrent_weight.data, opt_data(in.input_weight),
                  opt_data(in.bias), opt_data(in.init_state), nullptr, &in.mask,
                  nullptr, nullptr};
  Outputs o = run_forward(p, ci, be);
  return {std::move(o.state), std::move(o.z_state)};
}

LSTMResults lstm(const LSTMInputs& in, const LSTMDescriptor& desc, Device device) {
  const Problem p = validate(in, desc);
  Backend& be = backend_for(device);
  CommonInputs ci{&in.source, in.recurrent_weight.data, opt_data(in.input_weight),
                  opt_data(in.bias), opt_data(in.init_state), opt_data(in.init_cell),
                  &in.mask, opt_data(in.peephole), nullptr};
  Outputs o = run_forward(p, ci, be);
  return {std::move(o.state), std::move(o.cell), std::move(o.z_state)};
}

GRUResults gru(const GRUInputs& in, const GRUDescriptor& desc, Device device) {
  const Problem p = validate(in, desc);
  Backend& be = backend_for(device);
  CommonInputs ci{&in.source, in.recurrent_weight.data, opt_data(in.input_weight),
                  opt_data(in.bias), opt_data(in.init_state), nullptr, &in.mask,
                  nullptr, opt_data(in.secondary_bias)};
  Outputs o = run_forward(p, ci, be);
  return {std::move(o.state), std::move(o.z_state)};
}

}  // namespace rnncore
