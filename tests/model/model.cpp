// The test model family: parameter layout, synthetic data, and hand-written forward/backward kernels.
// Matrix products loop so the innermost loop is a contiguous axpy (the compiler vectorizes it without
// -ffast-math); the forward transposes each weight once per call for that. Every sum runs in a fixed
// order, so a run is bitwise reproducible.
#include "model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::model {
namespace {

constexpr double kInitStd = 0.02;
constexpr double kLayerNormEps = 1e-5;

using Index = std::size_t;

Index idx(int v) {
  return static_cast<Index>(v);
}

ParamSpec weight(std::string name, std::int64_t rows, std::int64_t cols) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {rows, cols};
  p.init = ParamInit::normal({.std = kInitStd});
  return p;
}
ParamSpec bias(std::string name, std::int64_t n) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {n};
  p.init = ParamInit::zeros();
  p.weight_decay = false;
  return p;
}
ParamSpec norm_weight(std::string name, std::int64_t n) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {n};
  p.init = ParamInit::ones();
  p.weight_decay = false;
  return p;
}

// ---- kernels on row-major matrices -------------------------------------------------------------------

template <typename T>
void axpy(T* y, const T* x, T a, Index n) {
  for (Index i = 0; i < n; ++i) y[i] += a * x[i];
}

// y[n, out] = x[n, in] * w[out, in]^T + b[out]
template <typename T>
void linear_forward(const T* x, const T* w, const T* b, T* y, Index n, Index in, Index out, std::vector<T>& wt) {
  wt.resize(in * out);
  for (Index o = 0; o < out; ++o) {
    for (Index k = 0; k < in; ++k) wt[k * out + o] = w[o * in + k];
  }
  for (Index i = 0; i < n; ++i) {
    T* yi = y + i * out;
    std::copy(b, b + out, yi);
    for (Index k = 0; k < in; ++k) axpy(yi, wt.data() + k * out, x[i * in + k], out);
  }
}

// dx[n, in] = dy * w (skipped when dx is null); dw[out, in] = dy^T * x; db[out] = column sums of dy.
template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, Index n, Index in, Index out) {
  if (dx != nullptr) {
    for (Index i = 0; i < n; ++i) {
      T* dxi = dx + i * in;
      std::fill(dxi, dxi + in, T(0));
      for (Index o = 0; o < out; ++o) axpy(dxi, w + o * in, dy[i * out + o], in);
    }
  }
  std::fill(dw, dw + out * in, T(0));
  std::fill(db, db + out, T(0));
  for (Index i = 0; i < n; ++i) {
    const T* dyi = dy + i * out;
    for (Index o = 0; o < out; ++o) axpy(dw + o * in, x + i * in, dyi[o], in);
    axpy(db, dyi, T(1), out);
  }
}

// y = (x - mean) * rstd * w + b per row; stat keeps (mean, rstd) per row.
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* stat, Index n, Index d) {
  for (Index i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    T mean = 0;
    for (Index k = 0; k < d; ++k) mean += xi[k];
    mean /= static_cast<T>(d);
    T var = 0;
    for (Index k = 0; k < d; ++k) var += (xi[k] - mean) * (xi[k] - mean);
    var /= static_cast<T>(d);
    const T rstd = T(1) / std::sqrt(var + static_cast<T>(kLayerNormEps));
    for (Index k = 0; k < d; ++k) y[i * d + k] = (xi[k] - mean) * rstd * w[k] + b[k];
    stat[2 * i] = mean;
    stat[2 * i + 1] = rstd;
  }
}

