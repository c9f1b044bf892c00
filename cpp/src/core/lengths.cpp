#include "core/lengths.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu/activations.hpp"
#include "cpu/narrow.hpp"
#include "cpu/thread_pool.hpp"
#include "metal/emulator/half.hpp"

namespace rnncore::detail {
namespace {

// A stored element and the type it is computed in (float16 in float, as the kernels do).
template <class S>
struct Elem {
  using C = S;
  static C get(S v) { return v; }
  static S put(C v) { return v; }
};
template <>
struct Elem<uint16_t> {
  using C = float;
  static C get(uint16_t v) { return metal::emu::half_bits_to_float(v); }
  static uint16_t put(C v) { return metal::emu::float_to_half_bits(v); }
};
// bfloat16 storage: the upper half of a float32 (rounded to nearest even).
struct BFloat16Bits {
  uint16_t bits;
};
template <>
struct Elem<BFloat16Bits> {
  using C = float;
  static C get(BFloat16Bits v) { return cpu::bfloat16_to_float(v.bits); }
  static BFloat16Bits put(C v) { return {cpu::float_to_bfloat16(v)}; }
};

// Which rows run when. Rows sorted by length, longest first (ties in row order); segment j
// covers processing steps [bounds[j], bounds[j+1]) over the rows longer than bounds[j].
// Rows that end inside a segment run on to its end on zero input; their extra steps are
// neither placed in the outputs nor given a gradient (so they add exact zeros).
struct Schedule {
  std::vector<int64_t> order, len;
  std::vector<int64_t> bounds;
  int64_t active(int64_t step) const {  // rows longer than `step`
    return std::lower_bound(len.begin(), len.end(), step, std::greater<int64_t>()) - len.begin();
  }
  int64_t segments() const { return static_cast<int64_t>(bounds.size()) - 1; }
  int64_t peak() const {  // the most row-steps of one segment
    int64_t most = 0;
    for (size_t j = 0; j + 1 < bounds.size(); ++j)
      most = std::max(most, (bounds[j + 1] - bounds[j]) * active(bounds[j]));
    return most;
  }
};

// call_cost: what one backend call costs beyond its rows' steps, in row-steps. The
// boundaries minimise rows × steps + call_cost × calls over the distinct lengths (dynamic
// programming; the candidates thinned to 512 for very many distinct lengths).
Schedule schedule(const int64_t* lengths, int64_t N, double call_cost) {
  Schedule s;
  s.order.resize(static_cast<size_t>(N));
  std::iota(s.order.begin(), s.order.end(), int64_t{0});
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  for (int64_t r : s.order) s.len.push_back(lengths[r]);
  std::vector<int64_t> cand = {0};
  for (auto it = s.len.rbegin(); it != s.len.rend(); ++it)
    if (*it > cand.back()) cand.push_back(*it);
  if (cand.size() == 1) return s;  // every row is empty
  if (cand.size() > 513) {
    std::vector<int64_t> thin = {0};
    const size_t m = cand.size() - 1;
    for (size_t k = 1; k <= 512; ++k) thin.push_back(cand[(k * m + 511) / 512]);
    thin.erase(std::unique(thin.begin(), thin.end()), thin.end());
    cand = thin;
  }
  const size_t m = cand.size();
  std::vector<double> best(m, 0.0);
  std::vector<size_t> from(m, 0);
  for (size_t b = 1; b < m; ++b) {
    best[b] = -1;
    for (size_t a = 0; a < b; ++a) {
      const double c =
          best[a] +
          static_cast<double>(s.active(cand[a])) * static_cast<double>(cand[b] - cand[a]) +
          call_cost;
      if (best[b] < 0 || c < best[b]) best[b] = c, from[b] = a;
    }
  }
  for (size_t b = m - 1;; b = from[b]) {
    s.bounds.push_back(cand[b]);
    if (b == 0) break;
  }
  std::reverse(s.bounds.begin(), s.bounds.end());
  return s;
}

// One backend call's fixed cost in row-steps (a row-step: one row's recurrent and input
// products, G·H·(H + I) multiply-adds). Measured on the CPU (H = 256): about 300 µs a
// forward call at any T·N (the weights packed, threads woken), 50 row-steps; a gradient
// call packs and writes more. Small layers pay the dispatch alone.
// RNNCORE_SEGMENT_COST overrides it (tests: 0 puts a segment boundary at every length).
double call_cost(const Problem& p, bool gradients) {
  if (const char* forced = std::getenv("RNNCORE_SEGMENT_COST"); forced && *forced)
    return std::atof(forced);
  const double row_step = static_cast<double>(p.gh()) * static_cast<double>(p.H + p.I);
  const double dispatch = 1.5e6, per_weight = 50;
  return (gradients ? 2 : 1) * (dispatch + per_weight * row_step) / row_step;
}

// The layout of one direction of p: where its columns sit in the caller's arrays and where a
// processing step of a row goes in input and output time.
struct Direction {
  const Problem& p;
  int64_t d;
  bool reverse;   // processes its rows' inputs from their last step back
  bool aligned;   // the backward half of a bidirectional op: outputs in input time
  int64_t I_sub;  // source columns this direction reads
  int64_t src_col;

