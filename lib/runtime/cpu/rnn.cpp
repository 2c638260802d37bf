// Recurrent layers: RNN, GRU, LSTM (forward, reverse, bidirectional; activations with alpha/beta;
// clip; sequence_lens; initial states; LSTM peepholes and input_forget; GRU linear_before_reset;
// layout 0 [seq, batch, ...] and 1 [batch, seq, ...]). Input projections for all time steps are
// one GEMM per direction; each step adds the recurrent product with a second GEMM.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

enum class CellKind { RNN, GRU, LSTM };

struct Activation {
  enum Kind { Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus };
  Kind kind = Tanh;
  float alpha = 0.0f, beta = 0.0f;

  template <typename T>
  T operator()(T x) const {
    const T a = static_cast<T>(alpha), b = static_cast<T>(beta);
    switch (kind) {
      case Relu: return x > T(0) ? x : T(0);
      case Tanh: return std::tanh(x);
      case Sigmoid: return T(1) / (T(1) + std::exp(-x));
      case Affine: return a * x + b;
      case LeakyRelu: return x >= T(0) ? x : a * x;
      case ThresholdedRelu: return x > a ? x : T(0);
      case ScaledTanh: return a * std::tanh(b * x);
      case HardSigmoid: return std::max(T(0), std::min(T(1), a * x + b));
      case Elu: return x >= T(0) ? x : a * (std::exp(x) - T(1));
      case Softsign: return x / (T(1) + std::abs(x));
      case Softplus: return std::log1p(std::exp(x));
    }
    return x;
  }
};

