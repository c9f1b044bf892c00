// The C++ API itself: descriptors, tensors, devices, and the three forward ops checked
// against scalar recurrences written out by hand (H = 1, so every product is a number).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "rnncore/rnncore.hpp"

namespace {

using rnncore::Activation;
using rnncore::TensorView;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(Descriptors, DefaultsAreMPSGraphs) {
  rnncore::RNNDescriptor r;
  EXPECT_EQ(r.activation, Activation::Relu);
  EXPECT_FALSE(r.reverse || r.bidirectional || r.training);
  rnncore::LSTMDescriptor l;
  EXPECT_EQ(l.input_gate_activation, Activation::Sigmoid);
  EXPECT_EQ(l.forget_gate_activation, Activation::Sigmoid);
  EXPECT_EQ(l.cell_gate_activation, Activation::Tanh);
  EXPECT_EQ(l.output_gate_activation, Activation::Sigmoid);
  EXPECT_EQ(l.activation, Activation::Tanh);
  EXPECT_FALSE(l.forget_gate_last || l.produce_cell);
  rnncore::GRUDescriptor g;
  EXPECT_EQ(g.update_gate_activation, Activation::Sigmoid);
  EXPECT_EQ(g.reset_gate_activation, Activation::Sigmoid);
  EXPECT_EQ(g.output_gate_activation, Activation::Tanh);
  EXPECT_FALSE(g.reset_after || g.flip_z || g.reset_gate_first);
  rnncore::GRUDescriptor g2;
  g2.flip_z = true;
  EXPECT_NE(g, g2);
  g2.flip_z = false;
  EXPECT_EQ(g, g2);
}

TEST(Tensor, EmptyZerosAndShapes) {
  auto t = rnncore::Tensor::zeros({2, 3}, rnncore::DType::Float64);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 48);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.ptr<double>()[i], 0.0);
  EXPECT_EQ(rnncore::shape_to_string({4, 32}), "(4, 32)");
  EXPECT_EQ(rnncore::shape_to_string({7}), "(7,)");
  EXPECT_EQ(rnncore::shape_to_string({}), "()");
  auto e = rnncore::Tensor::empty({0, 5}, rnncore::DType::Float32);
  EXPECT_NE(e.data(), nullptr);
}

TEST(Devices, CpuIsAlwaysThere) {
  auto d = rnncore::available_devices();
  EXPECT_NE(std::find(d.begin(), d.end(), "cpu"), d.end());
  EXPECT_EQ(rnncore::parse_device("cpu"), rnncore::Device::Cpu);
  EXPECT_EQ(rnncore::parse_device(""), rnncore::Device::Auto);
  EXPECT_FALSE(rnncore::build_info().blas.empty());
}

TEST(SingleGateRnn, ScalarRecurrenceWithReverseAndTraining) {
  // T = 3, N = 1, I = 1, H = 1, tanh: h[t] = tanh(w*x + b + r*h[t-1]).
  const std::vector<float> x = {0.5f, -1.0f, 2.0f};
  const float w = 0.7f, r = -0.4f, b = 0.1f, h0 = 0.3f;
  rnncore::RNNInputs in;
  in.source = TensorView(x.data(), {3, 1, 1});
  in.recurrent_weight = TensorView(&r, {1, 1});
  in.input_weight = TensorView(&w, {1, 1});
  in.bias = TensorView(&b, {1});
  in.init_state = TensorView(&h0, {1, 1});
  rnncore::RNNDescriptor d;
  d.activation = Activation::Tanh;
  d.reverse = true;
  d.training = true;
  auto out = rnncore::single_gate_rnn(in, d, rnncore::Device::Cpu);
  ASSERT_EQ(out.state.shape(), (rnncore::Shape{3, 1, 1}));
  ASSERT_TRUE(out.z_state.has_value());
  double h = h0;
  for (int s = 0; s < 3; ++s) {  // reverse: consumes x[2], x[1], x[0]; outputs in that order
    const double z = w * x[2 - s] + b + r * h;
    h = std::tanh(z);
    EXPECT_NEAR(out.state.ptr<float>()[s], h, 1e-6);
    EXPECT_NEAR(out.z_state->ptr<float>()[s], z, 1e-6);
  }
}