  Direction(const Problem& p_, int64_t d_)
      : p(p_),
        d(d_),
        reverse(p_.D == 2 ? d_ == 1 : p_.reverse),
        aligned(p_.D == 2 && d_ == 1),
        I_sub(p_.has_input_weight ? p_.I : p_.gh()),
        src_col(p_.has_input_weight ? 0 : d_ * p_.gh()) {}

  int64_t input_time(int64_t step, int64_t len) const { return reverse ? len - 1 - step : step; }
  int64_t output_time(int64_t step, int64_t len) const { return aligned ? len - 1 - step : step; }

  // The one-direction, forward-order problem of a segment.
  Problem segment(int64_t T, int64_t N) const {
    Problem q = p;
    q.T = T;
    q.N = N;
    q.D = 1;
    q.I = I_sub;
    q.reverse = false;
    q.gru.bidirectional = false;
    q.gru.reverse = false;
    if (q.op == OpKind::Lstm) q.produce_cell = true;  // the next segment starts from its cell
    return q;
  }

  // This direction's weights (every per-direction block is contiguous).
  template <class S>
  ForwardArrays weights(const ForwardArrays& a) const {
    const int64_t GH = p.gh(), H = p.H;
    ForwardArrays b;
    auto at = [](const void* base, int64_t off) -> const void* {
      return base ? static_cast<const S*>(base) + off : nullptr;
    };
    b.input_weight = at(a.input_weight, d * GH * p.I);
    b.recurrent_weight = at(a.recurrent_weight, d * GH * H);
    b.bias = at(a.bias, d * GH);
    b.peephole = at(a.peephole, d * 4 * H);
    b.secondary_bias = at(a.secondary_bias, d * H);
    return b;
  }
};

// f(t0, t1) over [0, n) in blocks the pool's threads claim: the copies here are memory-bound
// and page-fault into fresh outputs, which two cores do faster than one.
template <class F>
void blocks(int64_t n, int64_t bytes_per_item, F&& f) {
  const int64_t chunks = std::min<int64_t>(n, std::max<int64_t>(1, n * bytes_per_item >> 18));
  cpu::ThreadPool::instance().parallel_for(
      chunks, [&](int64_t c) { f(n * c / chunks, n * (c + 1) / chunks); });
}

template <class S>
S* data(Tensor& t) {
  return static_cast<S*>(t.data());
}

// Memory every segment of a chain reuses, sized for the largest: host scratch, or the
// backend's own memory for what the backend writes.
template <class S>
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType t, int64_t elements, Backend* be = nullptr)
      : t_(be ? be->allocate({elements}, t) : Tensor::empty({elements}, t)) {}
  S* get() { return static_cast<S*>(t_.data()); }
  explicit operator bool() const { return t_.data() != nullptr; }

