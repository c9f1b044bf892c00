// Runs a bidirectional GRU over a batch of random sequences and prints the final states.
#include <cstdio>
#include <random>
#include <rnncore/rnncore.hpp>
#include <vector>

int main() {
  const int64_t T = 20, N = 4, I = 8, H = 16, D = 2;
  std::mt19937 gen(42);
  std::normal_distribution<float> normal(0.f, 0.3f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  std::vector<float> x = random(T * N * I), W = random(D * 3 * H * I), R = random(D * 3 * H * H),
                     b = random(D * 3 * H);

  rnncore::GRUInputs in;
  in.source = rnncore::TensorView(x.data(), {T, N, I});
  in.input_weight = rnncore::TensorView(W.data(), {D * 3 * H, I});
  in.recurrent_weight = rnncore::TensorView(R.data(), {D, 3 * H, H});
  in.bias = rnncore::TensorView(b.data(), {D * 3 * H});
  rnncore::GRUDescriptor desc;
  desc.bidirectional = true;
  desc.reset_after = true;

  try {
    rnncore::GRUResults out = rnncore::gru(in, desc, rnncore::Device::Cpu);
    const float* y = out.state.ptr<float>();
    std::printf("rnncore %s, state shape %s\n", rnncore::version(),
                rnncore::shape_to_string(out.state.shape()).c_str());
    // Final forward state: y[T-1, n, 0:H]; final backward state: y[0, n, H:2H].
    for (int64_t n = 0; n < N; ++n)
      std::printf("sequence %lld: forward h[0] = %+.6f, backward h[0] = %+.6f\n",
                  static_cast<long long>(n), y[((T - 1) * N + n) * D * H], y[n * D * H + H]);
  } catch (const rnncore::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