// dx (+)= d/dx; dw, db overwritten.
template <typename T>
void layernorm_backward(const T* x, const T* w, const T* stat, const T* dy, T* dx, T* dw, T* db, Index n, Index d,
                        bool accumulate, std::vector<T>& tmp) {
  std::fill(dw, dw + d, T(0));
  std::fill(db, db + d, T(0));
  tmp.resize(2 * d);
  T* xhat = tmp.data();
  T* dxhat = tmp.data() + d;
  for (Index i = 0; i < n; ++i) {
    const T mean = stat[2 * i];
    const T rstd = stat[2 * i + 1];
    const T* dyi = dy + i * d;
    T m1 = 0;
    T m2 = 0;
    for (Index k = 0; k < d; ++k) {
      xhat[k] = (x[i * d + k] - mean) * rstd;
      dxhat[k] = dyi[k] * w[k];
      dw[k] += dyi[k] * xhat[k];
      db[k] += dyi[k];
      m1 += dxhat[k];
      m2 += dxhat[k] * xhat[k];
    }
    m1 /= static_cast<T>(d);
    m2 /= static_cast<T>(d);
    T* dxi = dx + i * d;
    for (Index k = 0; k < d; ++k) {
      const T g = rstd * (dxhat[k] - m1 - xhat[k] * m2);
      dxi[k] = accumulate ? dxi[k] + g : g;
    }
  }
}

// GELU, tanh approximation (as GPT-2).
template <typename T>
T gelu(T x) {
  const T c = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
  const T t = std::tanh(c * (x + static_cast<T>(0.044715) * x * x * x));
  return static_cast<T>(0.5) * x * (T(1) + t);
}
template <typename T>
T gelu_grad(T x) {
  const T c = static_cast<T>(0.7978845608028654);
  const T t = std::tanh(c * (x + static_cast<T>(0.044715) * x * x * x));
  return static_cast<T>(0.5) * (T(1) + t) +
         static_cast<T>(0.5) * x * (T(1) - t * t) * c * (T(1) + static_cast<T>(3 * 0.044715) * x * x);
}
template <typename T>
T activate(Activation a, T x) {
  return a == Activation::gelu ? gelu(x) : std::tanh(x);
}
template <typename T>
T activate_grad(Activation a, T x) {
  if (a == Activation::gelu) return gelu_grad(x);
  const T t = std::tanh(x);
  return T(1) - t * t;
}

template <typename T>
T dot(const T* a, const T* b, Index n) {
  T s = 0;
  for (Index i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Single-head causal self-attention per sample. qkv rows: [q | k | v], each d wide.
template <typename T>
void attention_forward(const T* qkv, T* prob, T* out, Index samples, Index seq, Index d) {
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  for (Index s = 0; s < samples; ++s) {
    const T* base = qkv + s * seq * 3 * d;
    T* p = prob + s * seq * seq;
    for (Index i = 0; i < seq; ++i) {
      const T* q = base + i * 3 * d;
      T* pi = p + i * seq;
      T mx = -std::numeric_limits<T>::infinity();
      for (Index j = 0; j <= i; ++j) {
        pi[j] = scale * dot(q, base + j * 3 * d + d, d);
        mx = std::max(mx, pi[j]);
      }
      T sum = 0;
      for (Index j = 0; j <= i; ++j) {
        pi[j] = std::exp(pi[j] - mx);
        sum += pi[j];
      }
      for (Index j = 0; j <= i; ++j) pi[j] /= sum;
      for (Index j = i + 1; j < seq; ++j) pi[j] = 0;
      T* oi = out + (s * seq + i) * d;
      std::fill(oi, oi + d, T(0));
      for (Index j = 0; j <= i; ++j) axpy(oi, base + j * 3 * d + 2 * d, pi[j], d);
    }
  }
}

template <typename T>
void attention_backward(const T* qkv, const T* prob, const T* dout, T* dqkv, Index samples, Index seq, Index d,
                        std::vector<T>& tmp) {
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  std::fill(dqkv, dqkv + samples * seq * 3 * d, T(0));
  tmp.resize(seq);
  T* dp = tmp.data();
  for (Index s = 0; s < samples; ++s) {
    const T* base = qkv + s * seq * 3 * d;
    T* dbase = dqkv + s * seq * 3 * d;
    const T* p = prob + s * seq * seq;
    for (Index i = 0; i < seq; ++i) {
      const T* doi = dout + (s * seq + i) * d;
      const T* pi = p + i * seq;
      T sum = 0;
      for (Index j = 0; j <= i; ++j) {
        dp[j] = dot(doi, base + j * 3 * d + 2 * d, d);
        sum += pi[j] * dp[j];
        axpy(dbase + j * 3 * d + 2 * d, doi, pi[j], d);  // dv_j
      }
      for (Index j = 0; j <= i; ++j) {
        const T ds = pi[j] * (dp[j] - sum) * scale;
        axpy(dbase + i * 3 * d, base + j * 3 * d + d, ds, d);  // dq_i
        axpy(dbase + j * 3 * d + d, base + i * 3 * d, ds, d);  // dk_j
      }
    }
  }
}

std::uint64_t data_key(std::int64_t step) {
  return hash_name("zero3.model.data") ^ mix64(static_cast<std::uint64_t>(step) + 1);
}

}  // namespace

void validate(const ModelConfig& c) {
  const bool ok = c.d_in > 0 && c.d_model > 0 && c.d_out > 0 && c.layers >= 0 &&
                  (c.arch == Arch::mlp || (c.d_ff > 0 && c.seq_len > 0 && c.layers >= 1));
  if (!ok) {
    throw UsageError(
        fmt::format("test model: invalid sizes (d_in {}, d_model {}, d_ff {}, layers {}, seq_len {}, d_out {})", c.d_in,
                    c.d_model, c.d_ff, c.layers, c.seq_len, c.d_out));
  }
}

std::size_t numel(const ParamSpec& param) {
  std::size_t n = 1;
  for (std::int64_t e : param.shape) n *= static_cast<std::size_t>(e);
  return n;
}

std::size_t total_elems(const std::vector<UnitSpec>& units) {
  std::size_t n = 0;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) n += numel(p);
  }
  return n;
}