 private:
  Tensor t_;
};

// A [steps, rows, width] block of `src` ([T, N, row] with this direction's `width` columns
// at `col`; null: zeros), in processing order for the segment's sorted rows, into `out`;
// zeros past each row's length.
template <class S>
void gather(const Schedule& s, const Direction& dir, int64_t s0, int64_t steps, int64_t rows,
            const void* src, int64_t row, int64_t col, int64_t width, bool input_time, S* out) {
  const S* in = static_cast<const S*>(src);
  blocks(steps, rows * width * static_cast<int64_t>(sizeof(S)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t i = 0; i < rows; ++i) {
        S* o = out + (k * rows + i) * width;
        const int64_t step = s0 + k, len = s.len[static_cast<size_t>(i)];
        if (!in || step >= len) {
          std::memset(o, 0, static_cast<size_t>(width) * sizeof(S));
          continue;
        }
        const int64_t tt = input_time ? dir.input_time(step, len) : dir.output_time(step, len);
        std::memcpy(o, in + (tt * dir.p.N + s.order[static_cast<size_t>(i)]) * row + col,
                    static_cast<size_t>(width) * sizeof(S));
      }
  });
}

// The inverse: a segment's [steps, rows, width] output placed into `dst`, or added to it.
template <class S>
void scatter(const Schedule& s, const Direction& dir, int64_t s0, int64_t steps, int64_t rows,
             const S* in, void* dst, int64_t row, int64_t col, int64_t width, bool input_time,
             bool add) {
  using E = Elem<S>;
  S* out = static_cast<S*>(dst);
  blocks(steps, rows * width * static_cast<int64_t>(sizeof(S)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t step = s0 + k, len = s.len[static_cast<size_t>(i)];
        if (step >= len) continue;
        const int64_t tt = input_time ? dir.input_time(step, len) : dir.output_time(step, len);
        S* o = out + (tt * dir.p.N + s.order[static_cast<size_t>(i)]) * row + col;
        const S* v = in + (k * rows + i) * width;
        if (!add) {
          std::memcpy(o, v, static_cast<size_t>(width) * sizeof(S));
        } else {
          for (int64_t h = 0; h < width; ++h) o[h] = E::put(E::get(o[h]) + E::get(v[h]));
        }
      }
  });
}

// [rows, H]: this direction's columns of an [N, D*H] array for the sorted rows, into out.
template <class S>
void rows_of(const Schedule& s, const Problem& p, int64_t d, int64_t rows, const void* src,
             S* out) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(out + i * p.H,
                static_cast<const S*>(src) + s.order[static_cast<size_t>(i)] * p.dh() + d * p.H,
                static_cast<size_t>(p.H) * sizeof(S));
}

// The mask of this direction for the sorted rows, [rows, H] (a prefix serves every segment).
template <class S>
Buffer<S> mask_of(const Schedule& s, const Problem& p, int64_t d, int64_t rows,
                  const ForwardArrays& a) {
  Buffer<S> t(p.dtype, rows * p.H);
  const S* m = static_cast<const S*>(a.mask);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < p.H; ++h)
      t.get()[i * p.H + h] =
          m[(a.mask_rows == 1 ? 0 : s.order[static_cast<size_t>(i)]) * a.mask_cols +
            (a.mask_cols == 1 ? 0 : d * p.H + h)];
  return t;
}

