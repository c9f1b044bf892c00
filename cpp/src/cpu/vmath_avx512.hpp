// vmath's float32 array forms built for AVX-512 (vmath_avx512.cpp); call only where the
// processor has AVX-512F (vmath.cpp checks).
#pragma once

#include <cstdint>

namespace rnncore::cpu::vmath::avx512 {
void sigmoid(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void sigmoid_grad(const float* x, float* y, float* dy, int64_t n);
void tanh_grad(const float* x, float* y, float* dy, int64_t n);
}  // namespace rnncore::cpu::vmath::avx512
