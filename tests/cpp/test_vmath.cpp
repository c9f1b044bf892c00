// The vectorised float32 sigmoid and tanh against float64 libm, over every 1024th float
// bit pattern (a full sweep of all 2^32 patterns gave 2.82 and 1.57 ulp at most).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/vmath.hpp"

namespace {

double ulp_error(float got, double want) {
  const float w = static_cast<float>(want);
  const float mag = std::fabs(w);
  const double ulp = static_cast<double>(std::nextafter(mag, INFINITY)) - mag;
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

std::vector<float> sample_floats() {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 1024) {
    const auto u = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) x.push_back(f);
  }
  for (float f : {0.f, -0.f, 0.55f, -0.55f, 100.f, -100.f, 88.7f, -88.7f, -104.f, 1e-30f})
    x.push_back(f);
  return x;
}

TEST(Vmath, SigmoidWithinThreeUlp) {
  const auto x = sample_floats();
  std::vector<float> y(x.size()), dy(x.size());
  rnncore::cpu::vmath::sigmoid(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, ulp_error(y[i], 1.0 / (1.0 + std::exp(-double(x[i])))));
  EXPECT_LE(worst, 3.0);
  rnncore::cpu::vmath::sigmoid_grad(x.data(), y.data(), dy.data(), 4);
  EXPECT_FALSE(std::isnan(y[0]));
}

TEST(Vmath, TanhWithinTwoUlp) {
  const auto x = sample_floats();
  std::vector<float> y(x.size());
  rnncore::cpu::vmath::tanh(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, ulp_error(y[i], std::tanh(double(x[i]))));
  EXPECT_LE(worst, 2.0);
}

TEST(Vmath, SaturatesWithoutNaN) {
  const float x[4] = {100.f, -100.f, 1e30f, -1e30f};
  float s[4], t[4];
  rnncore::cpu::vmath::sigmoid(x, s, 4);
  rnncore::cpu::vmath::tanh(x, t, 4);
  EXPECT_EQ(s[0], 1.f);
  EXPECT_GT(s[1], 0.f);  // 3.7e-44, a subnormal, not flushed to zero
  EXPECT_LT(s[1], 1e-43f);
  EXPECT_EQ(s[3], 0.f);
  EXPECT_EQ(t[0], 1.f);
  EXPECT_EQ(t[1], -1.f);
  EXPECT_EQ(t[2], 1.f);
  EXPECT_EQ(t[3], -1.f);
}

}  // namespace

namespace {

// float64 against long double over 2^22 values with magnitudes 2^-30 .. 2^8 and a band
// up to +-800 (a 33M-value sweep gave 2.87 ulp for sigmoid and 1.52 for tanh).
TEST(Vmath, DoubleSigmoidAndTanhWithinThreeUlp) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> expo(-30, 8), wide(-800, 800);
  std::vector<double> x(1 << 22), s(x.size()), t(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double m = std::pow(2.0, expo(gen));
    x[i] = i % 8 == 7 ? wide(gen) : ((gen() & 1) ? m : -m);
  }
  const auto n = static_cast<int64_t>(x.size());
  rnncore::cpu::vmath::sigmoid(x.data(), s.data(), n);
  rnncore::cpu::vmath::tanh(x.data(), t.data(), n);
  auto ulps = [](double got, long double want) {
    const double w = static_cast<double>(want);
    const double ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
    return static_cast<double>(fabsl(static_cast<long double>(got) - want)) / ulp;
  };
  double worst_s = 0, worst_t = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const long double xi = x[i];
    worst_s = std::max(worst_s, ulps(s[i], 1.0L / (1.0L + expl(-xi))));
    worst_t = std::max(worst_t, ulps(t[i], tanhl(xi)));
  }
  EXPECT_LE(worst_s, 3.0);
  EXPECT_LE(worst_t, 2.0);
}

}  // namespace
