// Eight threads call every operation at once, forward and gradients, on shared inputs (the
// same arrays read by all) and on separate ones, while another changes the thread count;
// every result must be bit-identical to the same call made alone (with 4 threads, and
// with 1, 2, 3 and 8). The CPU backend shares one thread pool between callers (a call
// that finds it busy runs on its own thread); the emulator runs threadgroups on it, with a
// fiber scheduler per OS thread. Its own executable, so that the ThreadSanitizer job
// (.ci/sanitize) builds the library and this test only.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rnncore/rnncore.hpp"

namespace {

using namespace rnncore;

// A pool of several threads even on a small machine, so that the callers contend for it
// and its barriers are exercised.
constexpr int kThreads = 4;

using Bytes = std::vector<unsigned char>;
using Outputs = std::vector<Bytes>;

void add(Outputs& out, const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  out.emplace_back(p, p + t.nbytes());
}
void add(Outputs& out, const std::optional<Tensor>& t) {
  if (t) add(out, *t);
}

template <class T>
std::vector<T> random(int64_t n, uint32_t seed, double scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& e : v) e = static_cast<T>(u(gen));
  return v;
}

struct Sizes {
  int64_t T, N, I, H;
};

// One call with the arrays it reads (owned); run() makes it and returns every output.
struct Case {
  virtual ~Case() = default;
  virtual Outputs run() const = 0;
  std::string name;
};
using Factory = std::function<std::unique_ptr<Case>()>;

// Inputs shared by the three ops: x [T, N, I], W [D*G*H, I], R [D, G*H, H], bias, h0, a
// mask [N, D*H], the gradient of the output and of the final state.
template <class T>
struct Common {
  Sizes s;
  int64_t G, D;
  std::vector<T> x, W, R, b, h0, mask, dy, dh;
  Common(Sizes sz, int64_t gates, bool bidirectional, uint32_t seed)
      : s(sz), G(gates), D(bidirectional ? 2 : 1) {
    const int64_t GH = G * s.H, DH = D * s.H;
    x = random<T>(s.T * s.N * s.I, seed + 1, 1.0);
    W = random<T>(D * GH * s.I, seed + 2, 0.3);
    R = random<T>(D * GH * s.H, seed + 3, 0.3);
    b = random<T>(D * GH, seed + 4, 0.2);
    h0 = random<T>(s.N * DH, seed + 5, 0.5);
    mask = random<T>(s.N * DH, seed + 6, 1.0);
    for (T& m : mask) m = m < T(-0.6) ? T(0) : T(1.25);  // dropout-like
    dy = random<T>(s.T * s.N * DH, seed + 7, 1.0);
    dh = random<T>(s.N * DH, seed + 8, 1.0);
  }
  Shape r_shape() const { return D == 2 ? Shape{2, G * s.H, s.H} : Shape{G * s.H, s.H}; }
  template <class In>
  void fill(In& in) const {
    const int64_t DH = D * s.H;
    in.source = TensorView(x.data(), {s.T, s.N, s.I});
    in.recurrent_weight = TensorView(R.data(), r_shape());
    in.input_weight = TensorView(W.data(), {D * G * s.H, s.I});
    in.bias = TensorView(b.data(), {D * G * s.H});
    in.init_state = TensorView(h0.data(), {s.N, DH});
    in.mask = TensorView(mask.data(), {s.N, DH});
  }
  template <class GradIn>
  void fill_gradient(GradIn& in, const Tensor& z) const {
    fill(in);
    in.source_gradient = TensorView(dy.data(), {s.T, s.N, D * s.H});
    in.z_state = z.view();
    in.state_gradient = TensorView(dh.data(), {s.N, D * s.H});
  }
};

