// The vectorised float32 sigmoid and tanh against float64 libm, over every 1024th float
// bit pattern (a full sweep of all 2^32 patterns gave 2.82 and 1.57 ulp at most).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu/activations.hpp"
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

// NaN, infinities and the edges of the exp reduction. Before the exp computed 2^n from the
// bits of its rounding constant, NaN went through a float -> int conversion and a left
// shift of a negative value (both undefined: UBSan stops on them).
namespace {

namespace vm = rnncore::cpu::vmath;

template <class T>
std::vector<T> nans() {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U exp_mask = sizeof(T) == 4 ? U(0x7F800000u) : U(0x7FF0000000000000u);
  const U sign = U(1) << (8 * sizeof(T) - 1);
  std::vector<T> v;
  // Quiet and signalling, both signs, smallest and largest payloads.
  for (U payload : {U(1), U(exp_mask >> 1 & ~exp_mask), U(~exp_mask & ~sign)})
    for (U s : {U(0), sign}) {
      const U bits = s | exp_mask | payload;
      T f;
      std::memcpy(&f, &bits, sizeof(T));
      v.push_back(f);
    }
  v.push_back(std::numeric_limits<T>::quiet_NaN());
  v.push_back(-std::numeric_limits<T>::quiet_NaN());
  return v;
}

template <class T>
void expect_nan_in_nan_out() {
  const std::vector<T> x = nans<T>();
  for (T v : x) {
    ASSERT_TRUE(std::isnan(v));
    EXPECT_TRUE(std::isnan(vm::exp_nonpositive(v)));
    EXPECT_TRUE(std::isnan(vm::sigmoid(v)));
    EXPECT_TRUE(std::isnan(vm::tanh(v)));
  }
  const auto n = static_cast<int64_t>(x.size());
  std::vector<T> y(x.size()), dy(x.size());
  const auto all_nan = [](const std::vector<T>& a) {
    for (T v : a)
      if (!std::isnan(v)) return false;
    return true;
  };
  vm::sigmoid(x.data(), y.data(), n);
  EXPECT_TRUE(all_nan(y));
  vm::tanh(x.data(), y.data(), n);
  EXPECT_TRUE(all_nan(y));
  vm::sigmoid_grad(x.data(), y.data(), dy.data(), n);
  EXPECT_TRUE(all_nan(y) && all_nan(dy));
  vm::tanh_grad(x.data(), y.data(), dy.data(), n);
  EXPECT_TRUE(all_nan(y) && all_nan(dy));
}

TEST(Vmath, NaNGivesNaN) {
  expect_nan_in_nan_out<float>();
  expect_nan_in_nan_out<double>();
}

template <class T>
void expect_infinities() {
  const T inf = std::numeric_limits<T>::infinity(), big = std::numeric_limits<T>::max();
  EXPECT_EQ(vm::exp_nonpositive(-inf), T(0));
  EXPECT_EQ(vm::exp_nonpositive(-big), T(0));
  // Scalar and array forms (the array loops are the vectorised clones).
  const std::vector<T> x = {inf, -inf, big, -big};
  const std::vector<T> s_want = {1, 0, 1, 0}, t_want = {1, -1, 1, -1};
  std::vector<T> y(4), dy(4);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(vm::sigmoid(x[i]), s_want[i]) << x[i];
    EXPECT_EQ(vm::tanh(x[i]), t_want[i]) << x[i];
  }
  vm::sigmoid_grad(x.data(), y.data(), dy.data(), 4);
  EXPECT_EQ(y, s_want);
  EXPECT_EQ(dy, std::vector<T>(4, T(0)));
  vm::tanh_grad(x.data(), y.data(), dy.data(), 4);
  EXPECT_EQ(y, t_want);
  EXPECT_EQ(dy, std::vector<T>(4, T(0)));
  vm::sigmoid(x.data(), y.data(), 4);
  EXPECT_EQ(y, s_want);
  vm::tanh(x.data(), y.data(), 4);
  EXPECT_EQ(y, t_want);
}

TEST(Vmath, Infinities) {
  expect_infinities<float>();
  expect_infinities<double>();
}

