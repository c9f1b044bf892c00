// Error messages: "[op] argument must have shape (expected) but has (received)".
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "rnncore/rnncore.hpp"

namespace {

using rnncore::TensorView;

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

struct GruCase {
  std::vector<float> x = std::vector<float>(5 * 4 * 8, 0.f);
  std::vector<float> W = std::vector<float>(96 * 8, 0.f);
  std::vector<float> R = std::vector<float>(2 * 96 * 32, 0.f);
  std::vector<float> h = std::vector<float>(4 * 64, 0.f);
  rnncore::GRUInputs in;
  GruCase() {
    in.source = TensorView(x.data(), {5, 4, 8});
    in.recurrent_weight = TensorView(R.data(), {96, 32});
    in.input_weight = TensorView(W.data(), {96, 8});
  }
};

TEST(Errors, InitStateShapeNamesOpArgumentAndShapes) {
  GruCase c;
  c.in.init_state = TensorView(c.h.data(), {4, 16});
  EXPECT_EQ(message_of<rnncore::ValueError>([&] { rnncore::gru(c.in); }),
            "[gru] init_state must have shape (4, 32) (N, D*H) but has (4, 16)");
}

TEST(Errors, BidirectionalNeedsRank3RecurrentWeight) {
  GruCase c;
  rnncore::GRUDescriptor d;
  d.bidirectional = true;
  EXPECT_EQ(message_of<rnncore::ValueError>([&] { rnncore::gru(c.in, d); }),
            "[gru] recurrent_weight must have rank 3 (2, 3H, H) for a bidirectional layer but "
            "has shape (96, 32)");
}

TEST(Errors, MaskWithTimeAxis) {
  GruCase c;
  c.in.mask = TensorView(c.x.data(), {5, 4, 32});
  const std::string m = message_of<rnncore::ValueError>([&] { rnncore::gru(c.in); });
  EXPECT_EQ(m.rfind("[gru] mask must broadcast to (N, D*H) = (4, 32)", 0), 0u) << m;
  EXPECT_NE(m.find("(5, 4, 32)"), std::string::npos) << m;
}

TEST(Errors, MixedDtypes) {
  GruCase c;
  std::vector<double> b(96, 0.0);
  c.in.bias = TensorView(b.data(), {96});
  EXPECT_EQ(message_of<rnncore::TypeError>([&] { rnncore::gru(c.in); }),
            "[gru] bias has dtype float64 but source has dtype float32; all arrays must share "
            "one dtype");
}

TEST(Errors, ActivationOutOfRange) {
  GruCase c;
  rnncore::GRUDescriptor d;
  d.output_gate_activation = static_cast<rnncore::Activation>(7);
  EXPECT_EQ(message_of<rnncore::ValueError>([&] { rnncore::gru(c.in, d); }),
            "[gru] descriptor.output_gate_activation must be an Activation (0..4) but is 7");
}

TEST(Errors, SourceWithoutInputWeight) {
  GruCase c;
  c.in.input_weight.reset();
  EXPECT_EQ(message_of<rnncore::ValueError>([&] { rnncore::gru(c.in); }),
            "[gru] source must have shape (5, 4, 96) (T, N, D*G*H) without input_weight but "
            "has (5, 4, 8)");
}

TEST(Errors, UnknownAndUnavailableDevices) {
  EXPECT_THROW(rnncore::parse_device("tpu"), rnncore::ValueError);
  if (rnncore::available_devices().size() == 1) {
    GruCase c;
    EXPECT_THROW(rnncore::gru(c.in, {}, rnncore::Device::Metal), rnncore::DeviceError);
  }
}

}  // namespace

namespace {

// A zero-size input weight without storage (I = 0) is present: x' = 0, h = relu(h0 R^T).
TEST(Reliability, EmptyInputWeightWithoutDataIsPresent) {
  std::vector<float> R = {0.5f, -1.f, 2.f, 1.f}, h0 = {1.f, 2.f};
  rnncore::RNNInputs in;
  in.source = TensorView(static_cast<const float*>(nullptr), {1, 1, 0});
  in.recurrent_weight = TensorView(R.data(), {2, 2});
  in.input_weight = TensorView(static_cast<const float*>(nullptr), {2, 0});
  in.init_state = TensorView(h0.data(), {1, 2});
  const rnncore::RNNResults r = rnncore::single_gate_rnn(in, {}, rnncore::Device::Cpu);
  ASSERT_EQ(r.state.shape(), (rnncore::Shape{1, 1, 2}));
  EXPECT_EQ(r.state.ptr<float>()[0], 0.f);  // relu(0.5 - 2)
  EXPECT_EQ(r.state.ptr<float>()[1], 4.f);  // relu(2 + 2)
}

TEST(Reliability, MisalignedInputsGiveTheAlignedResults) {
  GruCase c;
  for (size_t i = 0; i < c.x.size(); ++i) c.x[i] = 0.01f * static_cast<float>(i % 17);
  for (size_t i = 0; i < c.W.size(); ++i) c.W[i] = 0.02f * static_cast<float>(i % 5) - 0.04f;
  c.in.recurrent_weight = TensorView(c.R.data(), {96, 32});
  const rnncore::GRUResults want = rnncore::gru(c.in, {}, rnncore::Device::Cpu);
  std::vector<char> bytes(c.x.size() * sizeof(float) + 1);
  std::memcpy(bytes.data() + 1, c.x.data(), c.x.size() * sizeof(float));
  c.in.source = TensorView(bytes.data() + 1, {5, 4, 8}, rnncore::DType::Float32);
  const rnncore::GRUResults got = rnncore::gru(c.in, {}, rnncore::Device::Cpu);
  EXPECT_EQ(std::memcmp(got.state.data(), want.state.data(), want.state.nbytes()), 0);
}

TEST(Reliability, OverflowingSizesAreRefusedNamingThem) {
  std::vector<float> R(48 * 16, 0.f);
  rnncore::GRUInputs in;
  in.source =
      TensorView(static_cast<const float*>(nullptr), {int64_t(1) << 30, int64_t(1) << 30, 0});
  in.recurrent_weight = TensorView(R.data(), {48, 16});
  in.input_weight = TensorView(static_cast<const float*>(nullptr), {48, 0});
  EXPECT_EQ(message_of<rnncore::ValueError>([&] { rnncore::gru(in); }),
            "[gru] the state output would have T*N*D*H = 1073741824*1073741824*1*16 elements, "
            "more than 2^59: the sizes are too large");
}

}  // namespace