template <class T>
struct RnnCase : Case {
  Common<T> c;
  RNNDescriptor d;
  Device device;
  bool gradients;
  Tensor z;
  RnnCase(Sizes s, bool bidirectional, bool grads, Device dev, uint32_t seed)
      : c(s, 1, bidirectional, seed), device(dev), gradients(grads) {
    d.bidirectional = bidirectional;
    d.reverse = !bidirectional;
    d.activation = Activation::Tanh;
    d.training = true;
    name = std::string("rnn") + (grads ? "_gradients" : "");
    if (grads) z = *forward().z_state;
  }
  RNNResults forward() const {
    RNNInputs in;
    c.fill(in);
    return single_gate_rnn(in, d, device);
  }
  Outputs run() const override {
    Outputs out;
    if (!gradients) {
      const RNNResults r = forward();
      add(out, r.state), add(out, r.z_state);
      return out;
    }
    RNNGradientInputs in;
    c.fill_gradient(in, z);
    const RNNGradients g = single_gate_rnn_gradients(in, d, device);
    add(out, g.source), add(out, g.recurrent_weight), add(out, g.input_weight);
    add(out, g.bias), add(out, g.init_state);
    return out;
  }
};

template <class T>
struct LstmCase : Case {
  Common<T> c;
  std::vector<T> c0, peephole, dc;
  LSTMDescriptor d;
  Device device;
  bool gradients;
  Tensor z, cell;
  LstmCase(Sizes s, bool bidirectional, bool grads, Device dev, uint32_t seed)
      : c(s, 4, bidirectional, seed), device(dev), gradients(grads) {
    c0 = random<T>(s.N * c.D * s.H, seed + 11, 0.5);
    peephole = random<T>(c.D * 4 * s.H, seed + 12, 0.3);
    dc = random<T>(s.N * c.D * s.H, seed + 13, 1.0);
    d.bidirectional = bidirectional;
    d.reverse = !bidirectional;
    d.forget_gate_last = !bidirectional;
    d.produce_cell = true;
    d.training = true;
    name = std::string("lstm") + (grads ? "_gradients" : "");
    if (grads) {
      const LSTMResults r = forward();
      z = *r.z_state;
      cell = *r.cell;
    }
  }
  LSTMResults forward() const {
    LSTMInputs in;
    fill(in);
    return lstm(in, d, device);
  }
  template <class In>
  void fill(In& in) const {
    c.fill(in);
    in.init_cell = TensorView(c0.data(), {c.s.N, c.D * c.s.H});
    in.peephole = c.D == 2 ? TensorView(peephole.data(), {2, 4 * c.s.H})
                           : TensorView(peephole.data(), {4 * c.s.H});
  }
  Outputs run() const override {
    Outputs out;
    if (!gradients) {
      const LSTMResults r = forward();
      add(out, r.state), add(out, r.cell), add(out, r.z_state);
      return out;
    }
    LSTMGradientInputs in;
    c.fill_gradient(in, z);
    fill(in);
    in.cell_output_fwd = cell.view();
    in.cell_gradient = TensorView(dc.data(), {c.s.N, c.D * c.s.H});
    const LSTMGradients g = lstm_gradients(in, d, device);
    add(out, g.source), add(out, g.recurrent_weight), add(out, g.input_weight);
    add(out, g.bias), add(out, g.peephole), add(out, g.init_state), add(out, g.init_cell);
    return out;
  }
};

template <class T>
struct GruCase : Case {
  Common<T> c;
  std::vector<T> b2;
  GRUDescriptor d;
  Device device;
  bool gradients;
  Tensor z, y;
  GruCase(Sizes s, bool bidirectional, bool grads, Device dev, uint32_t seed)
      : c(s, 3, bidirectional, seed), device(dev), gradients(grads) {
    b2 = random<T>(c.D * s.H, seed + 21, 0.2);
    d.bidirectional = bidirectional;
    d.reverse = !bidirectional;
    d.reset_after = bidirectional;
    d.flip_z = !bidirectional;
    d.training = true;
    name = std::string("gru") + (grads ? "_gradients" : "");
    if (grads) {
      const GRUResults r = forward();
      z = *r.z_state;
      y = r.state;
    }
  }
  GRUResults forward() const {
    GRUInputs in;
    fill(in);
    return gru(in, d, device);
  }
  template <class In>
  void fill(In& in) const {
    c.fill(in);
    in.secondary_bias = TensorView(b2.data(), {c.D * c.s.H});
  }
  Outputs run() const override {
    Outputs out;
    if (!gradients) {
      const GRUResults r = forward();
      add(out, r.state), add(out, r.z_state);
      return out;
    }
    GRUGradientInputs in;
    c.fill_gradient(in, z);
    fill(in);
    in.output_fwd = y.view();
    const GRUGradients g = gru_gradients(in, d, device);
    add(out, g.source), add(out, g.recurrent_weight), add(out, g.input_weight);
    add(out, g.bias), add(out, g.init_state), add(out, g.secondary_bias);
    return out;
  }
};

