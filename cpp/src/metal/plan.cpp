// Plans of the forward ops (see plan.hpp). The kernels index with 32-bit ints, so every
// array must have fewer than 2^31 elements; larger shapes are refused here, by name.
#include "metal/plan.hpp"

#include <cstring>
#include <limits>

#include "kernel_params.h"
#include "rnncore/error.hpp"

namespace rnncore::metal {
namespace k = rnncore::kernels;
using detail::OpKind;
using detail::Problem;

const char* buffer_name(Buffer b) {
  static const char* names[kBufferCount] = {
      "source", "input_weight", "recurrent_weight", "bias",   "init_state",
      "init_cell", "mask",      "peephole",         "secondary_bias", "state",
      "cell", "z_state", "projected (workspace)", "cell (workspace)", "step (workspace)"};
  return names[static_cast<int>(b)];
}

bool is_output(Buffer b) { return b == Buffer::State || b == Buffer::Cell || b == Buffer::ZState; }

bool is_workspace(Buffer b) {
  return b == Buffer::Projected || b == Buffer::CellScratch || b == Buffer::StepScratch;
}

std::string Dispatch::pipeline_key() const {
  std::string key = kernel;
  for (const FunctionConstant& c : constants)
    key += ";" + std::to_string(c.index) + "=" + std::to_string(c.value);
  return key;
}

namespace {

constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();
constexpr int64_t kF32 = 4;

template <class Params>
BytesArg bytes_of(uint32_t index, const Params& params) {
  BytesArg b{index, std::vector<uint8_t>(sizeof(Params))};
  std::memcpy(b.data.data(), &params, sizeof(Params));
  return b;
}

uint64_t ceil_div(int64_t a, int64_t b) { return static_cast<uint64_t>((a + b - 1) / b); }

// Smallest batch tile of the step kernels that covers min(N, 8) rows.
int batch_tile(int64_t N) { return N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 : 8; }

void set(Plan& plan, Buffer b, int64_t elements) {
  plan.sizes[static_cast<int>(b)] = elements * kF32;
}

}  // namespace

Plan plan_forward(const Problem& p, const MaskShape& mask) {
  const int64_t T = p.T, N = p.N, H = p.H, D = p.D, G = p.G, DH = D * H, DGH = D * G * H;
  const int64_t K = p.has_input_weight ? p.I : DGH;
  const bool project = p.has_input_weight || p.has_bias;
  const bool lstm = p.op == OpKind::Lstm, gru = p.op == OpKind::Gru;
  const bool reset_before = gru && !p.reset_after;
  const char* op = detail::op_name(p.op);

  struct Extent {
    const char* what;
    int64_t elements;
  };
  const Extent extents[] = {{"source", T * N * K},
                            {"the projected input", T * N * DGH},
                            {"recurrent_weight", DGH * H},
                            {"input_weight", DGH * K},
                            {"z_state", T * N * D * p.ZG * H}};
  for (const Extent& e : extents)
    if (e.elements > kMaxElements)
      throw ValueError(std::string("[") + op + "] device 'metal': " + e.what + " would have " +
                       std::to_string(e.elements) + " elements; the Metal kernels index at most " +
                       std::to_string(kMaxElements) + " (use device='cpu')");

  Plan plan;
  set(plan, Buffer::Source, T * N * K);
  set(plan, Buffer::RecurrentWeight, DGH * H);
  if (p.has_input_weight) set(plan, Buffer::InputWeight, DGH * K);
  if (p.has_bias) set(plan, Buffer::Bias, DGH);
  if (p.has_init_state) set(plan, Buffer::InitState, N * DH);
  if (p.has_init_cell) set(plan, Buffer::InitCell, N * DH);
  if (p.has_mask) set(plan, Buffer::Mask, mask.rows * mask.cols);
  if (p.has_peephole) set(plan, Buffer::Peephole, D * 4 * H);
  if (gru && p.reset_after && p.has_secondary_bias) set(plan, Buffer::SecondaryBias, DH);
  set(plan, Buffer::State, T * N * DH);
  if (lstm) set(plan, p.produce_cell ? Buffer::Cell : Buffer::CellScratch, T * N * DH);
  if (p.training) set(plan, Buffer::ZState, T * N * D * p.ZG * H);
  if (project) set(plan, Buffer::Projected, T * N * DGH);
  if (reset_before) set(plan, Buffer::StepScratch, 2 * N * DH);
  if (T == 0 || N == 0 || H == 0) return plan;

  if (project) {
    Dispatch d;
    d.kernel = "projection_f32";
    d.constants = {{k::FC_HAS_WEIGHT, FunctionConstant::Type::Bool, p.has_input_weight},
                   {k::FC_HAS_BIAS, FunctionConstant::Type::Bool, p.has_bias}};
    d.buffers.push_back({k::PB_X, Buffer::Source, 0});
    if (p.has_input_weight) d.buffers.push_back({k::PB_W, Buffer::InputWeight, 0});
    if (p.has_bias) d.buffers.push_back({k::PB_BIAS, Buffer::Bias, 0});
    d.buffers.push_back({k::PB_Y, Buffer::Projected, 0});
    const k::ProjectionParams params{int32_t(T * N), int32_t(K), int32_t(DGH),
                                     int32_t(K),     int32_t(K), int32_t(DGH)};
    d.bytes.push_back(bytes_of(k::PB_PARAMS, params));
    d.threadgroup_memory = (k::GEMM_TILE_M + k::GEMM_TILE_N) * k::GEMM_TILE_K * kF32;
    d.threadgroups = {ceil_div(DGH, k::GEMM_TILE_N), ceil_div(T * N, k::GEMM_TILE_M), 1};
    d.threads = {k::GEMM_THREADS, 1, 1};
    plan.dispatches.push_back(std::move(d));
  }

  // Everything but the step number is the same for every step.
  Dispatch step;
  using B = FunctionConstant::Type;
  const auto act = [&](int g) { return g < G ? static_cast<int32_t>(p.gate_act[g]) : 0; };
  const bool has_b2 = gru && p.reset_after && p.has_secondary_bias;
  step.constants = {{k::FC_HAS_INIT_STATE, B::Bool, p.has_init_state},
                    {k::FC_HAS_INIT_CELL, B::Bool, lstm && p.has_init_cell},
                    {k::FC_HAS_MASK, B::Bool, p.has_mask},
                    {k::FC_HAS_PEEPHOLE, B::Bool, lstm && p.has_peephole},
                    {k::FC_HAS_SECONDARY_BIAS, B::Bool, has_b2},
                    {k::FC_TRAINING, B::Bool, p.training},
                    {k::FC_FLIP_Z, B::Bool, gru && p.flip_z},
                    {k::FC_HAS_CELL, B::Bool, lstm},
                    {k::FC_HAS_WORKSPACE, B::Bool, reset_before},
                    {k::FC_ACT_0, B::Int, act(0)},
                    {k::FC_ACT_1, B::Int, act(1)},
                    {k::FC_ACT_2, B::Int, act(2)},
                    {k::FC_ACT_3, B::Int, act(3)},
                    {k::FC_CELL_ACT, B::Int, static_cast<int32_t>(p.cell_act)},
                    {k::FC_GATE_A, B::Int, int32_t(lstm ? p.lstm_i : gru ? p.gru_z : 0)},
                    {k::FC_GATE_B, B::Int, int32_t(lstm ? p.lstm_f : gru ? p.gru_r : 0)},
                    {k::FC_GATE_C, B::Int, int32_t(lstm ? p.lstm_z : 0)},
                    {k::FC_GATE_D, B::Int, int32_t(lstm ? p.lstm_o : 0)}};
  step.buffers.push_back({k::SB_XP, project ? Buffer::Projected : Buffer::Source, 0});
  step.buffers.push_back({k::SB_R, Buffer::RecurrentWeight, 0});
  if (p.has_init_state) step.buffers.push_back({k::SB_H0, Buffer::InitState, 0});
  if (lstm && p.has_init_cell) step.buffers.push_back({k::SB_C0, Buffer::InitCell, 0});
  if (p.has_mask) step.buffers.push_back({k::SB_MASK, Buffer::Mask, 0});
  if (lstm && p.has_peephole) step.buffers.push_back({k::SB_PEEPHOLE, Buffer::Peephole, 0});
  if (has_b2) step.buffers.push_back({k::SB_B2, Buffer::SecondaryBias, 0});
  step.buffers.push_back({k::SB_Y, Buffer::State, 0});
  if (lstm)
    step.buffers.push_back({k::SB_C, p.produce_cell ? Buffer::Cell : Buffer::CellScratch, 0});
  if (p.training) step.buffers.push_back({k::SB_Z, Buffer::ZState, 0});
  if (reset_before) step.buffers.push_back({k::SB_WS, Buffer::StepScratch, 0});
  const int nb = batch_tile(N);
  step.threadgroups = {ceil_div(H, k::STEP_SIMDGROUPS), ceil_div(N, nb), uint64_t(D)};
  step.threads = {uint64_t(k::STEP_SIMDGROUPS) * k::SIMD_WIDTH, 1, 1};

  const std::string tile = "_b" + std::to_string(nb) + "_f32";
  std::vector<std::string> kernels;
  if (p.op == OpKind::Rnn) kernels = {"rnn_step" + tile};
  if (lstm) kernels = {"lstm_step" + tile};
  if (gru && p.reset_after) kernels = {"gru_step" + tile};
  if (reset_before) kernels = {"gru_gates" + tile, "gru_candidate" + tile};

  k::StepParams params{};
  params.T = int32_t(T);
  params.N = int32_t(N);
  params.H = int32_t(H);
  params.reverse = D == 1 && p.reverse;
  params.xp_ld = int32_t(DGH);
  params.y_ld = int32_t(DH);
  params.z_ld = int32_t(D * p.ZG * H);
  // The mask broadcasts to [N, D*H]: a dimension of size 1 gets stride 0.
  params.mask_rs = int32_t(mask.rows == 1 ? 0 : mask.cols);
  params.mask_cs = int32_t(mask.cols == 1 ? 0 : 1);
  for (int64_t s = 0; s < T; ++s) {
    params.step = int32_t(s);
    for (const std::string& name : kernels) {
      Dispatch d = step;
      d.kernel = name;
      d.bytes.push_back(bytes_of(k::SB_PARAMS, params));
      plan.dispatches.push_back(std::move(d));
    }
  }
  return plan;
}

void check_limits(const Plan& plan) {
  for (size_t i = 0; i < plan.dispatches.size(); ++i) {
    const Dispatch& d = plan.dispatches[i];
    const std::string where = "[metal plan] dispatch " + std::to_string(i) + " (" + d.kernel + "): ";
    if (d.threadgroup_memory > Limits::max_threadgroup_memory)
      throw Error(where + "threadgroup memory " + std::to_string(d.threadgroup_memory) +
                  " bytes exceeds " + std::to_string(Limits::max_threadgroup_memory));
    const uint64_t threads = d.threads.volume();
    if (threads == 0 || threads > Limits::max_threads_per_threadgroup)
      throw Error(where + std::to_string(threads) + " threads per threadgroup (1.." +
                  std::to_string(Limits::max_threads_per_threadgroup) + " allowed)");
    if (d.threadgroups.volume() == 0 ||
        d.threadgroups.x > std::numeric_limits<uint32_t>::max() ||
        d.threadgroups.y > std::numeric_limits<uint32_t>::max() ||
        d.threadgroups.z > std::numeric_limits<uint32_t>::max())
      throw Error(where + "grid of " + std::to_string(d.threadgroups.x) + " x " +
                  std::to_string(d.threadgroups.y) + " x " + std::to_string(d.threadgroups.z) +
                  " threadgroups is empty or too large");
    for (const BytesArg& b : d.bytes)
      if (b.data.size() >= Limits::max_set_bytes)
        throw Error(where + "setBytes payload of " + std::to_string(b.data.size()) +
                    " bytes at index " + std::to_string(b.index) + " (under 4 KiB allowed)");
    for (const Binding& b : d.buffers) {
      if (b.offset % Limits::buffer_offset_alignment != 0)
        throw Error(where + "offset " + std::to_string(b.offset) + " of " + buffer_name(b.buffer) +
                    " is not " + std::to_string(Limits::buffer_offset_alignment) + "-byte aligned");
      // An empty array (I = 0) is bound at offset 0; the executor puts a placeholder there.
      const bool empty_ok = plan.size(b.buffer) == 0 && b.offset == 0;
      if (!empty_ok && b.offset >= plan.size(b.buffer))
        throw Error(where + "binds " + buffer_name(b.buffer) + " at offset " +
                    std::to_string(b.offset) + " but the plan gives it " +
                    std::to_string(plan.size(b.buffer)) + " bytes");
    }
  }
}

}  // namespace rnncore::metal
