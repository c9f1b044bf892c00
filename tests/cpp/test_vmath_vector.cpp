// vmath's vector sigmoid, tanh and exp (the fused kernels' activations on AVX-512 and on AVX2)
// against float64 libm over every 64th float bit pattern, and their special values. The forms
// run in vmath_avx512_forms.cpp and vmath_avx2_forms.cpp (each built for its instruction
// set); each test skips on a processor without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rnncore_test {
void avx512_sigmoid(const float* x, float* y, int64_t n);
void avx512_tanh(const float* x, float* y, int64_t n);
void avx512_exp_nonpositive(const float* x, float* y, int64_t n);
void avx2_sigmoid(const float* x, float* y, int64_t n);
void avx2_tanh(const float* x, float* y, int64_t n);
void avx2_exp_nonpositive(const float* x, float* y, int64_t n);
}  // namespace rnncore_test

namespace {

using Form = void (*)(const float*, float*, int64_t);
struct Forms {
  const char* name;
  bool (*runs)();
  Form sigmoid, tanh, exp_nonpositive;
  double sigmoid_ulps, tanh_ulps, exp_ulps;  // bounds, a little above the measured worst
};
// Measured over the sweep: AVX-512 2.61, 1.84 and 0.87 ulp (its tanh by e^-2|x| - 1, see
// vmath.hpp); AVX2 2.61, 1.49 and 0.87 (the scalar forms: 2.82 and 1.57 over every pattern).
const Forms kForms[] = {
    {"avx512", [] { return bool(__builtin_cpu_supports("avx512f")); }, rnncore_test::avx512_sigmoid,
     rnncore_test::avx512_tanh, rnncore_test::avx512_exp_nonpositive, 2.75, 1.95, 0.9},
    {"avx2", [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); },
     rnncore_test::avx2_sigmoid, rnncore_test::avx2_tanh, rnncore_test::avx2_exp_nonpositive, 2.75,
     1.6, 0.9},
};

class VmathVector : public ::testing::TestWithParam<Forms> {
 protected:
  void SetUp() override {
    if (!GetParam().runs()) GTEST_SKIP() << "no " << GetParam().name;
  }
};
INSTANTIATE_TEST_SUITE_P(Forms, VmathVector, ::testing::ValuesIn(kForms),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// |got - want| in ulps of want as a float (subnormal ulps below the normal range).
double ulp_error(float got, double want) {
  const float mag = std::fabs(static_cast<float>(want));
  const double ulp = static_cast<double>(std::nextafter(mag, INFINITY)) - mag;
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

std::vector<float> map16(void (*f)(const float*, float*, int64_t), const std::vector<float>& x) {
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

std::vector<float> sweep(uint32_t step) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += step) {
    const auto u = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) x.push_back(f);
  }
  for (float f : {0.f, -0.f, 0.55f, -0.55f, 100.f, -100.f, 88.7f, -88.7f, -104.f, 1e-30f})
    x.push_back(f);
  x.resize(x.size() / 16 * 16);
  return x;
}

TEST_P(VmathVector, SigmoidAndTanhWithinTheirUlpBounds) {
  const auto x = sweep(64);
  const auto s = map16(GetParam().sigmoid, x);
  const auto t = map16(GetParam().tanh, x);
  double ws = 0, wt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ws = std::max(ws, ulp_error(s[i], 1.0 / (1.0 + std::exp(-double(x[i])))));
    wt = std::max(wt, ulp_error(t[i], std::tanh(double(x[i]))));
  }
  EXPECT_LE(ws, GetParam().sigmoid_ulps);
  EXPECT_LE(wt, GetParam().tanh_ulps);
}

TEST_P(VmathVector, ExpAcrossItsRangeAndClamp) {
  std::vector<float> x;
  for (float v = -110.0f; v <= 0.0f; v += 0.00171f) x.push_back(v);
  x.resize(x.size() / 16 * 16);
  const auto e = map16(GetParam().exp_nonpositive, x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    // Below -104 the argument is clamped there (the result is 0 or the least subnormal).
    const double want = std::exp(double(std::max(x[i], -104.0f)));
    worst = std::max(worst, ulp_error(e[i], want));
  }
  EXPECT_LE(worst, GetParam().exp_ulps);
}

TEST_P(VmathVector, SpecialValues) {
  const float inf = INFINITY, nan = std::nanf("");
  std::vector<float> x = {nan,   -nan,   inf,    -inf,    0.f,  -0.f,  100.f, -100.f,
                          1e30f, -1e30f, 1e-40f, -1e-40f, 2.5f, -2.5f, 0.55f, -0.55f};
  const auto s = map16(GetParam().sigmoid, x);
  const auto t = map16(GetParam().tanh, x);
  EXPECT_TRUE(std::isnan(s[0]) && std::isnan(s[1]) && std::isnan(t[0]) && std::isnan(t[1]));
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[3], 0.0f);
  EXPECT_EQ(t[2], 1.0f);
  EXPECT_EQ(t[3], -1.0f);
  EXPECT_EQ(s[4], 0.5f);
  EXPECT_EQ(s[5], 0.5f);
  EXPECT_EQ(t[4], 0.0f);
  EXPECT_FALSE(std::signbit(t[4]));
  EXPECT_EQ(t[5], 0.0f);
  EXPECT_TRUE(std::signbit(t[5]));  // tanh is odd: -0 stays -0
  EXPECT_EQ(s[6], 1.0f);
  EXPECT_LE(ulp_error(s[7], 1.0 / (1.0 + std::exp(100.0))), 1.0);  // a subnormal, not 0 or NaN
  EXPECT_EQ(t[8], 1.0f);
  EXPECT_EQ(t[9], -1.0f);
  EXPECT_EQ(t[10], 1e-40f);  // a subnormal argument: tanh x = x
  EXPECT_EQ(t[11], -1e-40f);
  for (size_t i = 12; i < x.size(); ++i) {
    EXPECT_LE(ulp_error(s[i], 1.0 / (1.0 + std::exp(-double(x[i])))), 3.0) << x[i];
    EXPECT_LE(ulp_error(t[i], std::tanh(double(x[i]))), 2.0) << x[i];
  }
}

}  // namespace
