// The Metal backend (see backend.hpp): float32 and float16; every op, forward or gradients,
// is one plan, run as one submission.
#include "metal/backend.hpp"

#include <memory>
#include <mutex>
#include <unordered_map>

#include "rnncore/error.hpp"

namespace rnncore::metal {
namespace {

using detail::Problem;

class MetalBackend final : public detail::Backend {
 public:
  explicit MetalBackend(Executor& e) : executor_(e) {}
  const char* name() const override { return executor_.name(); }
  const char* dtypes() const override { return "float32 and float16"; }
  bool computes(DType d) const override { return d == DType::Float32 || d == DType::Float16; }
  void admit(const Problem& p, bool gradients) const override { check_extents(p, gradients); }

  Tensor allocate(const Shape& shape, DType dtype) override {
    return executor_.allocate(shape, dtype);
  }

  void forward(const Problem& p, const detail::ForwardArrays& a) override {
    const Plan plan = plan_forward(p, MaskShape{a.mask_rows, a.mask_cols});
    HostArrays arrays = inputs(a);
    const auto put = [&](Buffer b, const void* data) { arrays[static_cast<int>(b)] = data; };
    put(Buffer::State, a.state);
    put(Buffer::Cell, a.cell);
    put(Buffer::ZState, a.z_state);
    executor_.run(plan, arrays);
  }

  void backward(const Problem& p, const detail::BackwardArrays& a) override {
    GradientShape gs;
    gs.mask = MaskShape{a.fwd.mask_rows, a.fwd.mask_cols};
    gs.dh_final = a.dh_final != nullptr;
    gs.dc_final = a.dc_final != nullptr;
    gs.dc_steps = a.dc_steps != nullptr;
    gs.want_db2 = a.db2 != nullptr;
    const Plan plan = plan_gradients(p, gs);
    HostArrays arrays = inputs(a.fwd);
    const auto put = [&](Buffer b, const void* data) { arrays[static_cast<int>(b)] = data; };
    put(Buffer::ZState, a.z_state);
    put(Buffer::StateFwd, a.h_fwd);
    put(Buffer::CellFwd, a.c_fwd);
    put(Buffer::SourceGradient, a.dy);
    put(Buffer::StateGradient, a.dh_final);
    put(Buffer::CellGradient, a.dc_final ? a.dc_final : a.dc_steps);
    put(Buffer::DSource, a.dsource);
    put(Buffer::DRecurrentWeight, a.dR);
    put(Buffer::DInputWeight, a.dW);
    put(Buffer::DBias, a.dbias);
    put(Buffer::DInitState, a.dh0);
    put(Buffer::DInitCell, a.dc0);
    put(Buffer::DPeephole, a.dP);
    put(Buffer::DSecondaryBias, a.db2);
    executor_.run(plan, arrays);
  }

 private:
  static HostArrays inputs(const detail::ForwardArrays& a) {
    HostArrays arrays{};
    const auto put = [&](Buffer b, const void* data) { arrays[static_cast<int>(b)] = data; };
    put(Buffer::Source, a.source);
    put(Buffer::InputWeight, a.input_weight);
    put(Buffer::RecurrentWeight, a.recurrent_weight);
    put(Buffer::Bias, a.bias);
    put(Buffer::InitState, a.init_state);
    put(Buffer::InitCell, a.init_cell);
    put(Buffer::Mask, a.mask);
    put(Buffer::Peephole, a.peephole);
    put(Buffer::SecondaryBias, a.secondary_bias);
    return arrays;
  }

  Executor& executor_;
};

}  // namespace

detail::Backend& backend_on(Executor& executor) {
  static std::mutex mutex;
  static std::unordered_map<Executor*, std::unique_ptr<MetalBackend>> backends;
  std::lock_guard<std::mutex> lock(mutex);
  auto& b = backends[&executor];
  if (!b) b = std::make_unique<MetalBackend>(executor);
  return *b;
}

}  // namespace rnncore::metal
