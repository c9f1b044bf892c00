// The Metal backend (see backend.hpp): float32, float16 and (macOS 14) bfloat16; every op, forward
// or gradients, is one plan, run as one submission.
#include "metal/backend.hpp"

#include <initializer_list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "rnncore/error.hpp"

namespace rnncore::metal {
namespace {

using detail::Problem;

class MetalBackend final : public detail::Backend {
 public:
  explicit MetalBackend(Executor& e) : executor_(e) {}
  const char* name() const override { return executor_.name(); }
  const char* dtypes() const override {
    return executor_.computes_bfloat16() ? "float32, float16 and bfloat16" : "float32 and float16";
  }
  bool computes(DType d) const override {
    return d == DType::Float32 || d == DType::Float16 ||
           (d == DType::BFloat16 && executor_.computes_bfloat16());
  }
  void admit(const Problem& p, bool gradients) const override { check_extents(p, gradients); }

  Tensor allocate(const Shape& shape, DType dtype) override {
    return executor_.allocate(shape, dtype);
  }

  void forward(const Problem& p, const detail::ForwardArrays& a) override {
    const Plan plan = plan_forward(p, MaskShape{a.mask_rows, a.mask_cols});
    executor_.run(plan, with(inputs(a), {{Buffer::State, a.state},
                                         {Buffer::Cell, a.cell},
                                         {Buffer::ZState, a.z_state}}));
  }

  void backward(const Problem& p, const detail::BackwardArrays& a) override {
    GradientShape gs;
    gs.mask = MaskShape{a.fwd.mask_rows, a.fwd.mask_cols};
    gs.dh_final = a.dh_final != nullptr;
    gs.dc_final = a.dc_final != nullptr;
    gs.dc_steps = a.dc_steps != nullptr;
    gs.want_db2 = a.db2 != nullptr;
    const Plan plan = plan_gradients(p, gs);
    const void* cell_gradient = a.dc_final ? a.dc_final : a.dc_steps;
    executor_.run(plan, with(inputs(a.fwd), {{Buffer::ZState, a.z_state},
                                             {Buffer::StateFwd, a.h_fwd},
                                             {Buffer::CellFwd, a.c_fwd},
                                             {Buffer::SourceGradient, a.dy},
                                             {Buffer::StateGradient, a.dh_final},
                                             {Buffer::CellGradient, cell_gradient},
                                             {Buffer::DSource, a.dsource},
                                             {Buffer::DRecurrentWeight, a.dR},
                                             {Buffer::DInputWeight, a.dW},
                                             {Buffer::DBias, a.dbias},
                                             {Buffer::DInitState, a.dh0},
                                             {Buffer::DInitCell, a.dc0},
                                             {Buffer::DPeephole, a.dP},
                                             {Buffer::DSecondaryBias, a.db2}}));
  }

 private:
  // `arrays` with each (buffer, pointer) of `items` set.
  static HostArrays with(HostArrays arrays,
                         std::initializer_list<std::pair<Buffer, const void*>> items) {
    for (const auto& [b, data] : items) arrays[static_cast<int>(b)] = data;
    return arrays;
  }

  // The caller's forward inputs, where the plan's buffers of the same names live.
  static HostArrays inputs(const detail::ForwardArrays& a) {
    return with(HostArrays{}, {{Buffer::Source, a.source},
                               {Buffer::InputWeight, a.input_weight},
                               {Buffer::RecurrentWeight, a.recurrent_weight},
                               {Buffer::Bias, a.bias},
                               {Buffer::InitState, a.init_state},
                               {Buffer::InitCell, a.init_cell},
                               {Buffer::Mask, a.mask},
                               {Buffer::Peephole, a.peephole},
                               {Buffer::SecondaryBias, a.secondary_bias}});
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