TEST(Vmath, SignedZeros) {
  for (float z : {0.0f, -0.0f}) {
    EXPECT_EQ(vm::exp_nonpositive(z), 1.0f);
    EXPECT_EQ(vm::sigmoid(z), 0.5f);
    EXPECT_EQ(std::signbit(vm::tanh(z)), std::signbit(z));
  }
  for (double z : {0.0, -0.0}) {
    EXPECT_EQ(vm::exp_nonpositive(z), 1.0);
    EXPECT_EQ(vm::sigmoid(z), 0.5);
    EXPECT_EQ(std::signbit(vm::tanh(z)), std::signbit(z));
  }
}

// e^x over [-104, 0] for float (every 64th float: normal results, subnormal ones down to
// the clamp, where the result rounds to 0) and [-746, 0] for double, against the libm of
// the next wider type. Subnormal results are compared in subnormal ulps.
TEST(Vmath, ExpAcrossItsRangeAndClamp) {
  double worst = 0;
  uint32_t lo, hi;
  const float neg_zero = -0.0f, clamp = -104.0f;
  std::memcpy(&lo, &neg_zero, 4);
  std::memcpy(&hi, &clamp, 4);
  for (uint32_t b = lo; b <= hi; b += 64) {
    float x;
    std::memcpy(&x, &b, 4);
    worst = std::max(worst, ulp_error(vm::exp_nonpositive(x), std::exp(double(x))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(vm::exp_nonpositive(-103.0f), static_cast<float>(std::exp(-103.0)));  // subnormal
  EXPECT_EQ(vm::exp_nonpositive(-104.0f), 0.0f);
  EXPECT_EQ(vm::exp_nonpositive(-1e30f), 0.0f);

  const auto ulps = [](double got, long double want) {
    const double w = static_cast<double>(want);
    const double ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
    return static_cast<double>(fabsl(static_cast<long double>(got) - want)) / ulp;
  };
  double worst_d = 0;
  for (double x = 0; x > -746.0; x -= 0.0123)
    worst_d = std::max(worst_d, ulps(vm::exp_nonpositive(x), expl(x)));
  EXPECT_LE(worst_d, 2.0);
  EXPECT_GT(vm::exp_nonpositive(-744.0), 0.0);  // subnormal, not flushed
  EXPECT_EQ(vm::exp_nonpositive(-746.0), 0.0);
  EXPECT_EQ(vm::exp_nonpositive(-1e300), 0.0);
}

}  // namespace

// The gate activations of every kind (cpu/activations.hpp) at NaN and +-inf, through the
// block forms the recurrences call.
namespace {

template <class T>
void expect_activation_edges() {
  using rnncore::Activation;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T x[3] = {nan, inf, -inf};
  struct Want {
    Activation a;
    T at_inf, at_neg_inf, d_at_inf, d_at_neg_inf;
    bool nan_to_nan;
  };
  // relu: max(x, 0) is taken as x > 0 ? x : 0, which maps NaN to 0 (not checked here).
  const Want wants[] = {{Activation::None, inf, -inf, 1, 1, true},
                        {Activation::Relu, inf, 0, 1, 0, false},
                        {Activation::Tanh, 1, -1, 0, 0, true},
                        {Activation::Sigmoid, 1, 0, 0, 0, true},
                        {Activation::HardSigmoid, 1, 0, 0, 0, true}};
  for (const Want& w : wants) {
    T y[3], f[3], df[3];
    rnncore::cpu::activate(w.a, x, y, 3);
    rnncore::cpu::activate_grad(w.a, x, f, df, 3);
    const int a = static_cast<int>(w.a);
    if (w.nan_to_nan) {
      EXPECT_TRUE(std::isnan(y[0])) << a;
      EXPECT_TRUE(std::isnan(f[0])) << a;
    }
    EXPECT_EQ(y[1], w.at_inf) << a;
    EXPECT_EQ(y[2], w.at_neg_inf) << a;
    EXPECT_EQ(f[1], w.at_inf) << a;
    EXPECT_EQ(f[2], w.at_neg_inf) << a;
    EXPECT_EQ(df[1], w.d_at_inf) << a;
    EXPECT_EQ(df[2], w.d_at_neg_inf) << a;
  }
}

TEST(Activations, NaNAndInfinities) {
  expect_activation_edges<float>();
  expect_activation_edges<double>();
}

}  // namespace