std::vector<UnitSpec> model_units(const ModelConfig& c) {
  validate(c);
  std::vector<UnitSpec> units;
  const std::int64_t D = c.d_model;
  if (c.arch == Arch::mlp) {
    std::int64_t prev = c.d_in;
    for (int l = 0; l < c.layers; ++l) {
      const std::string u = fmt::format("layers.{}", l);
      units.push_back({u, {weight(u + ".weight", D, prev), bias(u + ".bias", D)}});
      prev = D;
    }
    units.push_back({"head", {weight("head.weight", c.d_out, prev), bias("head.bias", c.d_out)}});
    return units;
  }
  const std::int64_t F = c.d_ff;
  units.push_back({"input", {weight("input.weight", D, c.d_in), bias("input.bias", D)}});
  for (int l = 0; l < c.layers; ++l) {
    const std::string u = fmt::format("blocks.{}", l);
    units.push_back(
        {u,
         {norm_weight(u + ".ln1.weight", D), bias(u + ".ln1.bias", D), weight(u + ".attn.qkv.weight", 3 * D, D),
          weight(u + ".attn.proj.weight", D, D), bias(u + ".attn.proj.bias", D), norm_weight(u + ".ln2.weight", D),
          bias(u + ".ln2.bias", D), weight(u + ".mlp.fc.weight", F, D), bias(u + ".mlp.fc.bias", F),
          weight(u + ".mlp.proj.weight", D, F), bias(u + ".mlp.proj.bias", D)}});
  }
  units.push_back({"head",
                   {norm_weight("ln_f.weight", D), bias("ln_f.bias", D), weight("head.weight", c.d_out, D),
                    bias("head.bias", c.d_out)}});
  return units;
}

template <typename T>
Batch<T> make_batch(const ModelConfig& c, std::uint64_t seed, std::int64_t step,
                    std::span<const std::int64_t> sample_ids) {
  validate(c);
  const Index P = idx(c.positions());
  const Index din = idx(c.d_in);
  const Index dout = idx(c.d_out);
  // The teacher, in double; inputs are rounded to float first so float and double models see equal data.
  const CounterRng teacher_rng(seed, hash_name("zero3.model.teacher"));
  std::vector<double> teacher(dout * din);
  for (Index i = 0; i < teacher.size(); ++i) teacher[i] = teacher_rng.normal(i) / std::sqrt(static_cast<double>(din));
  const CounterRng rng(seed, data_key(step));

  Batch<T> b;
  b.samples = static_cast<int>(sample_ids.size());
  const Index rows = sample_ids.size() * P;
  b.x.resize(rows * din);
  if (c.arch == Arch::mlp) {
    b.target.resize(rows * dout);
  } else {
    b.label.resize(rows);
  }
  std::vector<double> xr(din);
  for (Index s = 0; s < sample_ids.size(); ++s) {
    const auto first = static_cast<std::uint64_t>(sample_ids[s]) * P * din;
    for (Index p = 0; p < P; ++p) {
      const Index r = s * P + p;
      for (Index k = 0; k < din; ++k) {
        xr[k] = static_cast<double>(static_cast<float>(rng.normal(first + p * din + k)));
        b.x[r * din + k] = static_cast<T>(xr[k]);
      }
      int best = 0;
      double best_v = -std::numeric_limits<double>::infinity();
      for (Index j = 0; j < dout; ++j) {
        const double v = dot(teacher.data() + j * din, xr.data(), din);
        if (c.arch == Arch::mlp) {
          b.target[r * dout + j] = static_cast<T>(static_cast<float>(std::tanh(v)));
        } else if (v > best_v) {
          best_v = v;
          best = static_cast<int>(j);
        }
      }
      if (c.arch == Arch::transformer) b.label[r] = best;
    }
  }
  return b;
}