// Activations per direction, consuming activation_alpha / activation_beta in order for the
// functions that take them (ONNX Runtime's reading), with the ONNX operators' defaults otherwise.
std::vector<Activation> parse_activations(const KernelContext& ctx, CellKind cell, int num_dir) {
  const ir::Node& node = ctx.node();
  std::vector<std::string> defaults;
  switch (cell) {
    case CellKind::RNN: defaults = {"Tanh"}; break;
    case CellKind::GRU: defaults = {"Sigmoid", "Tanh"}; break;
    case CellKind::LSTM: defaults = {"Sigmoid", "Tanh", "Tanh"}; break;
  }
  const size_t per_dir = defaults.size();
  std::vector<std::string> names;
  if (const ir::Attribute* a = node.attr("activations")) names = a->strings;
  if (names.empty()) {
    for (int d = 0; d < num_dir; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (names.size() == per_dir && num_dir == 2) {
    std::vector<std::string> twice = names;
    names.insert(names.end(), twice.begin(), twice.end());
  }
  if (names.size() != per_dir * static_cast<size_t>(num_dir))
    ctx.fail("activations must list {} functions, got {}", per_dir * static_cast<size_t>(num_dir), names.size());
  std::vector<float> alphas = node.attr_floats("activation_alpha");
  std::vector<float> betas = node.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  std::vector<Activation> out;
  for (const std::string& raw : names) {
    std::string n;
    for (char c : raw) n.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    Activation act;
    bool takes_alpha = false, takes_beta = false;
    float da = 0.0f, db = 0.0f;
    if (n == "relu") act.kind = Activation::Relu;
    else if (n == "tanh") act.kind = Activation::Tanh;
    else if (n == "sigmoid") act.kind = Activation::Sigmoid;
    else if (n == "affine") act.kind = Activation::Affine, takes_alpha = takes_beta = true, da = 1.0f, db = 0.0f;
    else if (n == "leakyrelu") act.kind = Activation::LeakyRelu, takes_alpha = true, da = 0.01f;
    else if (n == "thresholdedrelu") act.kind = Activation::ThresholdedRelu, takes_alpha = true, da = 1.0f;
    else if (n == "scaledtanh") act.kind = Activation::ScaledTanh, takes_alpha = takes_beta = true, da = 1.0f, db = 1.0f;
    else if (n == "hardsigmoid") act.kind = Activation::HardSigmoid, takes_alpha = takes_beta = true, da = 0.2f, db = 0.5f;
    else if (n == "elu") act.kind = Activation::Elu, takes_alpha = true, da = 1.0f;
    else if (n == "softsign") act.kind = Activation::Softsign;
    else if (n == "softplus") act.kind = Activation::Softplus;
    else ctx.fail("unknown activation function '{}'", raw);
    act.alpha = da;
    act.beta = db;
    if (takes_alpha && ai < alphas.size()) act.alpha = alphas[ai++];
    if (takes_beta && bi < betas.size()) act.beta = betas[bi++];
    out.push_back(act);
  }
  return out;
}

// OpenBLAS runs on the calling thread; large products are split over the kernel pool.
template <typename T>
void gemm(ThreadPool& pool, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : C[i * ldc + j] * beta;
    return;
  }
  blas_gemm_split(pool, false, trans_b, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
}

struct RnnConfig {
  CellKind cell;
  int gates = 1;
  int num_dir = 1;
  bool reverse_only = false;
  int layout = 0;
  int64_t S = 0, B = 0, I = 0, H = 0;
  bool has_clip = false;
  float clip = 0.0f;
  bool input_forget = false;
  bool linear_before_reset = false;
  std::vector<Activation> acts;
  std::vector<int64_t> lens;
};

RnnConfig parse_config(const KernelContext& ctx, CellKind cell) {
  const ir::Node& node = ctx.node();
  RnnConfig c;
  c.cell = cell;
  c.gates = cell == CellKind::RNN ? 1 : cell == CellKind::GRU ? 3 : 4;
  const std::string dir = node.attr_string("direction", "forward");
  if (dir == "forward") c.num_dir = 1;
  else if (dir == "reverse") c.num_dir = 1, c.reverse_only = true;
  else if (dir == "bidirectional") c.num_dir = 2;
  else ctx.fail("unknown direction '{}'", dir);
  c.layout = ctx.opset() >= 14 ? static_cast<int>(node.attr_int("layout", 0)) : 0;
  if (c.layout != 0 && c.layout != 1) ctx.fail("layout must be 0 or 1, got {}", c.layout);
  if (node.has_attr("clip")) {
    c.has_clip = true;
    c.clip = node.attr_float("clip", 0.0f);
    if (!(c.clip > 0.0f)) ctx.fail("clip must be positive, got {}", c.clip);
  }
  c.input_forget = cell == CellKind::LSTM && node.attr_int("input_forget", 0) != 0;
  c.linear_before_reset = cell == CellKind::GRU && node.attr_int("linear_before_reset", 0) != 0;

  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  if (X.rank() != 3) ctx.fail("X must have rank 3, got shape {}", shape_str(X.shape()));
  if (W.rank() != 3 || R.rank() != 3) ctx.fail("W and R must have rank 3, got {} and {}", shape_str(W.shape()), shape_str(R.shape()));
  c.S = c.layout == 0 ? X.dim(0) : X.dim(1);
  c.B = c.layout == 0 ? X.dim(1) : X.dim(0);
  c.I = X.dim(2);
  c.H = R.dim(2);
  if (node.has_attr("hidden_size") && node.attr_int("hidden_size", 0) != c.H)
    ctx.fail("hidden_size {} does not match R's shape {}", node.attr_int("hidden_size", 0), shape_str(R.shape()));
  const int64_t GH = c.gates * c.H;
  if (W.shape() != Shape{c.num_dir, GH, c.I})
    ctx.fail("W has shape {}, expected [{},{},{}]", shape_str(W.shape()), c.num_dir, GH, c.I);
  if (R.shape() != Shape{c.num_dir, GH, c.H})
    ctx.fail("R has shape {}, expected [{},{},{}]", shape_str(R.shape()), c.num_dir, GH, c.H);
  if (W.dtype() != X.dtype() || R.dtype() != X.dtype()) ctx.fail("X, W and R must have the same element type");
  if (const Tensor* b = ctx.input_or_null(3)) {
    if (b->shape() != Shape{c.num_dir, 2 * GH})
      ctx.fail("B has shape {}, expected [{},{}]", shape_str(b->shape()), c.num_dir, 2 * GH);
    if (b->dtype() != X.dtype()) ctx.fail("B must have X's element type");
  }
  c.lens.assign(static_cast<size_t>(c.B), c.S);
  if (const Tensor* sl = ctx.input_or_null(4)) {
    if (!dtype_is_integer(sl->dtype())) ctx.fail("sequence_lens must be integer, got {}", dtype_name(sl->dtype()));
    if (sl->numel() != c.B) ctx.fail("sequence_lens has shape {}, expected [{}]", shape_str(sl->shape()), c.B);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t v = sl->get_int64(b);
      if (v < 0 || v > c.S) ctx.fail("sequence_lens[{}] = {} is outside [0, {}]", b, v, c.S);
      c.lens[static_cast<size_t>(b)] = v;
    }
  }
  const Shape state_shape = c.layout == 0 ? Shape{c.num_dir, c.B, c.H} : Shape{c.B, c.num_dir, c.H};
  for (size_t idx : {size_t{5}, size_t{6}}) {
    if (idx == 6 && cell != CellKind::LSTM) break;
    if (const Tensor* s = ctx.input_or_null(idx)) {
      if (s->shape() != state_shape)
        ctx.fail("{} has shape {}, expected {}", idx == 5 ? "initial_h" : "initial_c", shape_str(s->shape()),
                 shape_str(state_shape));
      if (s->dtype() != X.dtype()) ctx.fail("initial states must have X's element type");
    }
  }
  if (cell == CellKind::LSTM)
    if (const Tensor* p = ctx.input_or_null(7))
      if (p->shape() != Shape{c.num_dir, 3 * c.H})
        ctx.fail("P has shape {}, expected [{},{}]", shape_str(p->shape()), c.num_dir, 3 * c.H);
  c.acts = parse_activations(ctx, cell, c.num_dir);
  return c;
}

template <typename T>
struct Outputs {
  T* Y = nullptr;   // [S, D, B, H] or [B, S, D, H]
  T* Yh = nullptr;  // [D, B, H] or [B, D, H]
  T* Yc = nullptr;
};

// One direction `d` (reverse when `reverse`), writing its slice of the outputs.
template <typename T>
void run_direction(KernelContext& ctx, const RnnConfig& c, int d, bool reverse, Outputs<T>& out) {
  const int64_t S = c.S, B = c.B, I = c.I, H = c.H, G = c.gates, GH = G * H, D = c.num_dir;
  const T* X = ctx.input(0).data<T>();
  const T* W = ctx.input(1).data<T>() + d * GH * I;
  const T* R = ctx.input(2).data<T>() + d * GH * H;
  const Tensor* Bt = ctx.input_or_null(3);
  const T* Wb = Bt ? Bt->data<T>() + d * 2 * GH : nullptr;
  const T* Rb = Wb ? Wb + GH : nullptr;
  const Tensor* h0 = ctx.input_or_null(5);
  const Tensor* c0 = c.cell == CellKind::LSTM ? ctx.input_or_null(6) : nullptr;
  const Tensor* Pt = c.cell == CellKind::LSTM ? ctx.input_or_null(7) : nullptr;
  const T* P = Pt ? Pt->data<T>() + d * 3 * H : nullptr;
  const Activation* act = c.acts.data() + static_cast<size_t>(d) * (c.acts.size() / static_cast<size_t>(D));

  // Input projections of every step: XW[row] = X[row] W^T + bias, rows in X's storage order.
  std::vector<T> XW(static_cast<size_t>(S * B * GH));
  gemm<T>(ctx.pool(), true, S * B, GH, I, X, I, W, I, T(0), XW.data(), GH);
  // GRU without linear_before_reset adds Rb_h inside the activation; with it, inside r * (...).
  std::vector<T> bias(static_cast<size_t>(GH), T(0));
  std::vector<T> rb_h(static_cast<size_t>(H), T(0));
  if (Wb) {
    for (int64_t j = 0; j < GH; ++j) bias[static_cast<size_t>(j)] = Wb[j];
    for (int64_t j = 0; j < GH; ++j) {
      if (c.cell == CellKind::GRU && j >= 2 * H) rb_h[static_cast<size_t>(j - 2 * H)] = Rb[j];
      else bias[static_cast<size_t>(j)] += Rb[j];
    }
    ctx.pool().parallel_for(S * B, std::max<int64_t>(1, 16384 / std::max<int64_t>(GH, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        T* row = XW.data() + r * GH;
        for (int64_t j = 0; j < GH; ++j) row[j] += bias[static_cast<size_t>(j)];
      }
    });
  }
  auto x_row = [&](int64_t t, int64_t b) { return c.layout == 0 ? t * B + b : b * S + t; };
  auto state_off = [&](int64_t b) { return c.layout == 0 ? (d * B + b) * H : (b * D + d) * H; };
  auto y_off = [&](int64_t t, int64_t b) { return c.layout == 0 ? ((t * D + d) * B + b) * H : ((b * S + t) * D + d) * H; };

  std::vector<T> Hs(static_cast<size_t>(B * H), T(0)), Cs;
  if (h0)
    for (int64_t b = 0; b < B; ++b) std::memcpy(Hs.data() + b * H, h0->data<T>() + state_off(b), static_cast<size_t>(H) * sizeof(T));
  if (c.cell == CellKind::LSTM) {
    Cs.assign(static_cast<size_t>(B * H), T(0));
    if (c0)
      for (int64_t b = 0; b < B; ++b) std::memcpy(Cs.data() + b * H, c0->data<T>() + state_off(b), static_cast<size_t>(H) * sizeof(T));
  }
  std::vector<T> gates(static_cast<size_t>(B * GH));
  std::vector<T> tmp;  // GRU: r * H, or H R_h^T
  if (c.cell == CellKind::GRU) tmp.assign(static_cast<size_t>(B * H), T(0));
  std::vector<T> hr;  // GRU linear_before_reset: H R_h^T
  if (c.cell == CellKind::GRU) hr.assign(static_cast<size_t>(B * H), T(0));

  const bool clip = c.has_clip;
  const T cl = static_cast<T>(c.clip);
  auto clp = [&](T v) { return clip ? std::max(-cl, std::min(cl, v)) : v; };
  int64_t max_len = 0;
  for (int64_t l : c.lens) max_len = std::max(max_len, l);

  for (int64_t s = 0; s < max_len; ++s) {
    // Gather this step's projections (time index per batch row for reverse with sequence_lens).
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = c.lens[static_cast<size_t>(b)];
      if (s >= len) continue;
      const int64_t t = reverse ? len - 1 - s : s;
      std::memcpy(gates.data() + b * GH, XW.data() + x_row(t, b) * GH, static_cast<size_t>(GH) * sizeof(T));
    }
    if (c.cell == CellKind::GRU) {
      // z and r: add H R_zr^T.
      gemm<T>(ctx.pool(), true, B, 2 * H, H, Hs.data(), H, R, H, T(1), gates.data(), GH);
      if (c.linear_before_reset) gemm<T>(ctx.pool(), true, B, H, H, Hs.data(), H, R + 2 * H * H, H, T(0), hr.data(), H);
    } else {
      gemm<T>(ctx.pool(), true, B, GH, H, Hs.data(), H, R, H, T(1), gates.data(), GH);
    }
    if (c.cell == CellKind::GRU && !c.linear_before_reset) {
      // h gate needs (r * H) R_h^T: compute r first.
      for (int64_t b = 0; b < B; ++b) {
        T* g = gates.data() + b * GH;
        for (int64_t j = 0; j < H; ++j) {
          const T r = act[0](clp(g[H + j]));
          g[H + j] = r;
          tmp[static_cast<size_t>(b * H + j)] = r * Hs[static_cast<size_t>(b * H + j)];
        }
      }
      gemm<T>(ctx.pool(), true, B, H, H, tmp.data(), H, R + 2 * H * H, H, T(0), hr.data(), H);
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = c.lens[static_cast<size_t>(b)];
      if (s >= len) continue;
      const int64_t t = reverse ? len - 1 - s : s;
      T* g = gates.data() + b * GH;
      T* h = Hs.data() + b * H;
      switch (c.cell) {
        case CellKind::RNN:
          for (int64_t j = 0; j < H; ++j) h[j] = act[0](clp(g[j]));
          break;
        case CellKind::GRU: {
          const T* hrb = hr.data() + b * H;
          for (int64_t j = 0; j < H; ++j) {
            const T z = act[0](clp(g[j]));
            T hh;
            if (c.linear_before_reset) {
              const T r = act[0](clp(g[H + j]));
              hh = act[1](clp(g[2 * H + j] + r * (hrb[j] + rb_h[static_cast<size_t>(j)])));
            } else {
              hh = act[1](clp(g[2 * H + j] + hrb[j] + rb_h[static_cast<size_t>(j)]));
            }
            h[j] = (T(1) - z) * hh + z * h[j];
          }
          break;
        }
        case CellKind::LSTM: {
          T* cs = Cs.data() + b * H;
          // Gate order in W/R/B: i, o, f, c; peepholes: i, o, f.
          for (int64_t j = 0; j < H; ++j) {
            const T cprev = cs[j];
            T gi = g[j], go = g[H + j], gf = g[2 * H + j], gc = g[3 * H + j];
            if (P) {
              gi += P[j] * cprev;
              gf += P[2 * H + j] * cprev;
            }
            const T i = act[0](clp(gi));
            const T f = c.input_forget ? T(1) - i : act[0](clp(gf));
            const T cc = act[1](clp(gc));
            const T cn = f * cprev + i * cc;
            if (P) go += P[H + j] * cn;
            const T o = act[0](clp(go));
            cs[j] = cn;
            h[j] = o * act[2](cn);
          }
          break;
        }
      }
      if (out.Y) std::memcpy(out.Y + y_off(t, b), h, static_cast<size_t>(H) * sizeof(T));
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    if (out.Yh) std::memcpy(out.Yh + state_off(b), Hs.data() + b * H, static_cast<size_t>(H) * sizeof(T));
    if (out.Yc) std::memcpy(out.Yc + state_off(b), Cs.data() + b * H, static_cast<size_t>(H) * sizeof(T));
  }
}

template <typename T>
void run_rnn(KernelContext& ctx, const RnnConfig& c) {
  const DType dt = ctx.input(0).dtype();
  Outputs<T> out;
  const Shape y_shape = c.layout == 0 ? Shape{c.S, c.num_dir, c.B, c.H} : Shape{c.B, c.S, c.num_dir, c.H};
  const Shape s_shape = c.layout == 0 ? Shape{c.num_dir, c.B, c.H} : Shape{c.B, c.num_dir, c.H};
  if (ctx.output_wanted(0)) {
    Tensor& y = ctx.alloc_output(0, dt, y_shape);
    out.Y = y.data<T>();
    std::fill(out.Y, out.Y + y.numel(), T(0));  // steps past a sequence's length stay zero
  }
  if (ctx.output_wanted(1)) out.Yh = ctx.alloc_output(1, dt, s_shape).data<T>();
  if (c.cell == CellKind::LSTM && ctx.output_wanted(2)) out.Yc = ctx.alloc_output(2, dt, s_shape).data<T>();
  for (int d = 0; d < c.num_dir; ++d) run_direction<T>(ctx, c, d, c.reverse_only || d == 1, out);
}

template <CellKind cell>
void rnn_kernel(KernelContext& ctx) {
  RnnConfig c = parse_config(ctx, cell);
  const DType dt = ctx.input(0).dtype();
  if (dt == DType::Float32) run_rnn<float>(ctx, c);
  else if (dt == DType::Float64) run_rnn<double>(ctx, c);
  else ctx.fail("element type {} is not supported (float32 or float64)", dtype_name(dt));
}

}  // namespace

void register_rnn(OpRegistry& r) {
  r.add_fn("", "RNN", 1, kMaxOpset, BackendKind::CPU, rnn_kernel<CellKind::RNN>);
  r.add_fn("", "GRU", 1, kMaxOpset, BackendKind::CPU, rnn_kernel<CellKind::GRU>);
  r.add_fn("", "LSTM", 1, kMaxOpset, BackendKind::CPU, rnn_kernel<CellKind::LSTM>);
}

}  // namespace mpq::rt::cpu