// Every op, forward and gradients, uni- and bidirectional, in dtype T.
template <class T>
void add_cases(std::vector<Factory>& f, Sizes s, Device device, uint32_t seed) {
  const std::string type = sizeof(T) == 4 ? " float32" : " float64";
  for (bool grads : {false, true})
    for (bool bidi : {true, false}) {
      const std::string tag = type + (bidi ? " bidirectional" : " reverse");
      seed += 100;
      f.push_back([=] {
        auto c = std::make_unique<RnnCase<T>>(s, bidi, grads, device, seed);
        c->name += tag;
        return std::unique_ptr<Case>(std::move(c));
      });
      f.push_back([=] {
        auto c = std::make_unique<LstmCase<T>>(s, bidi, grads, device, seed);
        c->name += tag;
        return std::unique_ptr<Case>(std::move(c));
      });
      f.push_back([=] {
        auto c = std::make_unique<GruCase<T>>(s, bidi, grads, device, seed);
        c->name += tag;
        return std::unique_ptr<Case>(std::move(c));
      });
    }
}

// The serial results first; then `threads` threads released together, the even ones on
// the shared cases, the odd ones on their own copies, each going through every case
// `rounds` times from a different starting point.
void expect_concurrent_calls_match_serial(const std::vector<Factory>& factories, int threads,
                                          int rounds) {
  set_num_threads(kThreads);
  std::vector<std::unique_ptr<Case>> shared;
  std::vector<Outputs> want;
  for (const Factory& f : factories) {
    shared.push_back(f());
    want.push_back(shared.back()->run());
  }
  const size_t n = shared.size();
  // Alone with other thread counts: the same bits (the README's promise).
  for (int count : {1, 2, 3, 8}) {
    set_num_threads(count);
    for (size_t i = 0; i < n; ++i)
      EXPECT_TRUE(shared[i]->run() == want[i])
          << shared[i]->name << ": " << count << " threads differ from " << kThreads;
  }
  set_num_threads(kThreads);
  std::vector<std::vector<std::string>> errors(static_cast<size_t>(threads));
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<std::string>& err = errors[static_cast<size_t>(t)];
      try {
        std::vector<std::unique_ptr<Case>> own;
        if (t % 2)
          for (const Factory& f : factories) own.push_back(f());
        ready.fetch_add(1);
        while (ready.load() < threads) std::this_thread::yield();
        for (int r = 0; r < rounds; ++r)
          for (size_t k = 0; k < n; ++k) {
            const size_t i = (k + static_cast<size_t>(t) * 5) % n;
            const Case& c = t % 2 ? *own[i] : *shared[i];
            if (c.run() != want[i])
              err.push_back(c.name + (t % 2 ? " (own inputs)" : " (shared inputs)") + ": thread " +
                            std::to_string(t) + ", round " + std::to_string(r));
          }
      } catch (const std::exception& e) {
        ready.fetch_add(threads);  // release the others
        err.push_back("thread " + std::to_string(t) + " threw: " + e.what());
      }
    });
  // Meanwhile the thread count changes under the running calls.
  std::atomic<bool> done{false};
  std::thread changer([&] {
    for (int k = 0; !done.load(); ++k) {
      set_num_threads(1 + k % 8);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (std::thread& th : pool) th.join();
  done = true;
  changer.join();
  set_num_threads(kThreads);
  for (const auto& err : errors)
    for (const std::string& e : err) ADD_FAILURE() << "differs from the serial result: " << e;
}

TEST(Concurrency, EveryCpuOpFromEightThreadsMatchesSerialBitForBit) {
  std::vector<Factory> f;
  // H = 40 is not a multiple of the vector widths; N = 16 gives the pool row slices.
  add_cases<float>(f, {5, 16, 24, 40}, Device::Cpu, 1);
  add_cases<double>(f, {5, 16, 24, 40}, Device::Cpu, 2);
  expect_concurrent_calls_match_serial(f, 8, 2);
}

// Sizes at which the fused forward splits the hidden units over the pool and the gradients
// split the batch: bidirectional LSTM and GRU, float32 (issue 10, defect 6 was a
// bidirectional LSTM forward of this size whose last bits depended on what ran beside it).
TEST(Concurrency, LargeBidirectionalCallsFromEightThreadsMatchSerialBitForBit) {
  std::vector<Factory> f;
  const Sizes s{12, 32, 64, 128};
  for (bool grads : {false, true}) {
    f.push_back(
        [=] { return std::unique_ptr<Case>(new LstmCase<float>(s, true, grads, Device::Cpu, 7)); });
    f.push_back(
        [=] { return std::unique_ptr<Case>(new GruCase<float>(s, true, grads, Device::Cpu, 8)); });
  }
  expect_concurrent_calls_match_serial(f, 8, 1);
}

// Batch 1 with the units split over the pool: the LSTM and the reset-after GRU (the
// bidirectional case) fill x' themselves, blocks of rows made by whichever thread waits.
TEST(Concurrency, BatchOneCallsFillingTheirProjectionMatchSerialBitForBit) {
  std::vector<Factory> f;
  const Sizes s{40, 1, 24, 256};
  for (bool bidirectional : {false, true}) {
    f.push_back([=] {
      return std::unique_ptr<Case>(new LstmCase<float>(s, bidirectional, false, Device::Cpu, 9));
    });
    f.push_back([=] {
      return std::unique_ptr<Case>(new GruCase<float>(s, bidirectional, false, Device::Cpu, 10));
    });
  }
  expect_concurrent_calls_match_serial(f, 8, 1);
}

TEST(Concurrency, EveryEmulatedOpFromEightThreadsMatchesSerialBitForBit) {
  const auto devices = available_devices();
  if (std::find(devices.begin(), devices.end(), "metal-emulated") == devices.end())
    GTEST_SKIP() << "no metal-emulated device in this build";
  std::vector<Factory> f;
  add_cases<float>(f, {3, 4, 5, 9}, Device::MetalEmulated, 3);
  expect_concurrent_calls_match_serial(f, 8, 1);
}

}  // namespace

// ---- the block cache (core/block_cache.hpp) ------------------------------------------------

#include "core/block_cache.hpp"

namespace {

TEST(BlockCache, ReusesABlockOnlyOnceItsOwnerLetsGo) {
  const Shape shape{3, 1 << 18};  // 3 MiB of float32
  Tensor a = detail::cached_empty(shape, DType::Float32);
  const void* first = a.data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  Tensor b = detail::cached_empty(shape, DType::Float32);  // a is still held: another block
  EXPECT_NE(b.data(), first);
  a = Tensor();
  Tensor c = detail::cached_empty(shape, DType::Float32);
  EXPECT_EQ(c.data(), first);
  EXPECT_EQ(c.shape(), shape);
  // A much smaller array does not take (and waste) a large idle block.
  c = Tensor();
  Tensor d = detail::cached_empty({1 << 18}, DType::Float32);
  EXPECT_NE(d.data(), first);
  // Below the threshold: plain allocations.
  Tensor e = detail::cached_empty({16}, DType::Float64);
  EXPECT_EQ(e.nbytes(), 128);
  // From 128 KiB on (where malloc maps fresh pages): a GRU(256)'s weight gradient. Its
  // block stays with the cache, not with malloc, which would give it to the next malloc.
  Tensor g = detail::cached_empty({768, 256}, DType::Float32);
  const void* grad = g.data();
  g = Tensor();
  void* other = std::malloc(768 * 256 * sizeof(float));
  EXPECT_EQ(detail::cached_empty({768, 256}, DType::Float32).data(), grad);
  std::free(other);
}

TEST(BlockCache, ThreadsTakingAndGivingBlocksNeverShareOne) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t, &bad] {
      for (int i = 0; i < 200; ++i) {
        const int64_t n = (int64_t(1) << 18) + 4096 * ((t + i) % 3);
        Tensor x = detail::cached_empty({n}, DType::Float32);
        float* p = x.ptr<float>();
        for (int64_t j = 0; j < n; j += 1024) p[j] = static_cast<float>(t * 1000 + i);
        std::this_thread::yield();
        for (int64_t j = 0; j < n; j += 1024)
          if (p[j] != static_cast<float>(t * 1000 + i)) bad.fetch_add(1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