std::vector<std::int64_t> micro_batch_ids(int rank, int world, int micro, int micro_batch) {
  std::vector<std::int64_t> ids(idx(micro_batch));
  for (int j = 0; j < micro_batch; ++j) {
    ids[idx(j)] = rank + static_cast<std::int64_t>(world) * (static_cast<std::int64_t>(micro) * micro_batch + j);
  }
  return ids;
}

std::vector<std::int64_t> all_ids(std::int64_t count) {
  std::vector<std::int64_t> ids(static_cast<Index>(count));
  for (std::int64_t i = 0; i < count; ++i) ids[static_cast<Index>(i)] = i;
  return ids;
}

// ---- Network -----------------------------------------------------------------------------------------

template <typename T>
Network<T>::Network(const ModelConfig& config) : config_(config) {
  validate(config_);
  if (config_.arch == Arch::mlp) {
    kinds_.assign(idx(config_.layers), Kind::hidden);
    kinds_.push_back(Kind::head_mse);
  } else {
    kinds_.push_back(Kind::input);
    for (int l = 0; l < config_.layers; ++l) kinds_.push_back(Kind::block);
    kinds_.push_back(Kind::head_ce);
  }
  act_.resize(kinds_.size() + 1);
  cache_.resize(kinds_.size());
}

template <typename T>
int Network<T>::in_width(std::size_t unit) const {
  if (unit == 0) return config_.d_in;
  return config_.d_model;
}

template <typename T>
int Network<T>::out_width(std::size_t unit) const {
  const Kind k = kinds_[unit];
  return (k == Kind::head_mse || k == Kind::head_ce) ? config_.d_out : config_.d_model;
}

template <typename T>
void Network<T>::set_batch(const Batch<T>& batch) {
  batch_ = batch;
  rows_ = batch.samples * config_.positions();
  act_[0] = batch_.x;
}