TEST(Lstm, ScalarCellWithPeepholeAndMask) {
  // H = 1, no input weight: the source holds x' directly in gate order i, f, z, o.
  const std::vector<double> xp = {0.1, 0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8};  // T = 2
  const std::vector<double> R = {0.5, -0.25, 0.75, 1.0};
  const std::vector<double> P = {0.1, 0.2, 0.3, 0.4};
  const double h0 = 0.2, c0 = -0.3, m = 0.5;
  rnncore::LSTMInputs in;
  in.source = TensorView(xp.data(), {2, 1, 4});
  in.recurrent_weight = TensorView(R.data(), {4, 1});
  in.init_state = TensorView(&h0, {1, 1});
  in.init_cell = TensorView(&c0, {1, 1});
  in.mask = TensorView(&m, {});
  in.peephole = TensorView(P.data(), {4});
  rnncore::LSTMDescriptor d;
  d.produce_cell = true;
  auto out = rnncore::lstm(in, d);
  double h = h0, c = c0;
  for (int t = 0; t < 2; ++t) {
    double a[4];
    for (int k = 0; k < 4; ++k) a[k] = xp[t * 4 + k] + R[k] * h * m + P[k] * c;
    c = sigmoid(a[1]) * c + sigmoid(a[0]) * std::tanh(a[2]);
    h = sigmoid(a[3]) * std::tanh(c);
    EXPECT_NEAR(out.state.ptr<double>()[t], h, 1e-14);
    EXPECT_NEAR(out.cell->ptr<double>()[t], c, 1e-14);
  }
  EXPECT_FALSE(out.z_state.has_value());
}

TEST(Gru, ScalarResetAfterFlipZBidirectional) {
  // T = 2, N = 1, H = 1, D = 2, no input weight: x' is [T, 1, 2*3].
  const std::vector<double> xp = {0.1, -0.2, 0.3, 0.4, 0.5, -0.6, -0.7, 0.8, 0.9, -1.0, 0.2, 0.3};
  const std::vector<double> R = {0.5, -0.5, 0.25, -0.75, 0.6, 0.9};  // [2, 3, 1]
  const std::vector<double> b2 = {0.05, -0.05};
  rnncore::GRUInputs in;
  in.source = TensorView(xp.data(), {2, 1, 6});
  in.recurrent_weight = TensorView(R.data(), {2, 3, 1});
  in.secondary_bias = TensorView(b2.data(), {2});
  rnncore::GRUDescriptor d;
  d.bidirectional = true;
  d.reset_after = true;
  d.flip_z = true;
  auto out = rnncore::gru(in, d);
  for (int dir = 0; dir < 2; ++dir) {
    double h = 0;
    for (int s = 0; s < 2; ++s) {
      const int t = dir == 0 ? s : 1 - s;  // the backward half consumes time backwards
      const double* x = &xp[t * 6 + dir * 3];
      const double* r = &R[dir * 3];
      const double z = sigmoid(x[0] + r[0] * h), rr = sigmoid(x[1] + r[1] * h);
      const double o = std::tanh(x[2] + rr * (r[2] * h + b2[dir]));
      h = (1 - z) * h + z * o;
      EXPECT_NEAR(out.state.ptr<double>()[t * 2 + dir], h, 1e-14);
    }
  }
}

TEST(ZeroSizes, EmptyTimeAndBatch) {
  std::vector<float> R(3 * 4 * 4, 0.f);
  rnncore::GRUInputs in;
  in.source = TensorView(static_cast<const float*>(nullptr), {0, 2, 12});
  in.recurrent_weight = TensorView(R.data(), {12, 4});
  auto out = rnncore::gru(in);
  EXPECT_EQ(out.state.shape(), (rnncore::Shape{0, 2, 4}));
  in.source = TensorView(static_cast<const float*>(nullptr), {5, 0, 12});
  out = rnncore::gru(in);
  EXPECT_EQ(out.state.shape(), (rnncore::Shape{5, 0, 4}));
}

}  // namespace

TEST(SequenceLengths, ReverseRowsRunWithinTheirOwnLength) {
  // T = 3, N = 2, H = 1, tanh, reverse; row 0 has length 2, row 1 length 3.
  const std::vector<double> x = {0.5, 1.5, -1.0, -0.5, 2.0, 0.25};  // [t][n]
  const double w = 0.7, r = -0.4;
  rnncore::RNNInputs in;
  in.source = TensorView(x.data(), {3, 2, 1});
  in.recurrent_weight = TensorView(&r, {1, 1});
  in.input_weight = TensorView(&w, {1, 1});
  in.sequence_lengths = std::vector<int64_t>{2, 3};
  rnncore::RNNDescriptor d;
  d.activation = Activation::Tanh;
  d.reverse = true;
  const auto out = rnncore::single_gate_rnn(in, d, rnncore::Device::Cpu);
  const int64_t lengths[] = {2, 3};
  for (int64_t n = 0; n < 2; ++n) {
    double h = 0;
    for (int64_t s = 0; s < 3; ++s) {  // outputs in processing order, zero past the length
      const double want =
          s < lengths[n] ? (h = std::tanh(w * x[(lengths[n] - 1 - s) * 2 + n] + r * h)) : 0.0;
      EXPECT_NEAR(out.state.ptr<double>()[s * 2 + n], want, 1e-14) << "n " << n << " s " << s;
    }
  }
  in.sequence_lengths = std::vector<int64_t>{2, 4};
  EXPECT_THROW(rnncore::single_gate_rnn(in, d, rnncore::Device::Cpu), rnncore::ValueError);
}
