// Prints what the application's metal-cpp and rnncore see, then runs a small GRU on rnncore's
// best device (Metal on Apple silicon).
#include <cstdio>
#include <rnncore/rnncore.hpp>
#include <string>
#include <vector>

std::string consumer_devices();

int main() {
  std::printf("%s\n", consumer_devices().c_str());
  const int64_t T = 3, N = 2, I = 4, H = 8;
  std::vector<float> x(T * N * I, 0.5f), W(3 * H * I, 0.1f), R(3 * H * H, -0.05f);
  rnncore::GRUInputs in;
  in.source = rnncore::TensorView(x.data(), {T, N, I});
  in.input_weight = rnncore::TensorView(W.data(), {3 * H, I});
  in.recurrent_weight = rnncore::TensorView(R.data(), {3 * H, H});
  try {
    rnncore::GRUResults out = rnncore::gru(in, rnncore::GRUDescriptor{});
    std::printf("gru on %s: y[T-1, 0, 0] = %+.6f\n",
                rnncore::device_name(rnncore::default_device()),
                out.state.ptr<float>()[((T - 1) * N) * H]);
  } catch (const rnncore::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
