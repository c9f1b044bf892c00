// The CPU backend: BLAS for the products, hand-written fused passes for the gates, and
// the two directions of a bidirectional layer on two threads.
#include <cstring>
#include <exception>
#include <thread>

#include "cpu/recurrence.hpp"

namespace rnncore::cpu {
namespace {

template <class T>
void project_impl(const Problem& p, const T* source, int64_t K, const T* W, const T* bias,
                  T* xp) {
  const int64_t rows = p.T * p.N, cols = p.D * p.gh();
  if (bias)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(xp + r * cols, bias, static_cast<size_t>(cols) * sizeof(T));
  if (W) {
    gemm<T>(false, true, rows, cols, K, T(1), source, K, W, K, bias ? T(1) : T(0), xp, cols);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      T* o = xp + r * cols;
      const T* s = source + r * cols;
      if (bias)
        for (int64_t j = 0; j < cols; ++j) o[j] += s[j];
      else
        std::memcpy(o, s, static_cast<size_t>(cols) * sizeof(T));
    }
  }
}

template <class T>
void run_direction(const Problem& p, const DirectionForward& a) {
  switch (p.op) {
    case detail::OpKind::Rnn: return rnn_forward<T>(p, a);
    case detail::OpKind::Lstm: return lstm_forward<T>(p, a);
    case detail::OpKind::Gru: return gru_forward<T>(p, a);
  }
}

class CpuBackend final : public detail::Backend {
 public:
  const char* name() const override { return "cpu"; }

  Tensor allocate(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }

  void project(const Problem& p, const void* source, int64_t K, const void* W, const void* bias,
               void* xp) override {
    if (p.dtype == DType::Float32)
      project_impl(p, static_cast<const float*>(source), K, static_cast<const float*>(W),
                   static_cast<const float*>(bias), static_cast<float*>(xp));
    else
      project_impl(p, static_cast<const double*>(source), K, static_cast<const double*>(W),
                   static_cast<const double*>(bias), static_cast<double*>(xp));
  }

  void forward(const Problem& p, const DirectionForward* dirs) override {
    auto run = [&p](const DirectionForward& a) {
      if (p.dtype == DType::Float32)
        run_direction<float>(p, a);
      else
        run_direction<double>(p, a);
    };
    // The directions are independent; below about a million multiply-adds a thread costs
    // more than it saves.
    const bool threaded = p.D == 2 && p.T * p.N * p.G * p.H * p.H >= (int64_t(1) << 20);
    if (!threaded) {
      for (int64_t d = 0; d < p.D; ++d) run(dirs[d]);
      return;
    }
    std::exception_ptr error;
    std::thread worker([&] {
      try {
        run(dirs[1]);
      } catch (...) {
        error = std::current_exception();
      }
    });
    try {
      run(dirs[0]);
    } catch (...) {
      worker.join();
      throw;
    }
    worker.join();
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace
}  // namespace rnncore::cpu

namespace rnncore::detail {

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace rnncore::detail