template <typename T>
void Network<T>::forward(std::size_t u, std::span<const T* const> prm) {
  ZERO3_CHECK(u < kinds_.size(), "Network::forward: unit out of range");
  const Index n = idx(rows_);
  const Index in = idx(in_width(u));
  const Index out = idx(out_width(u));
  const Index D = idx(config_.d_model);
  const Index F = idx(config_.d_ff);
  const std::vector<T>& x = act_[u];
  ZERO3_CHECK(x.size() == n * in, "Network::forward: units must run in order after set_batch");
  std::vector<T>& y = act_[u + 1];
  y.resize(n * out);
  Cache& c = cache_[u];
  switch (kinds_[u]) {
    case Kind::input:
      ZERO3_CHECK(prm.size() == 2, "Network::forward: input unit takes 2 params");
      linear_forward(x.data(), prm[0], prm[1], y.data(), n, in, out, scratch_);
      break;
    case Kind::hidden:
      ZERO3_CHECK(prm.size() == 2, "Network::forward: hidden unit takes 2 params");
      c.a.resize(n * out);
      linear_forward(x.data(), prm[0], prm[1], c.a.data(), n, in, out, scratch_);
      for (Index i = 0; i < n * out; ++i) y[i] = activate(config_.activation, c.a[i]);
      break;
    case Kind::block: {
      ZERO3_CHECK(prm.size() == 11, "Network::forward: block unit takes 11 params");
      const Index S = idx(config_.seq_len);
      const Index samples = idx(batch_.samples);
      c.a.resize(n * D);
      c.stat.resize(2 * n);
      layernorm_forward(x.data(), prm[0], prm[1], c.a.data(), c.stat.data(), n, D);
      c.qkv.resize(n * 3 * D);
      zeros_.assign(3 * D, T(0));
      linear_forward(c.a.data(), prm[2], zeros_.data(), c.qkv.data(), n, D, 3 * D, scratch_);
      c.prob.resize(samples * S * S);
      c.att.resize(n * D);
      attention_forward(c.qkv.data(), c.prob.data(), c.att.data(), samples, S, D);
      c.h1.resize(n * D);
      linear_forward(c.att.data(), prm[3], prm[4], c.h1.data(), n, D, D, scratch_);
      for (Index i = 0; i < n * D; ++i) c.h1[i] += x[i];
      c.b.resize(n * D);
      c.stat2.resize(2 * n);
      layernorm_forward(c.h1.data(), prm[5], prm[6], c.b.data(), c.stat2.data(), n, D);
      c.f_pre.resize(n * F);
      linear_forward(c.b.data(), prm[7], prm[8], c.f_pre.data(), n, D, F, scratch_);
      c.f_act.resize(n * F);
      for (Index i = 0; i < n * F; ++i) c.f_act[i] = gelu(c.f_pre[i]);
      linear_forward(c.f_act.data(), prm[9], prm[10], y.data(), n, F, D, scratch_);
      for (Index i = 0; i < n * D; ++i) y[i] += c.h1[i];
      break;
    }
    case Kind::head_mse: {
      ZERO3_CHECK(prm.size() == 2, "Network::forward: MSE head takes 2 params");
      linear_forward(x.data(), prm[0], prm[1], y.data(), n, in, out, scratch_);
      T sum = 0;
      for (Index i = 0; i < n * out; ++i) {
        const T e = y[i] - batch_.target[i];
        sum += e * e;
      }
      loss_ = sum / static_cast<T>(n * out);
      break;
    }
    case Kind::head_ce: {
      ZERO3_CHECK(prm.size() == 4, "Network::forward: cross-entropy head takes 4 params");
      c.a.resize(n * D);
      c.stat.resize(2 * n);
      layernorm_forward(x.data(), prm[0], prm[1], c.a.data(), c.stat.data(), n, D);
      linear_forward(c.a.data(), prm[2], prm[3], y.data(), n, D, out, scratch_);
      T sum = 0;
      for (Index i = 0; i < n; ++i) {
        const T* li = y.data() + i * out;
        const T mx = *std::max_element(li, li + out);
        T se = 0;
        for (Index j = 0; j < out; ++j) se += std::exp(li[j] - mx);
        sum += mx + std::log(se) - li[idx(batch_.label[i])];
      }
      loss_ = sum / static_cast<T>(n);
      break;
    }
  }
}

