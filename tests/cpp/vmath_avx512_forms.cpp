// vmath's AVX-512 forms over arrays, for test_vmath_vector.cpp: the only code built with
// -mavx512f in the tests, and nothing here that another translation unit also defines (no
// gtest, no std templates), so that no AVX-512 copy of a shared inline function can be the
// one the linker keeps for a processor without it.
#include <cstdint>

#include "cpu/vmath.hpp"

namespace rnncore_test {

namespace v16 = rnncore::cpu::vmath::v16;

void avx512_sigmoid(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, v16::sigmoid(_mm512_loadu_ps(x + i)));
}
void avx512_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, v16::tanh(_mm512_loadu_ps(x + i)));
}
void avx512_exp_nonpositive(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, v16::exp_nonpositive(_mm512_loadu_ps(x + i)));
}

}  // namespace rnncore_test