template <class S>
void forward_direction(Backend& be, const Problem& p, const ForwardArrays& a, const Schedule& s,
                       int64_t d) {
  const Direction dir(p, d);
  const int64_t H = p.H, ZH = p.ZG * H, peak = s.peak(), n0 = s.active(0);
  const bool lstm = p.op == OpKind::Lstm;
  ForwardArrays b = dir.weights<S>(a);
  Buffer<S> mask, h0, c0, src(p.dtype, peak * dir.I_sub), z;
  // Two of each: a segment starts from the last step of the one before.
  Buffer<S> state[2] = {{p.dtype, peak * H, &be}, {p.dtype, peak * H, &be}}, cell[2];
  if (lstm) cell[0] = {p.dtype, peak * H, &be}, cell[1] = {p.dtype, peak * H, &be};
  if (p.training) z = {p.dtype, peak * ZH, &be};
  if (a.mask) mask = mask_of<S>(s, p, d, n0, a);
  if (a.init_state) h0 = {p.dtype, n0 * H}, rows_of<S>(s, p, d, n0, a.init_state, h0.get());
  if (a.init_cell) c0 = {p.dtype, n0 * H}, rows_of<S>(s, p, d, n0, a.init_cell, c0.get());
  int64_t last = 0;  // offset of the previous segment's last step
  for (int64_t j = 0; j < s.segments(); ++j) {
    const int64_t s0 = s.bounds[static_cast<size_t>(j)], cur = j % 2, prev = 1 - cur;
    const int64_t steps = s.bounds[static_cast<size_t>(j) + 1] - s0, rows = s.active(s0);
    Problem q = dir.segment(steps, rows);
    gather<S>(s, dir, s0, steps, rows, a.source, p.I, dir.src_col, dir.I_sub, true, src.get());
    b.source = src.get();
    q.has_init_state = j > 0 || a.init_state;
    b.init_state = j > 0 ? state[prev].get() + last : h0.get();
    if (lstm) {
      q.has_init_cell = j > 0 || a.init_cell;
      b.init_cell = j > 0 ? cell[prev].get() + last : c0.get();
    }
    if (a.mask) b.mask = mask.get(), b.mask_rows = rows, b.mask_cols = H;
    b.state = state[cur].get();
    b.cell = lstm ? cell[cur].get() : nullptr;
    b.z_state = p.training ? z.get() : nullptr;
    be.forward(q, b);
    scatter<S>(s, dir, s0, steps, rows, state[cur].get(), a.state, p.dh(), d * H, H, false, false);
    if (a.cell)
      scatter<S>(s, dir, s0, steps, rows, cell[cur].get(), a.cell, p.dh(), d * H, H, false, false);
    if (a.z_state)
      scatter<S>(s, dir, s0, steps, rows, z.get(), a.z_state, p.D * ZH, d * ZH, ZH, false, false);
    last = (steps - 1) * rows * H;
  }
}

// h at processing step `step` of the sorted rows [0, rows) (each longer than step), from
// what a gradient call is given: the GRU's forward output, or recomputed from the training
// state (RNN: h = σ(z); LSTM: h = σ_o(a_o) ⊙ φ(c)) as the forward computed it; into out.
template <class S>
void state_at(const Schedule& s, const Direction& dir, const BackwardArrays& a, int64_t step,
              int64_t rows, S* out) {
  using E = Elem<S>;
  using C = typename E::C;
  const Problem& p = dir.p;
  const int64_t H = p.H, ZH = p.ZG * H;
  std::vector<C> u(static_cast<size_t>(H)), v(static_cast<size_t>(H));
  for (int64_t i = 0; i < rows; ++i, out += H) {
    const int64_t len = s.len[static_cast<size_t>(i)];
    const int64_t at = dir.output_time(step, len) * p.N + s.order[static_cast<size_t>(i)];
    if (p.op == OpKind::Gru) {
      std::memcpy(out, static_cast<const S*>(a.h_fwd) + at * p.dh() + dir.d * H,
                  static_cast<size_t>(H) * sizeof(S));
      continue;
    }
    const S* z = static_cast<const S*>(a.z_state) + at * p.D * ZH + dir.d * ZH;
    if (p.op == OpKind::Rnn) {
      for (int64_t h = 0; h < H; ++h) u[static_cast<size_t>(h)] = E::get(z[h]);
      cpu::activate<C>(p.gate_act[0], u.data(), u.data(), H);
    } else {
      const S* c = static_cast<const S*>(a.c_fwd) + at * p.dh() + dir.d * H;
      for (int64_t h = 0; h < H; ++h) {
        u[static_cast<size_t>(h)] = E::get(z[p.lstm_o * H + h]);
        v[static_cast<size_t>(h)] = E::get(c[h]);
      }
      cpu::activate<C>(p.gate_act[static_cast<size_t>(p.lstm_o)], u.data(), u.data(), H);
      cpu::activate<C>(p.cell_act, v.data(), v.data(), H);
      for (int64_t h = 0; h < H; ++h) u[static_cast<size_t>(h)] *= v[static_cast<size_t>(h)];
    }
    for (int64_t h = 0; h < H; ++h) out[h] = E::put(u[static_cast<size_t>(h)]);
  }
}