template <typename T>
void Network<T>::backward(std::size_t u, std::span<const T* const> prm, std::span<T* const> grads, T seed) {
  ZERO3_CHECK(u < kinds_.size(), "Network::backward: unit out of range");
  ZERO3_CHECK(grads.size() == prm.size(), "Network::backward: one gradient per param");
  const Index n = idx(rows_);
  const Index in = idx(in_width(u));
  const Index out = idx(out_width(u));
  const Index D = idx(config_.d_model);
  const Index F = idx(config_.d_ff);
  const std::vector<T>& x = act_[u];
  const std::vector<T>& y = act_[u + 1];
  Cache& c = cache_[u];
  const bool want_dx = u > 0;
  std::vector<T>& dx = dtmp_;
  dx.resize(n * in);
  T* dxp = want_dx ? dx.data() : nullptr;

  switch (kinds_[u]) {
    case Kind::input:
      ZERO3_CHECK(dact_.size() == n * out, "Network::backward: units must run in reverse order");
      linear_backward(x.data(), prm[0], dact_.data(), dxp, grads[0], grads[1], n, in, out);
      break;
    case Kind::hidden: {
      ZERO3_CHECK(dact_.size() == n * out, "Network::backward: units must run in reverse order");
      std::vector<T>& dpre = dtmp2_;
      dpre.resize(n * out);
      for (Index i = 0; i < n * out; ++i) dpre[i] = dact_[i] * activate_grad(config_.activation, c.a[i]);
      linear_backward(x.data(), prm[0], dpre.data(), dxp, grads[0], grads[1], n, in, out);
      break;
    }
    case Kind::block: {
      ZERO3_CHECK(dact_.size() == n * D, "Network::backward: units must run in reverse order");
      const Index S = idx(config_.seq_len);
      const Index samples = idx(batch_.samples);
      std::vector<T> dh1 = dact_;  // the residual path
      std::vector<T>& dF = dtmp2_;
      dF.resize(n * F);
      linear_backward(c.f_act.data(), prm[9], dact_.data(), dF.data(), grads[9], grads[10], n, F, D);
      for (Index i = 0; i < n * F; ++i) dF[i] *= gelu_grad(c.f_pre[i]);
      std::vector<T>& dB = dtmp3_;
      dB.resize(n * D);
      linear_backward(c.b.data(), prm[7], dF.data(), dB.data(), grads[7], grads[8], n, D, F);
      layernorm_backward(c.h1.data(), prm[5], c.stat2.data(), dB.data(), dh1.data(), grads[5], grads[6], n, D, true,
                         scratch_);
      std::vector<T>& datt = dtmp3_;
      linear_backward(c.att.data(), prm[3], dh1.data(), datt.data(), grads[3], grads[4], n, D, D);
      std::vector<T>& dqkv = dtmp2_;
      dqkv.resize(n * 3 * D);
      attention_backward(c.qkv.data(), c.prob.data(), datt.data(), dqkv.data(), samples, S, D, scratch_);
      std::vector<T>& da = dtmp3_;
      zeros_.resize(3 * D);  // the bias gradient linear_backward also computes; the qkv projection has none
      linear_backward(c.a.data(), prm[2], dqkv.data(), da.data(), grads[2], zeros_.data(), n, D, 3 * D);
      // dx = dh1 (residual) + LN1's backward
      dx = dh1;
      layernorm_backward(x.data(), prm[0], c.stat.data(), da.data(), dx.data(), grads[0], grads[1], n, D, true,
                         scratch_);
      break;
    }
    case Kind::head_mse: {
      std::vector<T>& dy = dtmp2_;
      dy.resize(n * out);
      const T k = seed * T(2) / static_cast<T>(n * out);
      for (Index i = 0; i < n * out; ++i) dy[i] = k * (y[i] - batch_.target[i]);
      linear_backward(x.data(), prm[0], dy.data(), dxp, grads[0], grads[1], n, in, out);
      break;
    }
    case Kind::head_ce: {
      std::vector<T>& dlogits = dtmp2_;
      dlogits.resize(n * out);
      const T k = seed / static_cast<T>(n);
      for (Index i = 0; i < n; ++i) {
        const T* li = y.data() + i * out;
        T* di = dlogits.data() + i * out;
        const T mx = *std::max_element(li, li + out);
        T se = 0;
        for (Index j = 0; j < out; ++j) {
          di[j] = std::exp(li[j] - mx);
          se += di[j];
        }
        for (Index j = 0; j < out; ++j) di[j] = k * (di[j] / se);
        di[idx(batch_.label[i])] -= k;
      }
      std::vector<T>& da = dtmp3_;
      da.resize(n * D);
      linear_backward(c.a.data(), prm[2], dlogits.data(), da.data(), grads[2], grads[3], n, D, out);
      layernorm_backward(x.data(), prm[0], c.stat.data(), da.data(), dx.data(), grads[0], grads[1], n, D, false,
                         scratch_);
      break;
    }
  }
  if (want_dx) {
    std::swap(dact_, dx);
  } else {
    dact_.clear();
  }
}

template class Network<float>;
template class Network<double>;
template Batch<float> make_batch<float>(const ModelConfig&, std::uint64_t, std::int64_t, std::span<const std::int64_t>);
template Batch<double> make_batch<double>(const ModelConfig&, std::uint64_t, std::int64_t,
                                          std::span<const std::int64_t>);

}  // namespace zero3::model
