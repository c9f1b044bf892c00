// vmath's AVX2 forms over arrays, for test_vmath_vector.cpp: built with -mavx2 -mfma alone,
// and nothing here that another translation unit also defines (see vmath_avx512_forms.cpp).
#include <cstdint>

#include "cpu/vmath.hpp"

namespace rnncore_test {

namespace v8 = rnncore::cpu::vmath::v8;

void avx2_sigmoid(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, v8::sigmoid(_mm256_loadu_ps(x + i)));
}
void avx2_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, v8::tanh(_mm256_loadu_ps(x + i)));
}
void avx2_exp_nonpositive(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, v8::exp_nonpositive(_mm256_loadu_ps(x + i)));
}

}  // namespace rnncore_test
