// Error messages: "[op] argument must have shape (expected) but has (received)".
#include <gtest/gtest.h>

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