// Adds g[i] ([count, H], row stride g_row) into the step step_of(i) of each sorted row
// i < count (none when negative) of a [steps, rows, H] segment array.
template <class S, class StepOf>
void add_at(S* seg, int64_t rows, int64_t count, int64_t H, const S* g, int64_t g_row,
            StepOf step_of) {
  using E = Elem<S>;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = step_of(i);
    if (k < 0) continue;
    S* o = seg + (k * rows + i) * H;
    const S* v = g + i * g_row;
    for (int64_t h = 0; h < H; ++h) o[h] = E::put(E::get(o[h]) + E::get(v[h]));
  }
}

template <class S>
struct Sum {  // one weight gradient summed over the segments, written once
  std::vector<typename Elem<S>::C> acc;
  void add(const S* v, int64_t n) {
    if (acc.empty()) acc.assign(static_cast<size_t>(n), 0);
    for (size_t k = 0; k < acc.size(); ++k) acc[k] += Elem<S>::get(v[k]);
  }
  void write(void* dst, int64_t offset, int64_t n) const {
    S* o = static_cast<S*>(dst) + offset;
    for (int64_t k = 0; k < n; ++k)
      o[k] = acc.empty() ? Elem<S>::put(0) : Elem<S>::put(acc[static_cast<size_t>(k)]);
  }
};

