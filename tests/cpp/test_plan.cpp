// The Metal plan layer, checked without running anything: which dispatches an op gets,
// their grids, bindings and offsets, the setBytes payloads, the memory limits, and the
// clear error for shapes the kernels cannot index.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/problem.hpp"
#include "kernel_params.h"
#include "metal/plan.hpp"
#include "rnncore/error.hpp"

namespace {

using namespace rnncore;
using namespace rnncore::metal;
using detail::OpKind;
using detail::Problem;
namespace k = rnncore::kernels;

Problem problem(OpKind op, int64_t T, int64_t N, int64_t I, int64_t H, int64_t D = 1) {
  Problem p;
  p.op = op;
  p.T = T, p.N = N, p.I = I, p.H = H, p.D = D;
  p.G = op == OpKind::Lstm ? 4 : op == OpKind::Gru ? 3 : 1;
  p.ZG = p.G;
  p.has_input_weight = true;
  p.gate_act = {Activation::Sigmoid, Activation::Sigmoid, Activation::Tanh, Activation::Sigmoid};
  return p;
}

// Sets RNNCORE_METAL_PERSISTENT for a test's scope: "never" checks the per-step plans at
// shapes small enough for the persistent kernels.
class PersistentMode {
 public:
  explicit PersistentMode(const char* mode) {
    if (const char* was = std::getenv("RNNCORE_METAL_PERSISTENT")) saved_ = was, had_ = true;
    setenv("RNNCORE_METAL_PERSISTENT", mode, 1);
  }
  ~PersistentMode() {
    if (had_)
      setenv("RNNCORE_METAL_PERSISTENT", saved_.c_str(), 1);
    else
      unsetenv("RNNCORE_METAL_PERSISTENT");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

k::StepParams step_params(const Dispatch& d) {
  EXPECT_EQ(d.bytes.size(), 1u);
  EXPECT_EQ(d.bytes[0].index, uint32_t(k::SB_PARAMS));
  EXPECT_EQ(d.bytes[0].data.size(), sizeof(k::StepParams));
  k::StepParams s;
  std::memcpy(&s, d.bytes[0].data.data(), sizeof s);
  return s;
}

const Binding* find(const Dispatch& d, uint32_t index) {
  for (const Binding& b : d.buffers)
    if (b.index == index) return &b;
  return nullptr;
}

int32_t constant(const Dispatch& d, uint32_t index) {
  for (const FunctionConstant& c : d.constants)
    if (c.index == index) return c.value;
  ADD_FAILURE() << "constant " << index << " not set for " << d.kernel;
  return -1;
}

TEST(Plan, TinyGruResetBeforeTakesTwoDispatchesPerStep) {
  const PersistentMode per_step("never");
  Problem p = problem(OpKind::Gru, 1, 1, 1, 1);
  const Plan plan = plan_forward(p, {});
  ASSERT_EQ(plan.dispatches.size(), 3u);  // projection, gates, candidate
  EXPECT_EQ(plan.dispatches[0].kernel, "gemm_fff");
  EXPECT_EQ(plan.dispatches[1].kernel, "gru_gates_b1_f32");
  EXPECT_EQ(plan.dispatches[2].kernel, "gru_candidate_b1_f32");
  for (size_t i = 1; i < 3; ++i) {
    const Dispatch& d = plan.dispatches[i];
    EXPECT_EQ(d.threadgroups.x, 1u);
    EXPECT_EQ(d.threadgroups.y, 1u);
    EXPECT_EQ(d.threadgroups.z, 1u);
    EXPECT_EQ(d.threads.x, uint64_t(k::STEP_SIMDGROUPS * k::SIMD_WIDTH));
    EXPECT_EQ(find(d, k::SB_WS)->buffer, Buffer::StepScratch);
    EXPECT_EQ(constant(d, k::FC_HAS_WORKSPACE), 1);
  }
  EXPECT_EQ(plan.size(Buffer::StepScratch), 2 * 1 * 1 * 4);
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(Plan, LargeBidirectionalLstm) {
  Problem p = problem(OpKind::Lstm, 50, 128, 1024, 1024, 2);
  p.training = true;
  p.has_bias = true;
  const Plan plan = plan_forward(p, {});
  ASSERT_EQ(plan.dispatches.size(), 51u);
  const Dispatch& proj = plan.dispatches[0];
  EXPECT_EQ(proj.threadgroups.x, uint64_t(2 * 4 * 1024 / 64));
  EXPECT_EQ(proj.threadgroups.y, uint64_t(50 * 128 / 64));
  EXPECT_EQ(proj.threadgroup_memory, uint32_t(64 * 64 * 4));  // the C tile outgrows the K slices
  EXPECT_LE(proj.threadgroup_memory, Limits::max_threadgroup_memory);
  const Dispatch& s = plan.dispatches[7];
  EXPECT_EQ(s.kernel, "lstm_step_b16_f32");
  EXPECT_EQ(s.threadgroups.x, 8u);    // N = 128 in tiles of 16
  EXPECT_EQ(s.threadgroups.y, 128u);  // ceil(1024 / STEP_SIMDGROUPS)
  EXPECT_EQ(s.threadgroups.z, 2u);
  const k::StepParams sp = step_params(s);
  EXPECT_EQ(sp.step, 6);
  EXPECT_EQ(sp.xp_ld, 2 * 4 * 1024);
  EXPECT_EQ(sp.y_ld, 2 * 1024);
  EXPECT_EQ(sp.z_ld, 2 * 4 * 1024);
  EXPECT_EQ(sp.reverse, 0);
  // No cell output requested: the cell lives in workspace of the output's size.
  EXPECT_EQ(find(s, k::SB_C)->buffer, Buffer::CellScratch);
  EXPECT_EQ(plan.size(Buffer::CellScratch), 50 * 128 * 2 * 1024 * 4);
  EXPECT_EQ(plan.size(Buffer::Projected), int64_t(50) * 128 * 2 * 4 * 1024 * 4);
  for (const Dispatch& d : plan.dispatches)
    for (const Binding& b : d.buffers) EXPECT_EQ(b.offset % plan.element_size, 0);
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(Plan, BatchTileCoversTheBatch) {
  const PersistentMode per_step("never");
  const std::pair<int64_t, const char*> cases[] = {{1, "_b1_"},  {2, "_b2_"},  {3, "_b4_"},
                                                   {4, "_b4_"},  {5, "_b8_"},  {8, "_b8_"},
                                                   {9, "_b16_"}, {67, "_b16_"}};
  for (const auto& [N, tile] : cases) {
    const Plan plan = plan_forward(problem(OpKind::Rnn, 2, N, 3, 31), {});
    const Dispatch& d = plan.dispatches.back();
    EXPECT_NE(d.kernel.find(tile), std::string::npos) << N << " " << d.kernel;
    const uint64_t nb = std::stoul(d.kernel.substr(d.kernel.find("_b") + 2));
    EXPECT_GE(d.threadgroups.x * nb, uint64_t(N));
    EXPECT_LT((d.threadgroups.x - 1) * nb, uint64_t(N));
    EXPECT_EQ(d.threadgroups.y, 4u);  // ceil(31 / 8)
  }
}

TEST(Plan, NoProjectionWithoutWeightAndBias) {
  const PersistentMode per_step("never");
  Problem p = problem(OpKind::Gru, 3, 2, 0, 5);
  p.has_input_weight = false;
  p.gru.reset_after = true;
  p.ZG = 4;
  const Plan plan = plan_forward(p, {});
  ASSERT_EQ(plan.dispatches.size(), 3u);
  EXPECT_EQ(plan.dispatches[0].kernel, "gru_step_b2_f32");
  EXPECT_EQ(find(plan.dispatches[0], k::SB_XP)->buffer, Buffer::Source);
  EXPECT_EQ(plan.size(Buffer::Source), 3 * 2 * 15 * 4);
  EXPECT_EQ(plan.size(Buffer::Projected), 0);
}

TEST(Plan, ReverseAndMaskBroadcastStrides) {
  const PersistentMode per_step("never");
  Problem p = problem(OpKind::Rnn, 4, 3, 2, 6);
  p.reverse = true;
  p.has_mask = true;
  EXPECT_EQ(step_params(plan_forward(p, {1, 6}).dispatches.back()).reverse, 1);
  const k::StepParams row = step_params(plan_forward(p, {1, 6}).dispatches.back());
  EXPECT_EQ(row.mask_rs, 0);
  EXPECT_EQ(row.mask_cs, 1);
  const k::StepParams col = step_params(plan_forward(p, {3, 1}).dispatches.back());
  EXPECT_EQ(col.mask_rs, 1);
  EXPECT_EQ(col.mask_cs, 0);
  const k::StepParams full = step_params(plan_forward(p, {3, 6}).dispatches.back());
  EXPECT_EQ(full.mask_rs, 6);
  EXPECT_EQ(full.mask_cs, 1);
  p.D = 2;  // reverse is the unidirectional option only
  EXPECT_EQ(step_params(plan_forward(p, {3, 12}).dispatches.back()).reverse, 0);
}

TEST(Plan, FunctionConstantsFollowTheDescriptor) {
  const PersistentMode per_step("never");
  Problem p = problem(OpKind::Lstm, 2, 2, 2, 2);
  p.lstm_i = 1, p.lstm_f = 0, p.lstm_z = 3, p.lstm_o = 2;
  p.gate_act = {Activation::HardSigmoid, Activation::Relu, Activation::None, Activation::Tanh};
  p.cell_act = Activation::Sigmoid;
  p.has_peephole = true;
  p.has_init_cell = true;
  const Plan plan = plan_forward(p, {});
  const Dispatch& d = plan.dispatches.back();
  EXPECT_EQ(constant(d, k::FC_GATE_A), 1);
  EXPECT_EQ(constant(d, k::FC_GATE_B), 0);
  EXPECT_EQ(constant(d, k::FC_GATE_C), 3);
  EXPECT_EQ(constant(d, k::FC_GATE_D), 2);
  EXPECT_EQ(constant(d, k::FC_ACT_0), int32_t(Activation::HardSigmoid));
  EXPECT_EQ(constant(d, k::FC_ACT_1), int32_t(Activation::Relu));
  EXPECT_EQ(constant(d, k::FC_ACT_2), int32_t(Activation::None));
  EXPECT_EQ(constant(d, k::FC_ACT_3), int32_t(Activation::Tanh));
  EXPECT_EQ(constant(d, k::FC_CELL_ACT), int32_t(Activation::Sigmoid));
  EXPECT_EQ(constant(d, k::FC_HAS_PEEPHOLE), 1);
  EXPECT_EQ(constant(d, k::FC_HAS_INIT_CELL), 1);
  EXPECT_EQ(find(d, k::SB_PEEPHOLE)->buffer, Buffer::Peephole);
  EXPECT_EQ(find(d, k::SB_C0)->buffer, Buffer::InitCell);
  // Different constants, different pipelines.
  Problem q = p;
  q.has_peephole = false;
  EXPECT_NE(d.pipeline_key(), plan_forward(q, {}).dispatches.back().pipeline_key());
}

TEST(Plan, ShapesBeyondThirtyTwoBitIndexingAreRefused) {
  Problem p = problem(OpKind::Lstm, 100000, 1000, 64, 8);
  try {
    plan_forward(p, {});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[lstm] device 'metal'", 0), 0u) << m;
    EXPECT_NE(m.find("6400000000 elements"), std::string::npos) << m;
    EXPECT_NE(m.find("2147483647"), std::string::npos) << m;
  }
}

TEST(Plan, LimitViolationsAreReported) {
  const Plan good = plan_forward(problem(OpKind::Rnn, 2, 2, 2, 2), {});
  Plan p = good;
  p.dispatches[0].threadgroup_memory = 64 * 1024;
  EXPECT_THROW(check_limits(p), Error);
  p = good;
  p.dispatches[0].threads = {1025, 1, 1};
  EXPECT_THROW(check_limits(p), Error);
  p = good;
  p.dispatches[0].buffers[0].offset = 2;
  EXPECT_THROW(check_limits(p), Error);
  p = good;
  p.dispatches[0].bytes[0].data.resize(4096);
  EXPECT_THROW(check_limits(p), Error);
  p = good;
  p.dispatches[0].buffers[0].offset = p.size(p.dispatches[0].buffers[0].buffer);
  EXPECT_THROW(check_limits(p), Error);
  p = good;
  p.dispatches[0].threadgroups = {0, 1, 1};
  EXPECT_THROW(check_limits(p), Error);
}

}  // namespace

namespace {

Problem gradient_problem(OpKind op, bool reset_after = false) {
  Problem p = problem(op, 4, 3, 5, 7, 2);
  p.gru.reset_after = reset_after;
  if (op == OpKind::Gru && reset_after) p.ZG = 4;
  p.has_bias = true;
  p.has_init_state = true;
  return p;
}

size_t count(const Plan& plan, const std::string& prefix) {
  size_t n = 0;
  for (const Dispatch& d : plan.dispatches) n += d.kernel.rfind(prefix, 0) == 0;
  return n;
}

TEST(PlanGradients, StepsRunBackwardThenTheInitialStateDispatch) {
  const PersistentMode per_step("never");
  const Plan plan = plan_gradients(gradient_problem(OpKind::Lstm), {});
  // R^T, T steps + the initial-state dispatch, dR, dsource, dW, dbias.
  EXPECT_EQ(plan.dispatches.front().kernel, "transpose_f32");
  EXPECT_EQ(count(plan, "lstm_backward_b4_f32"), 5u);
  std::vector<int32_t> steps;
  for (const Dispatch& d : plan.dispatches)
    if (d.kernel.rfind("lstm_backward", 0) == 0) {
      k::StepParams bp;
      std::memcpy(&bp, d.bytes[0].data.data(), sizeof bp);
      steps.push_back(bp.step);
    }
  EXPECT_EQ(steps, (std::vector<int32_t>{3, 2, 1, 0, -1}));
  EXPECT_EQ(count(plan, "gemm_fff"), 3u);         // dR, dsource, dW
  EXPECT_EQ(count(plan, "column_sums_f32"), 1u);  // dbias
  EXPECT_TRUE(plan.written(Buffer::DInitState));
  EXPECT_FALSE(plan.written(Buffer::ZState));  // an input of the gradient op
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(PlanGradients, ResetBeforeGruTakesTwoDispatchesPerStepAndTwoWeightGemms) {
  const PersistentMode per_step("never");
  const Plan plan = plan_gradients(gradient_problem(OpKind::Gru), {});
  EXPECT_EQ(count(plan, "gru_backward_zo_b4_f32"), 5u);
  EXPECT_EQ(count(plan, "gru_backward_r_b4_f32"), 4u);  // not for the initial state
  EXPECT_EQ(count(plan, "gemm_fff"), 4u);  // dR (z, r rows and candidate rows), dsource, dW
  EXPECT_GT(plan.size(Buffer::UInput), 0);
  EXPECT_EQ(plan.size(Buffer::RDelta), 0);
}

TEST(PlanGradients, ResetAfterGruSumsTheSecondaryBiasGradient) {
  const PersistentMode per_step("never");
  GradientShape g;
  g.want_db2 = true;
  const Plan plan = plan_gradients(gradient_problem(OpKind::Gru, true), g);
  EXPECT_EQ(count(plan, "gru_backward_b4_f32"), 5u);
  EXPECT_EQ(count(plan, "column_sums_f32"), 2u);  // dbias, dsecondary_bias
  EXPECT_GT(plan.size(Buffer::RDelta), 0);
  // The secondary-bias sums read the q block (offset 2H) of each direction's deltas.
  const Dispatch& db2 = plan.dispatches.back();
  EXPECT_EQ(db2.buffers[0].buffer, Buffer::RDelta);
  EXPECT_EQ(db2.buffers[0].offset, 2 * 7 * 4);
  EXPECT_EQ(db2.threadgroups.z, 2u);
}

TEST(PlanGradients, Float16StorageKeepsFloat32Intermediates) {
  const PersistentMode per_step("never");
  Problem p = gradient_problem(OpKind::Rnn);
  p.dtype = DType::Float16;
  p.has_input_weight = false;
  const Plan plan = plan_gradients(p, {});
  EXPECT_EQ(plan.element_size, 2);
  EXPECT_EQ(plan.element_sizes[static_cast<int>(Buffer::DSource)], 2);
  EXPECT_EQ(plan.element_sizes[static_cast<int>(Buffer::DProjected)], 4);
  EXPECT_EQ(plan.element_sizes[static_cast<int>(Buffer::HTilde)], 4);
  EXPECT_EQ(plan.element_sizes[static_cast<int>(Buffer::Carry)], 4);
  EXPECT_EQ(count(plan, "rnn_backward_b4_f16"), 5u);
  EXPECT_EQ(count(plan, "gemm_ffh"), 1u);  // dR from float32 deltas and states
  // Without an input weight dX' is converted into the float16 source gradient.
  EXPECT_EQ(count(plan, "gemm_fhh"), 1u);
  EXPECT_EQ(count(plan, "column_sums_f16"), 1u);  // dbias, from float32 dX'
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(PlanGradients, Float32WithoutInputWeightWritesDxIntoTheSourceGradient) {
  Problem p = gradient_problem(OpKind::Rnn);
  p.has_input_weight = false;
  const Plan plan = plan_gradients(p, {});
  EXPECT_EQ(plan.size(Buffer::DProjected), 0);
  EXPECT_EQ(count(plan, "gemm"), 1u);  // dR only
}

TEST(PlanGradients, ZeroSizesPlanNoDispatches) {
  Problem p = gradient_problem(OpKind::Gru);
  p.T = 0;
  EXPECT_TRUE(plan_gradients(p, {}).dispatches.empty());
}

}  // namespace

namespace {

k::StepParams params_at(const Dispatch& d, uint32_t index) {
  EXPECT_EQ(d.bytes.size(), 1u);
  EXPECT_EQ(d.bytes[0].index, index);
  k::StepParams s;
  std::memcpy(&s, d.bytes[0].data.data(), sizeof s);
  return s;
}

TEST(PlanPersistent, LongNarrowSequenceIsOneDispatchPer1024Steps) {
  const PersistentMode automatic("auto");
  const Plan plan = plan_forward(problem(OpKind::Gru, 2500, 1, 64, 64), {});
  ASSERT_EQ(plan.dispatches.size(), 4u);  // the projection, then steps 0, 1024, 2048
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (size_t i = 1; i < plan.dispatches.size(); ++i) {
    const Dispatch& d = plan.dispatches[i];
    EXPECT_EQ(d.kernel, "gru_rb_persistent_b1_f32");
    EXPECT_EQ(d.threadgroups.volume(), 1u);
    EXPECT_EQ(d.threads.x, 32u * 32u);  // a simdgroup per unit, 32 at most
    EXPECT_TRUE(d.adapts_threads);
    const k::StepParams sp = params_at(d, k::SB_PARAMS);
    ranges.push_back({sp.step, sp.steps});
  }
  EXPECT_EQ(ranges,
            (std::vector<std::pair<int32_t, int32_t>>{{0, 1024}, {1024, 1024}, {2048, 452}}));
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(PlanPersistent, GradientsRunDownToTheInitialStateStep) {
  const PersistentMode automatic("auto");
  Problem p = problem(OpKind::Lstm, 4, 3, 2, 5, 2);
  p.has_bias = true, p.has_init_state = true;
  const Plan plan = plan_gradients(p, {});
  std::vector<const Dispatch*> steps;
  for (const Dispatch& d : plan.dispatches)
    if (d.kernel.find("persistent") != std::string::npos) steps.push_back(&d);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0]->kernel, "lstm_backward_persistent_b4_f32");
  EXPECT_EQ(steps[0]->threads.x, 5u * 32u);  // H = 5 simdgroups
  const k::StepParams sp = params_at(*steps[0], k::BB_PARAMS);
  EXPECT_EQ(sp.step, 3);
  EXPECT_EQ(sp.steps, 5);  // 3, 2, 1, 0 and -1
  EXPECT_NO_THROW(check_limits(plan));
}

TEST(PlanPersistent, ChosenOnlyForAFewThreadgroupsAStep) {
  const PersistentMode automatic("auto");
  const auto persistent = [](const Problem& p) {
    const Plan plan = plan_forward(p, {});
    return plan.dispatches.back().kernel.find("persistent") != std::string::npos;
  };
  EXPECT_TRUE(persistent(problem(OpKind::Rnn, 10, 8, 3, 64)));       // 2 walks of 32 units
  EXPECT_TRUE(persistent(problem(OpKind::Rnn, 10, 1, 3, 32, 2)));    // 2 directions
  EXPECT_FALSE(persistent(problem(OpKind::Rnn, 10, 9, 3, 8)));       // N past the tile of 8
  EXPECT_FALSE(persistent(problem(OpKind::Rnn, 10, 1, 3, 65)));      // 3 walks
  EXPECT_FALSE(persistent(problem(OpKind::Lstm, 10, 1, 3, 64, 2)));  // 4 walks
  const PersistentMode always("always");  // any shape, tiles of at most 8 rows
  const Plan big = plan_forward(problem(OpKind::Lstm, 3, 67, 3, 100, 2), {});
  EXPECT_EQ(big.dispatches.back().kernel, "lstm_persistent_b8_f32");
  const PersistentMode bad("sometimes");
  EXPECT_THROW(plan_forward(problem(OpKind::Rnn, 1, 1, 1, 1), {}), ValueError);
}

}  // namespace

namespace {

// A dR with few output tiles and K = T*N long: split along K into float32 partials, then one
// column-sum pass adds them up into the caller's array; the bias gradient's long columns are
// summed in row blocks, then over the blocks' partial rows.
TEST(PlanGradients, LongReductionsAreSplitToFillTheGpu) {
  Problem p = problem(OpKind::Gru, 400, 8, 64, 64);
  p.gru.reset_after = true, p.ZG = 4;  // one dR GEMM
  p.has_bias = true;
  const Plan plan = plan_gradients(p, {});
  std::vector<const Dispatch*> gemms, sums;
  for (const Dispatch& d : plan.dispatches) {
    if (d.kernel.rfind("gemm", 0) == 0) gemms.push_back(&d);
    if (d.kernel.rfind("column_sums", 0) == 0) sums.push_back(&d);
  }
  ASSERT_GE(gemms.size(), 1u);
  const Dispatch& dr = *gemms[0];  // dR [192, 64] = delta^T h~, K = 3200: 3 tiles
  k::GemmParams g;
  std::memcpy(&g, dr.bytes[0].data.data(), sizeof g);
  EXPECT_EQ(g.K, 3200);
  EXPECT_GT(g.splits, 1);
  EXPECT_EQ(g.k_per % k::GEMM_TILE_K, 0);
  EXPECT_GE(int64_t(g.splits) * g.k_per, 3200);
  EXPECT_LT(int64_t(g.splits - 1) * g.k_per, 3200);
  EXPECT_EQ(dr.threadgroups.z, uint64_t(g.splits));
  EXPECT_EQ(dr.buffers.back().buffer, Buffer::Partials);
  EXPECT_GE(plan.size(Buffer::Partials), int64_t(g.splits) * 192 * 64 * 4);
  // The partials' sum into dR (and dW's into dW), then the bias gradient in row blocks and
  // their sum.
  ASSERT_EQ(sums.size(), 4u);
  EXPECT_EQ(sums[0]->buffers.back().buffer, Buffer::DRecurrentWeight);
  EXPECT_EQ(sums[1]->buffers.back().buffer, Buffer::DInputWeight);
  k::ColumnSumParams c;
  std::memcpy(&c, sums[2]->bytes[0].data.data(), sizeof c);
  EXPECT_EQ(c.rows, 3200);
  EXPECT_EQ(sums[2]->buffers.back().buffer, Buffer::Partials);
  EXPECT_GT(sums[2]->threadgroups.y, 1u);
  EXPECT_GE(int64_t(c.row_block) * int64_t(sums[2]->threadgroups.y), 3200);
  EXPECT_EQ(sums[3]->buffers.back().buffer, Buffer::DBias);
  EXPECT_NO_THROW(check_limits(plan));
}

}  // namespace
