// The plans of the forward and gradient ops (see plan.hpp). The kernels index with 32-bit
// ints, so every array must have fewer than 2^31 elements; larger shapes are refused here,
// by name.
#include "metal/plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernel_params.h"
#include "rnncore/error.hpp"

namespace rnncore::metal {
namespace k = rnncore::kernels;
using detail::OpKind;
using detail::Problem;

const char* buffer_name(Buffer b) {
  static const char* names[kBufferCount] = {"source",
                                            "input_weight",
                                            "recurrent_weight",
                                            "bias",
                                            "init_state",
                                            "init_cell",
                                            "mask",
                                            "peephole",
                                            "secondary_bias",
                                            "state",
                                            "cell",
                                            "z_state",
                                            "output_fwd",
                                            "cell_output_fwd",
                                            "source_gradient",
                                            "state_gradient",
                                            "cell_gradient",
                                            "gradient of source",
                                            "gradient of input_weight",
                                            "gradient of recurrent_weight",
                                            "gradient of bias",
                                            "gradient of init_state",
                                            "gradient of init_cell",
                                            "gradient of peephole",
                                            "gradient of secondary_bias",
                                            "projected input (workspace)",
                                            "cell (workspace)",
                                            "step (workspace)",
                                            "R^T (workspace)",
                                            "dX' (workspace)",
                                            "h~ (workspace)",
                                            "r * h~ (workspace)",
                                            "R deltas (workspace)",
                                            "carry (workspace)",
                                            "previous cell (workspace)",
                                            "partial sums (workspace)"};
  return names[static_cast<int>(b)];
}

bool is_workspace(Buffer b) { return b >= Buffer::Projected; }

std::string Dispatch::pipeline_key() const {
  std::string key = kernel;
  for (const FunctionConstant& c : constants)
    key += ";" + std::to_string(c.index) + "=" + std::to_string(c.value);
  return key;
}

namespace {

constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();
constexpr int64_t kF32 = 4;  // threadgroup memory is float32 whatever the storage type

// Kernel-name suffix of the storage type.
const char* suffix(DType d) {
  return d == DType::Float16 ? "f16" : d == DType::BFloat16 ? "bf16" : "f32";
}

template <class Params>
BytesArg bytes_of(uint32_t index, const Params& params) {
  BytesArg b{index, std::vector<uint8_t>(sizeof(Params))};
  std::memcpy(b.data.data(), &params, sizeof(Params));
  return b;
}

uint64_t ceil_div(int64_t a, int64_t b) { return static_cast<uint64_t>((a + b - 1) / b); }

// Smallest batch tile of the step kernels that covers min(N, 16) rows: larger tiles read R
// fewer times a step (once per tile), smaller ones waste no lanes at small N.
int batch_tile(int64_t N) { return N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 : N <= 8 ? 8 : 16; }

// The grid of the (forward and gradient) step kernels, batch tiles along x (threadgroups
// that share R's rows run together); returns their name suffix "_b<tile>_<dtype>".
std::string set_step_grid(const Problem& p, Dispatch& d) {
  const int nb = batch_tile(p.N);
  d.threadgroups = {ceil_div(p.N, nb), ceil_div(p.H, k::STEP_SIMDGROUPS), uint64_t(p.D)};
  d.threads = {uint64_t(k::STEP_SIMDGROUPS) * k::SIMD_WIDTH, 1, 1};
  // The staged rows of the batch tile (state, or deltas), STEP_CHUNK columns at a time.
  d.threadgroup_memory = uint32_t(nb * k::STEP_CHUNK * kF32);
  return "_b" + std::to_string(nb) + "_" + suffix(p.dtype);
}

// ---- persistent kernels ----------------------------------------------------------------------
// One threadgroup of up to 32 simdgroups (one per hidden unit) loops over the steps inside the
// kernel: a step then costs a few threadgroup barriers instead of a dispatch (5 us or so), which
// wins where a step is a few threadgroups' work. The per-step grid a persistent threadgroup
// walks each step has ceil(N / tile) * ceil(H / simdgroups) * D positions; the plans take the
// persistent kernels up to kPersistentWalk of them. RNNCORE_METAL_PERSISTENT=always|never
// overrides the choice (the tests run both kinds of kernel at every shape).
constexpr int64_t kPersistentSimdgroups = 32;
constexpr int64_t kPersistentWalk = 2;
constexpr int64_t kPersistentMaxTile = 8;  // the persistent kernels' instances: tiles 1..8
// Steps per persistent dispatch, so that no dispatch of a long sequence runs near the GPU
// watchdog (a step of a problem this small takes microseconds).
constexpr int64_t kPersistentSteps = 1024;

int persistent_tile(int64_t N) { return std::min<int>(batch_tile(N), kPersistentMaxTile); }

bool use_persistent(const Problem& p) {
  const char* env = std::getenv("RNNCORE_METAL_PERSISTENT");
  const std::string mode = env ? env : "";
  if (mode == "always") return true;
  if (mode == "never") return false;
  if (!mode.empty() && mode != "auto")
    throw ValueError("RNNCORE_METAL_PERSISTENT is '" + mode +
                     "'; expected 'auto' (the default), 'always' or 'never'");
  const int64_t sgs = std::min(kPersistentSimdgroups, p.H);
  const int64_t walk =
      int64_t(ceil_div(p.N, persistent_tile(p.N))) * int64_t(ceil_div(p.H, sgs)) * p.D;
  return p.N <= kPersistentMaxTile && walk <= kPersistentWalk;
}

// The persistent dispatches of `name` ("<op>_persistent") for steps first, first + direction,
// ... (count of them), kPersistentSteps per dispatch; `step` has the buffers and constants.
void add_persistent(Plan& plan, const Problem& p, const Dispatch& step, const std::string& name,
                    uint32_t params_index, k::StepParams params, int64_t first, int64_t count,
                    int direction) {
  const int nb = persistent_tile(p.N);
  Dispatch d = step;
  d.kernel = name + "_b" + std::to_string(nb) + "_" + suffix(p.dtype);
  d.threadgroups = {1, 1, 1};
  d.threads = {uint64_t(std::min(kPersistentSimdgroups, p.H) * k::SIMD_WIDTH), 1, 1};
  d.adapts_threads = true;
  d.threadgroup_memory = uint32_t(nb * k::STEP_CHUNK * kF32);
  for (int64_t done = 0; done < count; done += kPersistentSteps) {
    params.step = int32_t(first + direction * done);
    params.steps = int32_t(std::min(kPersistentSteps, count - done));
    Dispatch one = d;
    one.bytes.push_back(bytes_of(params_index, params));
    plan.dispatches.push_back(std::move(one));
  }
}

// The sizes and strides every (forward or gradient) step kernel reads; the step number is
// set per dispatch.
k::StepParams step_params(const Problem& p, const MaskShape& mask) {
  k::StepParams params{};
  params.T = int32_t(p.T);
  params.N = int32_t(p.N);
  params.H = int32_t(p.H);
  params.reverse = p.D == 1 && p.reverse;
  params.xp_ld = int32_t(p.D * p.G * p.H);
  params.y_ld = int32_t(p.D * p.H);
  params.z_ld = int32_t(p.D * p.ZG * p.H);
  // The mask broadcasts to [N, D*H]: a dimension of size 1 gets stride 0.
  params.mask_rs = int32_t(mask.rows == 1 ? 0 : mask.cols);
  params.mask_cs = int32_t(mask.cols == 1 ? 0 : 1);
  params.steps = 1;
  return params;
}

// The gate layout as function constants: activations by block position, the cell
// activation, and the block positions of the gates (LSTM i, f, z, o; GRU z, r).
void append_gate_constants(const Problem& p, std::vector<FunctionConstant>& c) {
  using B = FunctionConstant::Type;
  const bool lstm = p.op == OpKind::Lstm, gru = p.op == OpKind::Gru;
  for (int g = 0; g < 4; ++g)
    c.push_back(
        {uint32_t(k::FC_ACT_0 + g), B::Int, g < p.G ? static_cast<int32_t>(p.gate_act[g]) : 0});
  c.push_back({k::FC_CELL_ACT, B::Int, static_cast<int32_t>(p.cell_act)});
  c.push_back({k::FC_GATE_A, B::Int, int32_t(lstm ? p.lstm_i : gru ? p.gru_z : 0)});
  c.push_back({k::FC_GATE_B, B::Int, int32_t(lstm ? p.lstm_f : gru ? p.gru_r : 0)});
  c.push_back({k::FC_GATE_C, B::Int, int32_t(lstm ? p.lstm_z : 0)});
  c.push_back({k::FC_GATE_D, B::Int, int32_t(lstm ? p.lstm_o : 0)});
}

void set(Plan& plan, Buffer b, int64_t elements, int64_t element_size = 0) {
  if (element_size == 0) element_size = plan.element_size;
  plan.sizes[static_cast<int>(b)] = elements * element_size;
  plan.element_sizes[static_cast<int>(b)] = element_size;
}

// The kernel-name letter of a buffer's element type.
char letter(const Plan& plan, Buffer b) {
  if (plan.element_sizes[static_cast<int>(b)] == 4) return 'f';
  return plan.storage == DType::BFloat16 ? 'b' : 'h';
}

int64_t byte_offset(const Plan& plan, Buffer b, int64_t elements) {
  return elements * plan.element_sizes[static_cast<int>(b)];
}

// A buffer the plan writes.
void set_out(Plan& plan, Buffer b, int64_t elements, int64_t element_size = 0) {
  set(plan, b, elements, element_size);
  plan.writes[static_cast<int>(b)] = true;
}

// A buffer and an element offset into it; `used` false for an absent operand.
struct Operand {
  Buffer buffer = Buffer::Source;
  int64_t elements = 0;
  bool used = false;
  Operand() = default;
  Operand(Buffer b, int64_t offset) : buffer(b), elements(offset), used(true) {}
};

// C = A B (+ bias) over `batches` grid slices (see GemmParams).
Dispatch gemm(const Plan& plan, Operand a, Operand b, Operand bias, Operand c,
              const k::GemmParams& g, uint64_t batches) {
  Dispatch d;
  // gemm_<A><B><C> by element type; without B the copy takes C's type for it.
  d.kernel = std::string("gemm_") + letter(plan, a.buffer) +
             letter(plan, b.used ? b.buffer : c.buffer) + letter(plan, c.buffer);
  d.constants = {{k::FC_HAS_WEIGHT, FunctionConstant::Type::Bool, b.used},
                 {k::FC_HAS_BIAS, FunctionConstant::Type::Bool, bias.used}};
  d.buffers.push_back({k::GB_A, a.buffer, byte_offset(plan, a.buffer, a.elements)});
  if (b.used) d.buffers.push_back({k::GB_B, b.buffer, byte_offset(plan, b.buffer, b.elements)});
  if (bias.used)
    d.buffers.push_back({k::GB_BIAS, bias.buffer, byte_offset(plan, bias.buffer, bias.elements)});
  d.buffers.push_back({k::GB_C, c.buffer, byte_offset(plan, c.buffer, c.elements)});
  d.bytes.push_back(bytes_of(k::GB_PARAMS, g));
  // The staged K slices of A and B, then the C tile.
  d.threadgroup_memory =
      std::max(k::GEMM_TILE_M + k::GEMM_TILE_N, k::GEMM_TILE_M * k::GEMM_TILE_N / k::GEMM_TILE_K) *
      k::GEMM_TILE_K * kF32;
  d.threadgroups = {ceil_div(g.N, k::GEMM_TILE_N), ceil_div(g.M, k::GEMM_TILE_M), batches};
  d.threads = {k::GEMM_THREADS, 1, 1};
  return d;
}

// out[z][c] = sum_r A[z][r, c] (* S[z][r, c % s_mod]), one pass: column_sums_<type of out>.
// (A and the scale are float32 intermediates.)
Dispatch column_sums(const Plan& plan, Operand a, Operand scale, Operand out,
                     const k::ColumnSumParams& c, uint64_t batches, uint64_t row_blocks = 1) {
  Dispatch d;
  d.kernel =
      std::string("column_sums_") +
      suffix(plan.element_sizes[static_cast<int>(out.buffer)] == 4 ? DType::Float32 : plan.storage);
  d.constants = {{k::FC_HAS_SCALE, FunctionConstant::Type::Bool, scale.used}};
  d.buffers.push_back({k::CB_A, a.buffer, byte_offset(plan, a.buffer, a.elements)});
  if (scale.used)
    d.buffers.push_back({k::CB_S, scale.buffer, byte_offset(plan, scale.buffer, scale.elements)});
  d.buffers.push_back({k::CB_OUT, out.buffer, byte_offset(plan, out.buffer, out.elements)});
  d.bytes.push_back(bytes_of(k::CB_PARAMS, c));
  d.threadgroups = {ceil_div(c.cols, k::GEMM_THREADS), row_blocks, batches};
  d.threads = {k::GEMM_THREADS, 1, 1};
  return d;
}

// The reductions after the gradient loop have few output tiles (a bias gradient: 3 threadgroups
// of columns for 3H = 768) but long sums (T*N rows, or K = T*N for dR and dW): they are split
// so that a dispatch has about kFillThreadgroups threadgroups (a few per core of the largest
// GPUs), each block kMinBlock rows (or K) at least, into float32 partials that a second pass
// adds up.
constexpr int64_t kFillThreadgroups = 64;
constexpr int64_t kMinBlock = 128;

// Grows the partials workspace to at least `elements` floats (one buffer, reused: the
// dispatches run in order).
void need_partials(Plan& plan, int64_t elements) {
  const int i = static_cast<int>(Buffer::Partials);
  if (plan.sizes[i] < elements * kF32) set_out(plan, Buffer::Partials, elements, kF32);
}

// The column sums as one pass, or as row blocks then a pass over their partials.
void reduce_columns(Plan& plan, Operand a, Operand scale, Operand out, k::ColumnSumParams c,
                    uint64_t batches) {
  const int64_t tgs = int64_t(ceil_div(c.cols, k::GEMM_THREADS)) * int64_t(batches);
  const int64_t blocks =
      std::min<int64_t>(ceil_div(kFillThreadgroups, tgs), ceil_div(c.rows, kMinBlock));
  if (blocks <= 1) {
    plan.dispatches.push_back(column_sums(plan, a, scale, out, c, batches));
    return;
  }
  const int64_t block = int64_t(ceil_div(c.rows, blocks));
  const int64_t used = int64_t(ceil_div(c.rows, block));
  need_partials(plan, int64_t(batches) * used * c.cols);
  k::ColumnSumParams first = c;
  first.row_block = int32_t(block), first.out_ys = c.cols, first.out_zs = int32_t(used * c.cols);
  plan.dispatches.push_back(
      column_sums(plan, a, scale, {Buffer::Partials, 0}, first, batches, uint64_t(used)));
  k::ColumnSumParams second{};
  second.rows = int32_t(used), second.cols = c.cols, second.lda = c.cols, second.s_mod = 1;
  second.a_zs = int32_t(used * c.cols), second.out_zs = c.out_zs;
  plan.dispatches.push_back(column_sums(plan, {Buffer::Partials, 0}, {}, out, second, batches));
}

// C = A B over `batches` slices, C contiguous (ldc = N): split along K into float32 partials
// (then summed by reduce_columns) when the output has few tiles and K is long.
void gemm_split(Plan& plan, Operand a, Operand b, Operand c, const k::GemmParams& g,
                uint64_t batches) {
  const int64_t tiles =
      int64_t(ceil_div(g.M, k::GEMM_TILE_M) * ceil_div(g.N, k::GEMM_TILE_N) * batches);
  int64_t splits = std::min<int64_t>(ceil_div(kFillThreadgroups, tiles), ceil_div(g.K, kMinBlock));
  if (splits <= 1 || g.ldc != g.N) {
    plan.dispatches.push_back(gemm(plan, a, b, {}, c, g, batches));
    return;
  }
  const int64_t k_per = int64_t(ceil_div(ceil_div(g.K, splits), k::GEMM_TILE_K)) * k::GEMM_TILE_K;
  splits = int64_t(ceil_div(g.K, k_per));
  const int64_t mn = int64_t(g.M) * g.N;
  need_partials(plan, int64_t(batches) * splits * mn);
  k::GemmParams part = g;
  part.splits = int32_t(splits), part.k_per = int32_t(k_per), part.c_ss = int32_t(mn);
  part.c_zs = int32_t(splits * mn);
  plan.dispatches.push_back(
      gemm(plan, a, b, {}, {Buffer::Partials, 0}, part, batches * uint64_t(splits)));
  k::ColumnSumParams sum{};
  sum.rows = int32_t(splits), sum.cols = int32_t(mn), sum.lda = int32_t(mn), sum.s_mod = 1;
  sum.a_zs = int32_t(splits * mn), sum.out_zs = g.c_zs;
  plan.dispatches.push_back(column_sums(plan, {Buffer::Partials, 0}, {}, c, sum, batches));
}

}  // namespace

void check_extents(const Problem& p, bool gradients) {
  const int64_t TN = p.T * p.N, DGH = p.D * p.G * p.H, K = p.has_input_weight ? p.I : DGH;
  const std::string op = std::string(detail::op_name(p.op)) + (gradients ? "_gradients" : "");
  const std::pair<const char*, int64_t> extents[] = {
      {"source", TN * K},
      {gradients ? "the projected-input gradient" : "the projected input", TN * DGH},
      {"recurrent_weight", DGH * p.H},
      {"input_weight", DGH * K},
      {"z_state", TN * p.D * p.ZG * p.H}};
  for (const auto& [what, elements] : extents)
    if (elements > kMaxElements)
      throw ValueError("[" + op + "] device 'metal': " + what + " would have " +
                       std::to_string(elements) + " elements; the Metal kernels index at most " +
                       std::to_string(kMaxElements) + " (use device='cpu')");
}

Plan plan_forward(const Problem& p, const MaskShape& mask) {
  const int64_t T = p.T, N = p.N, H = p.H, D = p.D, G = p.G, DH = D * H, DGH = D * G * H;
  const int64_t K = p.has_input_weight ? p.I : DGH;
  const bool project = p.has_input_weight || p.has_bias;
  const bool lstm = p.op == OpKind::Lstm, gru = p.op == OpKind::Gru;
  const bool reset_before = gru && !p.gru.reset_after;

  check_extents(p, false);

  Plan plan;
  plan.storage = p.dtype;
  plan.element_size = dtype_size(p.dtype);
  set(plan, Buffer::Source, T * N * K);
  set(plan, Buffer::RecurrentWeight, DGH * H);
  if (p.has_input_weight) set(plan, Buffer::InputWeight, DGH * K);
  if (p.has_bias) set(plan, Buffer::Bias, DGH);
  if (p.has_init_state) set(plan, Buffer::InitState, N * DH);
  if (p.has_init_cell) set(plan, Buffer::InitCell, N * DH);
  if (p.has_mask) set(plan, Buffer::Mask, mask.rows * mask.cols);
  if (p.has_peephole) set(plan, Buffer::Peephole, D * 4 * H);
  if (gru && p.gru.reset_after && p.has_secondary_bias) set(plan, Buffer::SecondaryBias, DH);
  set_out(plan, Buffer::State, T * N * DH);
  if (lstm) set_out(plan, p.produce_cell ? Buffer::Cell : Buffer::CellScratch, T * N * DH);
  if (p.training) set_out(plan, Buffer::ZState, T * N * D * p.ZG * H);
  if (project) set_out(plan, Buffer::Projected, T * N * DGH);
  if (reset_before) set_out(plan, Buffer::StepScratch, 2 * N * DH);
  if (T == 0 || N == 0 || H == 0) return plan;

  if (project) {
    // x' [T*N, DGH] = source [T*N, K] W^T (W is [DGH, K]) + bias; or source + bias.
    k::GemmParams g{};
    g.M = int32_t(T * N), g.N = int32_t(DGH), g.K = int32_t(K);
    g.a_rs = int32_t(K), g.a_cs = 1, g.b_rs = 1, g.b_cs = int32_t(K), g.ldc = int32_t(DGH);
    plan.dispatches.push_back(gemm(
        plan, {Buffer::Source, 0}, p.has_input_weight ? Operand{Buffer::InputWeight, 0} : Operand{},
        p.has_bias ? Operand{Buffer::Bias, 0} : Operand{}, {Buffer::Projected, 0}, g, 1));
  }

  // Everything but the step number is the same for every step.
  Dispatch step;
  using B = FunctionConstant::Type;
  const bool has_b2 = gru && p.gru.reset_after && p.has_secondary_bias;
  step.constants = {{k::FC_HAS_INIT_STATE, B::Bool, p.has_init_state},
                    {k::FC_HAS_INIT_CELL, B::Bool, lstm && p.has_init_cell},
                    {k::FC_HAS_MASK, B::Bool, p.has_mask},
                    {k::FC_HAS_PEEPHOLE, B::Bool, lstm && p.has_peephole},
                    {k::FC_HAS_SECONDARY_BIAS, B::Bool, has_b2},
                    {k::FC_TRAINING, B::Bool, p.training},
                    {k::FC_FLIP_Z, B::Bool, gru && p.gru.flip_z},
                    {k::FC_HAS_CELL, B::Bool, lstm},
                    {k::FC_HAS_WORKSPACE, B::Bool, reset_before}};
  append_gate_constants(p, step.constants);
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
  auto params = step_params(p, mask);
  if (use_persistent(p)) {
    const char* name = p.op == OpKind::Rnn ? "rnn_persistent"
                       : lstm              ? "lstm_persistent"
                       : reset_before      ? "gru_rb_persistent"
                                           : "gru_persistent";
    add_persistent(plan, p, step, name, k::SB_PARAMS, params, 0, T, 1);
    return plan;
  }
  const std::string tile = set_step_grid(p, step);
  std::vector<std::string> kernels;
  if (p.op == OpKind::Rnn) kernels = {"rnn_step" + tile};
  if (lstm) kernels = {"lstm_step" + tile};
  if (gru && p.gru.reset_after) kernels = {"gru_step" + tile};
  if (reset_before) kernels = {"gru_gates" + tile, "gru_candidate" + tile};

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
    const std::string where =
        "[metal plan] dispatch " + std::to_string(i) + " (" + d.kernel + "): ";
    if (d.threadgroup_memory > Limits::max_threadgroup_memory)
      throw Error(where + "threadgroup memory " + std::to_string(d.threadgroup_memory) +
                  " bytes exceeds " + std::to_string(Limits::max_threadgroup_memory));
    const uint64_t threads = d.threads.volume();
    if (threads == 0 || threads > Limits::max_threads_per_threadgroup)
      throw Error(where + std::to_string(threads) + " threads per threadgroup (1.." +
                  std::to_string(Limits::max_threads_per_threadgroup) + " allowed)");
    if (d.threadgroups.volume() == 0 || d.threadgroups.x > std::numeric_limits<uint32_t>::max() ||
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
      const int64_t es = plan.element_sizes[static_cast<int>(b.buffer)];
      if (es > 0 && b.offset % es != 0)
        throw Error(where + "offset " + std::to_string(b.offset) + " of " + buffer_name(b.buffer) +
                    " is not a multiple of its element size " + std::to_string(es));
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

namespace rnncore::metal {

Plan plan_gradients(const Problem& p, const GradientShape& gs) {
  const int64_t T = p.T, N = p.N, H = p.H, D = p.D, G = p.G, GH = G * H, DH = D * H, DGH = D * GH,
                TN = T * N;
  const bool W = p.has_input_weight;
  const int64_t K = W ? p.I : DGH;
  const bool lstm = p.op == OpKind::Lstm, gru = p.op == OpKind::Gru;
  const bool reset_before = gru && !p.gru.reset_after, reset_after = gru && p.gru.reset_after;
  const bool peephole = lstm && p.has_peephole, init_cell = lstm && p.has_init_cell;
  check_extents(p, true);

  Plan plan;
  plan.storage = p.dtype;
  plan.element_size = dtype_size(p.dtype);
  set(plan, Buffer::Source, TN * K);
  set(plan, Buffer::RecurrentWeight, DGH * H);
  if (W) set(plan, Buffer::InputWeight, DGH * K);
  if (p.has_init_state) set(plan, Buffer::InitState, N * DH);
  if (init_cell) set(plan, Buffer::InitCell, N * DH);
  if (p.has_mask) set(plan, Buffer::Mask, gs.mask.rows * gs.mask.cols);
  if (peephole) set(plan, Buffer::Peephole, D * 4 * H);
  set(plan, Buffer::ZState, TN * D * p.ZG * H);
  if (gru) set(plan, Buffer::StateFwd, TN * DH);
  if (lstm) set(plan, Buffer::CellFwd, TN * DH);
  set(plan, Buffer::SourceGradient, TN * DH);
  if (gs.dh_final) set(plan, Buffer::StateGradient, N * DH);
  if (gs.dc_final) set(plan, Buffer::CellGradient, N * DH);
  if (gs.dc_steps) set(plan, Buffer::CellGradient, TN * DH);

  set_out(plan, Buffer::DRecurrentWeight, DGH * H);
  set_out(plan, Buffer::DSource, TN * K);
  if (W) set_out(plan, Buffer::DInputWeight, DGH * K);
  if (p.has_bias) set_out(plan, Buffer::DBias, DGH);
  if (p.has_init_state) set_out(plan, Buffer::DInitState, N * DH);
  if (init_cell) set_out(plan, Buffer::DInitCell, N * DH);
  if (peephole) set_out(plan, Buffer::DPeephole, D * 4 * H);
  if (gs.want_db2) set_out(plan, Buffer::DSecondaryBias, DH);
  // The steps' intermediates are float32 (kF32) whatever the storage type. Without an input
  // weight dX' is the source gradient itself, unless it must be narrowed to the storage type.
  const bool dxp_is_dsource = !W && p.dtype == DType::Float32;
  set_out(plan, Buffer::RecurrentT, DGH * H);
  if (!dxp_is_dsource) set_out(plan, Buffer::DProjected, TN * DGH, kF32);
  set_out(plan, Buffer::HTilde, TN * DH, kF32);
  if (reset_before) set_out(plan, Buffer::UInput, TN * DH, kF32);
  if (reset_after) set_out(plan, Buffer::RDelta, TN * DGH, kF32);
  set_out(plan, Buffer::Carry, 3 * N * DH, kF32);
  if (peephole) set_out(plan, Buffer::CellPrev, TN * DH, kF32);
  if (T == 0 || N == 0 || H == 0) return plan;
  const Buffer dxp = dxp_is_dsource ? Buffer::DSource : Buffer::DProjected;

  {  // R^T per direction, for the steps' products with R.
    Dispatch d;
    d.kernel = std::string("transpose_") + suffix(p.dtype);
    d.buffers = {{k::TB_IN, Buffer::RecurrentWeight, 0}, {k::TB_OUT, Buffer::RecurrentT, 0}};
    const k::TransposeParams t{int32_t(GH), int32_t(H), int32_t(GH * H)};
    d.bytes.push_back(bytes_of(k::TB_PARAMS, t));
    d.threadgroups = {ceil_div(GH * H, k::GEMM_THREADS), 1, uint64_t(D)};
    d.threads = {k::GEMM_THREADS, 1, 1};
    plan.dispatches.push_back(std::move(d));
  }

  Dispatch step;
  using B = FunctionConstant::Type;
  step.constants = {{k::FC_HAS_INIT_STATE, B::Bool, p.has_init_state},
                    {k::FC_HAS_INIT_CELL, B::Bool, init_cell},
                    {k::FC_HAS_MASK, B::Bool, p.has_mask},
                    {k::FC_HAS_PEEPHOLE, B::Bool, peephole},
                    {k::FC_FLIP_Z, B::Bool, gru && p.gru.flip_z},
                    {k::FC_HAS_DH_FINAL, B::Bool, gs.dh_final},
                    {k::FC_HAS_DC_FINAL, B::Bool, gs.dc_final},
                    {k::FC_HAS_DC_STEPS, B::Bool, gs.dc_steps},
                    {k::FC_WANT_DH0, B::Bool, p.has_init_state},
                    {k::FC_WANT_DC0, B::Bool, init_cell},
                    {k::FC_HAS_HFWD, B::Bool, gru},
                    {k::FC_HAS_CFWD, B::Bool, lstm},
                    {k::FC_HAS_RDELTA, B::Bool, reset_after},
                    {k::FC_HAS_U, B::Bool, reset_before}};
  append_gate_constants(p, step.constants);
  const auto bind = [&](uint32_t index, Buffer b) { step.buffers.push_back({index, b, 0}); };
  bind(k::BB_RT, Buffer::RecurrentT);
  bind(k::BB_Z, Buffer::ZState);
  if (gru) bind(k::BB_HFWD, Buffer::StateFwd);
  if (lstm) bind(k::BB_CFWD, Buffer::CellFwd);
  if (p.has_init_state) bind(k::BB_H0, Buffer::InitState);
  if (init_cell) bind(k::BB_C0, Buffer::InitCell);
  if (p.has_mask) bind(k::BB_MASK, Buffer::Mask);
  if (peephole) bind(k::BB_PEEPHOLE, Buffer::Peephole);
  bind(k::BB_DY, Buffer::SourceGradient);
  if (gs.dh_final) bind(k::BB_DH_FINAL, Buffer::StateGradient);
  if (gs.dc_final) bind(k::BB_DC_FINAL, Buffer::CellGradient);
  if (gs.dc_steps) bind(k::BB_DC_STEPS, Buffer::CellGradient);
  bind(k::BB_DXP, dxp);
  if (reset_after) bind(k::BB_RDELTA, Buffer::RDelta);
  bind(k::BB_HTILDE, Buffer::HTilde);
  if (reset_before) bind(k::BB_U, Buffer::UInput);
  bind(k::BB_CARRY, Buffer::Carry);
  if (peephole) bind(k::BB_CPREV, Buffer::CellPrev);
  if (p.has_init_state) bind(k::BB_DH0, Buffer::DInitState);
  if (init_cell) bind(k::BB_DC0, Buffer::DInitCell);
  auto params = step_params(p, gs.mask);
  if (use_persistent(p)) {  // steps T-1 down to -1
    const char* name = p.op == OpKind::Rnn ? "rnn_backward_persistent"
                       : lstm              ? "lstm_backward_persistent"
                       : reset_before      ? "gru_rb_backward_persistent"
                                           : "gru_backward_persistent";
    add_persistent(plan, p, step, name, k::BB_PARAMS, params, T - 1, T + 1, -1);
  } else {
    const std::string tile = set_step_grid(p, step);
    std::vector<std::string> kernels;
    if (p.op == OpKind::Rnn) kernels = {"rnn_backward" + tile};
    if (lstm) kernels = {"lstm_backward" + tile};
    if (reset_after) kernels = {"gru_backward" + tile};
    if (reset_before) kernels = {"gru_backward_zo" + tile, "gru_backward_r" + tile};
    for (int64_t s = T - 1; s >= -1; --s) {
      params.step = int32_t(s);
      // Step -1 only carries the last deltas into the initial-state gradients.
      const size_t count = s < 0 ? 1 : kernels.size();
      for (size_t i = 0; i < count; ++i) {
        Dispatch d = step;
        d.kernel = kernels[i];
        d.bytes.push_back(bytes_of(k::BB_PARAMS, params));
        plan.dispatches.push_back(std::move(d));
      }
    }
  }

  // dR[d] = delta^T V over all steps: V = h~, or r * h~ for a reset-before candidate's rows.
  const Buffer delta = reset_after ? Buffer::RDelta : dxp;
  const auto weight_gradient = [&](int64_t row0, int64_t rows, Buffer v) {
    k::GemmParams g{};
    g.M = int32_t(rows), g.N = int32_t(H), g.K = int32_t(TN);
    g.a_rs = 1, g.a_cs = int32_t(DGH), g.a_zs = int32_t(GH);
    g.b_rs = int32_t(DH), g.b_cs = 1, g.b_zs = int32_t(H);
    g.ldc = int32_t(H), g.c_zs = int32_t(GH * H);
    gemm_split(plan, {delta, row0}, {v, 0}, {Buffer::DRecurrentWeight, row0 * H}, g, uint64_t(D));
  };
  if (reset_before) {
    weight_gradient(0, 2 * H, Buffer::HTilde);
    weight_gradient(2 * H, H, Buffer::UInput);
  } else {
    weight_gradient(0, GH, Buffer::HTilde);
  }

  if (W && K > 0) {
    k::GemmParams g{};  // dsource [TN, I] = dX' [TN, DGH] W [DGH, I]
    g.M = int32_t(TN), g.N = int32_t(K), g.K = int32_t(DGH);
    g.a_rs = int32_t(DGH), g.a_cs = 1, g.b_rs = int32_t(K), g.b_cs = 1, g.ldc = int32_t(K);
    plan.dispatches.push_back(
        gemm(plan, {dxp, 0}, {Buffer::InputWeight, 0}, {}, {Buffer::DSource, 0}, g, 1));
    k::GemmParams w{};  // dW [DGH, I] = dX'^T source
    w.M = int32_t(DGH), w.N = int32_t(K), w.K = int32_t(TN);
    w.a_rs = 1, w.a_cs = int32_t(DGH), w.b_rs = int32_t(K), w.b_cs = 1, w.ldc = int32_t(K);
    gemm_split(plan, {dxp, 0}, {Buffer::Source, 0}, {Buffer::DInputWeight, 0}, w, 1);
  }
  if (!W && !dxp_is_dsource) {  // dsource = dX', converted to the storage type
    k::GemmParams g{};
    g.M = int32_t(TN), g.N = int32_t(DGH), g.K = int32_t(DGH);
    g.a_rs = int32_t(DGH), g.a_cs = 1, g.ldc = int32_t(DGH);
    plan.dispatches.push_back(gemm(plan, {dxp, 0}, {}, {}, {Buffer::DSource, 0}, g, 1));
  }
  if (p.has_bias) {
    k::ColumnSumParams c{};
    c.rows = int32_t(TN), c.cols = int32_t(DGH), c.lda = int32_t(DGH), c.s_mod = 1;
    reduce_columns(plan, {dxp, 0}, {}, {Buffer::DBias, 0}, c, 1);
  }
  if (gs.want_db2) {  // the secondary bias sits inside q: its gradient sums dq
    k::ColumnSumParams c{};
    c.rows = int32_t(TN), c.cols = int32_t(H), c.lda = int32_t(DGH), c.s_mod = 1;
    c.a_zs = int32_t(GH), c.out_zs = int32_t(H);
    reduce_columns(plan, {Buffer::RDelta, 2 * H}, {}, {Buffer::DSecondaryBias, 0}, c, uint64_t(D));
  }
  if (peephole) {  // dP[g, u] = sum over steps and rows of da_g[u] * c_prev[u]
    k::ColumnSumParams c{};
    c.rows = int32_t(TN), c.cols = int32_t(4 * H), c.lda = int32_t(DGH);
    c.lds = int32_t(DH), c.s_mod = int32_t(H);
    c.a_zs = int32_t(GH), c.s_zs = int32_t(H), c.out_zs = int32_t(4 * H);
    reduce_columns(plan, {dxp, 0}, {Buffer::CellPrev, 0}, {Buffer::DPeephole, 0}, c, uint64_t(D));
  }
  return plan;
}

}  // namespace rnncore::metal