template <class S>
void backward_direction(Backend& be, const Problem& p, const BackwardArrays& a, const Schedule& s,
                        int64_t d) {
  const Direction dir(p, d);
  const int64_t H = p.H, GH = p.gh(), ZH = p.ZG * H, DH = p.dh(), N = p.N;
  const int64_t n0 = s.active(0), m = s.segments(), peak = s.peak();
  const bool lstm = p.op == OpKind::Lstm, gru = p.op == OpKind::Gru;
  const DType t = p.dtype;
  BackwardArrays b;
  b.fwd = dir.weights<S>(a.fwd);
  Buffer<S> mask;
  if (a.fwd.mask) mask = mask_of<S>(s, p, d, n0, a.fwd);
  const S* dh_final = a.dh_final ? static_cast<const S*>(a.dh_final) + d * H : nullptr;
  const S* dc_final = a.dc_final ? static_cast<const S*>(a.dc_final) + d * H : nullptr;
  // dh_final / dc_final of the sorted rows, [n0, H].
  Buffer<S> dhf, dcf;
  if (dh_final) dhf = {t, n0 * H}, rows_of<S>(s, p, d, n0, a.dh_final, dhf.get());
  if (dc_final) dcf = {t, n0 * H}, rows_of<S>(s, p, d, n0, a.dc_final, dcf.get());
  // Inputs of a segment (host), and the outputs the backend writes (its memory).
  Buffer<S> src(t, peak * dir.I_sub), z(t, peak * ZH), dy(t, peak * H), fwd_out, dc;
  Buffer<S> h0(t, n0 * H), c0;
  if (gru || lstm) fwd_out = {t, peak * H};
  if (lstm) dc = {t, peak * H}, c0 = {t, n0 * H};
  Buffer<S> g_src(t, peak * dir.I_sub, &be), g_R(t, GH * H, &be), g_W, g_b, g_P, g_b2;
  if (a.dW) g_W = {t, GH * p.I, &be};
  if (a.dbias) g_b = {t, GH, &be};
  if (a.dP) g_P = {t, 4 * H, &be};
  if (a.db2) g_b2 = {t, H, &be};
  // Two of each: a segment's initial-state gradients feed the one before.
  Buffer<S> g_h0[2] = {{t, n0 * H, &be}, {t, n0 * H, &be}}, g_c0[2];
  if (lstm) g_c0[0] = {t, n0 * H, &be}, g_c0[1] = {t, n0 * H, &be};
  Sum<S> dR, dW, dbias, dP, db2;
  bool ran_h0 = false, ran_c0 = false;  // whether g_h0 / g_c0 [m % 2 ...] hold the first's
  for (int64_t j = m - 1; j >= 0; --j) {
    const int64_t s0 = s.bounds[static_cast<size_t>(j)], cur = j % 2, next = 1 - cur;
    const int64_t s1 = s.bounds[static_cast<size_t>(j) + 1], steps = s1 - s0;
    const int64_t rows = s.active(s0), next_rows = j + 1 < m ? s.active(s1) : 0;
    Problem q = dir.segment(steps, rows);
    gather<S>(s, dir, s0, steps, rows, a.fwd.source, p.I, dir.src_col, dir.I_sub, true, src.get());
    gather<S>(s, dir, s0, steps, rows, a.z_state, p.D * ZH, d * ZH, ZH, false, z.get());
    gather<S>(s, dir, s0, steps, rows, a.dy, DH, d * H, H, false, dy.get());
    if (gru) gather<S>(s, dir, s0, steps, rows, a.h_fwd, DH, d * H, H, false, fwd_out.get());
    if (lstm) gather<S>(s, dir, s0, steps, rows, a.c_fwd, DH, d * H, H, false, fwd_out.get());
    // The final-state gradients at each row's last step; the next segment's initial-state
    // gradients at this one's last step.
    auto last_here = [&](int64_t i) {
      const int64_t len = s.len[static_cast<size_t>(i)];
      return len <= s1 ? len - 1 - s0 : -1;
    };
    auto segment_end = [&](int64_t) { return steps - 1; };
    if (dh_final) add_at<S>(dy.get(), rows, rows, H, dhf.get(), H, last_here);
    if (next_rows) add_at<S>(dy.get(), rows, next_rows, H, g_h0[next].get(), H, segment_end);
    if (lstm) {  // the per-step cell-gradient form carries all three
      gather<S>(s, dir, s0, steps, rows, a.dc_steps, DH, d * H, H, false, dc.get());
      if (dc_final) add_at<S>(dc.get(), rows, rows, H, dcf.get(), H, last_here);
      if (next_rows) add_at<S>(dc.get(), rows, next_rows, H, g_c0[next].get(), H, segment_end);
    }
    if (j > 0) {
      state_at<S>(s, dir, a, s0 - 1, rows, h0.get());
      if (lstm) gather<S>(s, dir, s0 - 1, 1, rows, a.c_fwd, DH, d * H, H, false, c0.get());
    } else {
      if (a.fwd.init_state) rows_of<S>(s, p, d, rows, a.fwd.init_state, h0.get());
      if (a.fwd.init_cell) rows_of<S>(s, p, d, rows, a.fwd.init_cell, c0.get());
    }
    q.has_init_state = j > 0 || a.fwd.init_state;
    q.has_init_cell = lstm && (j > 0 || a.fwd.init_cell);
    b.fwd.source = src.get();
    b.fwd.init_state = q.has_init_state ? h0.get() : nullptr;
    b.fwd.init_cell = q.has_init_cell ? c0.get() : nullptr;
    if (a.fwd.mask) b.fwd.mask = mask.get(), b.fwd.mask_rows = rows, b.fwd.mask_cols = H;
    b.z_state = z.get();
    b.h_fwd = gru ? fwd_out.get() : nullptr;
    b.c_fwd = lstm ? fwd_out.get() : nullptr;
    b.dy = dy.get();
    b.dc_steps = lstm ? dc.get() : nullptr;
    b.dsource = g_src.get();
    b.dR = g_R.get();
    b.dW = g_W.get();
    b.dbias = g_b.get();
    b.dP = g_P.get();
    b.db2 = g_b2.get();
    b.dh0 = q.has_init_state ? g_h0[cur].get() : nullptr;
    b.dc0 = q.has_init_cell ? g_c0[cur].get() : nullptr;
    be.backward(q, b);
    // With an input weight both directions' source gradients add up; without one each
    // direction owns its columns.
    scatter<S>(s, dir, s0, steps, rows, g_src.get(), a.dsource, p.I, dir.src_col, dir.I_sub, true,
               d > 0 && p.has_input_weight);
    dR.add(g_R.get(), GH * H);
    if (a.dW) dW.add(g_W.get(), GH * p.I);
    if (a.dbias) dbias.add(g_b.get(), GH);
    if (a.dP) dP.add(g_P.get(), 4 * H);
    if (a.db2) db2.add(g_b2.get(), H);
    ran_h0 = q.has_init_state;
    ran_c0 = q.has_init_cell;
  }
  dR.write(a.dR, d * GH * H, GH * H);
  if (a.dW) dW.write(a.dW, d * GH * p.I, GH * p.I);
  if (a.dbias) dbias.write(a.dbias, d * GH, GH);
  if (a.dP) dP.write(a.dP, d * 4 * H, 4 * H);
  if (a.db2) db2.write(a.db2, d * H, H);
  // Initial-state gradients: the first segment's for the rows that ran; an empty row's state
  // passes through, so its gradient is the final-state gradient.
  auto initial = [&](void* dst, bool ran, Buffer<S>& first, const S* final_grad) {
    if (!dst) return;
    for (int64_t i = 0; i < N; ++i) {
      S* o = static_cast<S*>(dst) + s.order[static_cast<size_t>(i)] * DH + d * H;
      if (ran && i < n0)
        std::memcpy(o, first.get() + i * H, static_cast<size_t>(H) * sizeof(S));
      else if (final_grad)
        std::memcpy(o, final_grad + s.order[static_cast<size_t>(i)] * DH,
                    static_cast<size_t>(H) * sizeof(S));
      else
        std::memset(o, 0, static_cast<size_t>(H) * sizeof(S));
    }
  };
  initial(a.dh0, ran_h0, g_h0[0], dh_final);
  initial(a.dc0, ran_c0, g_c0[0], dc_final);
}

template <class F>
void with_storage(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(uint16_t{});
    case DType::BFloat16: return f(BFloat16Bits{});
  }
}

}  // namespace

void forward_with_lengths(Backend& be, const Problem& p, const ForwardArrays& a,
                          const int64_t* lengths) {
  const Schedule s = schedule(lengths, p.N, call_cost(p, false));
  with_storage(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    for (int64_t d = 0; d < p.D; ++d) forward_direction<S>(be, p, a, s, d);
  });
}

void backward_with_lengths(Backend& be, const Problem& p, const BackwardArrays& a,
                           const int64_t* lengths) {
  const Schedule s = schedule(lengths, p.N, call_cost(p, true));
  with_storage(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    for (int64_t d = 0; d < p.D; ++d) backward_direction<S>(be, p, a, s, d);
  });
}

}  // namespace rnncore::detail
