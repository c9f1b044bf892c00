// The CPU backend: BLAS for the products, hand-written fused passes for the gates, and
// the two directions of a bidirectional layer on two threads.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "cpu/fused.hpp"
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
    parallel_gemm<T>(false, true, rows, cols, K, T(1), source, K, W, K, bias ? T(1) : T(0), xp,
                     cols);
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

template <class T>
void run_direction(const Problem& p, const DirectionBackward& a) {
  switch (p.op) {
    case detail::OpKind::Rnn: return rnn_backward<T>(p, a);
    case detail::OpKind::Lstm: return lstm_backward<T>(p, a);
    case detail::OpKind::Gru: return gru_backward<T>(p, a);
  }
}

template <class T>
void input_gradients_impl(const Problem& p, const T* dxp, const T* source, const T* W,
                          T* dsource, T* dW, T* dbias) {
  const int64_t rows = p.T * p.N, cols = p.D * p.gh(), I = p.I;
  if (dsource && W)
    parallel_gemm<T>(false, false, rows, I, cols, T(1), dxp, cols, W, I, T(0), dsource, I);
  if (dW) parallel_gemm<T>(true, false, cols, I, rows, T(1), dxp, cols, source, I, T(0), dW, I);
  if (dbias) {
    for (int64_t j = 0; j < cols; ++j) dbias[j] = T(0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) dbias[j] += dxp[r * cols + j];
  }
}

// Runs f(dirs[d]) for every direction, the second one on its own thread when the work
// is large enough to pay for it (about a million multiply-adds).
template <class Dir, class F>
void for_each_direction(const Problem& p, const Dir* dirs, F&& f) {
  const bool threaded = p.D == 2 && p.T * p.N * p.G * p.H * p.H >= (int64_t(1) << 20);
  if (!threaded) {
    for (int64_t d = 0; d < p.D; ++d) f(dirs[d]);
    return;
  }
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      f(dirs[1]);
    } catch (...) {
      error = std::current_exception();
    }
  });
  try {
    f(dirs[0]);
  } catch (...) {
    worker.join();
    throw;
  }
  worker.join();
  if (error) std::rethrow_exception(error);
}

template <class Dir>
void run_all(const Problem& p, const Dir* dirs) {
  for_each_direction(p, dirs, [&p](const Dir& a) {
    if (p.dtype == DType::Float32)
      run_direction<float>(p, a);
    else
      run_direction<double>(p, a);
  });
}

// RNNCORE_CPU_PATH=blas keeps float32 on the BLAS-per-step path (tests compare the two).
bool blas_path_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("RNNCORE_CPU_PATH");
    return v && std::strcmp(v, "blas") == 0;
  }();
  return forced;
}

class CpuBackend final : public detail::Backend {
 public:
  CpuBackend() { claim_blas_threads(); }
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
    if (p.dtype == DType::Float32 && !blas_path_forced())
      fused_forward(p, dirs);
    else
      run_all(p, dirs);
  }

  void backward(const Problem& p, const DirectionBackward* dirs) override { run_all(p, dirs); }

  void input_gradients(const Problem& p, const void* dxp, const void* source, const void* W,
                       void* dsource, void* dW, void* dbias) override {
    if (p.dtype == DType::Float32)
      input_gradients_impl(p, static_cast<const float*>(dxp), static_cast<const float*>(source),
                           static_cast<const float*>(W), static_cast<float*>(dsource),
                           static_cast<float*>(dW), static_cast<float*>(dbias));
    else
      input_gradients_impl(p, static_cast<const double*>(dxp),
                           static_cast<const double*>(source), static_cast<const double*>(W),
                           static_cast<double*>(dsource), static_cast<double*>(dW),
                           static_cast<double*>(dbias));
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
