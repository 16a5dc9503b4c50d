// The Llama-family decoder's units and its unit-by-unit forward and backward over the host kernels of
// gpt_ops (matrix products, attention, cross-entropy) and llama_ops (RMSNorm, rotary embeddings, SwiGLU,
// the grouped-query layout). As in the GPT, backward runs the residual stream's gradient through one
// buffer that each layer's branches add into.
#include "zero3/models/llama.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "exact_resize.hpp"
#include "flash_attention.hpp"
#include "gpt_ops.hpp"
#include "host_adapter.hpp"
#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "llama_ops.hpp"
#include "llama_params.hpp"
#include "param_count.hpp"
#include "unit_linear.hpp"
#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models {
namespace {

using ops::Index;

constexpr double kInitStd = 0.02;  // transformers' initializer_range default
constexpr std::size_t kEmbedParams = 1;
constexpr std::size_t kHeadParams = 2;
constexpr Index kEmbedRowChunk = 16;
constexpr Index kEmbedColChunk = 32;

Index idx(int v) {
  return static_cast<Index>(v);
}

ParamSpec matrix(std::string name, int rows, int cols) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {rows, cols};
  p.init = ParamInit::normal({.std = kInitStd});
  return p;
}

ParamSpec vector_param(std::string name, int n, ParamInit init) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {n};
  p.init = std::move(init);
  p.weight_decay = false;
  return p;
}

void require_positive(int value, const char* field) {
  if (value <= 0) throw ConfigError(fmt::format("zero3.model.{} must be positive, got {}", field, value));
}

}  // namespace

void validate(const LlamaConfig& c) {
  require_positive(c.vocab_size, "vocab_size");
  require_positive(c.seq_len, "seq_len");
  require_positive(c.layers, "layers");
  require_positive(c.hidden, "hidden_size");
  require_positive(c.heads, "heads");
  require_positive(c.intermediate, "intermediate_size");
  if (c.kv_heads < 0) throw ConfigError(fmt::format("zero3.model.kv_heads must be >= 0, got {}", c.kv_heads));
  if (c.head_dim < 0) throw ConfigError(fmt::format("zero3.model.head_dim must be >= 0, got {}", c.head_dim));
  if (c.heads % c.kv() != 0) {
    throw ConfigError(
        fmt::format("zero3.model.heads ({}) must be a multiple of zero3.model.kv_heads ({})", c.heads, c.kv()));
  }
  if (c.head_dim == 0 && c.hidden % c.heads != 0) {
    throw ConfigError(fmt::format(
        "zero3.model.hidden_size ({}) must be a multiple of zero3.model.heads ({}), or set zero3.model.head_dim",
        c.hidden, c.heads));
  }
  if (c.dim() % 2 != 0) {
    throw ConfigError(fmt::format("zero3.model.head_dim ({}) must be even: rotary embeddings rotate pairs", c.dim()));
  }
  if (!(c.rope_theta > 0.0)) throw ConfigError(fmt::format("zero3.model.rope_theta must be > 0, got {}", c.rope_theta));
  if (!(c.rms_norm_eps > 0.0)) {
    throw ConfigError(fmt::format("zero3.model.rms_norm_eps must be > 0, got {}", c.rms_norm_eps));
  }
  // The projections' widths, which the params' shapes and the kernels' loops take as int.
  checked_mul<ConfigError>(c.heads, c.dim(), "zero3.model: the query width (heads x head_dim)");
}

namespace {

UnitSpec layer_unit(const LlamaConfig& c, int i) {
  const int d = c.hidden;
  const int q_width = c.heads * c.dim();
  const int kv_width = c.kv() * c.dim();
  const std::string l = fmt::format("model.layers.{}.", i);
  std::vector<ParamSpec> p = {vector_param(l + "input_layernorm.weight", d, ParamInit::ones()),
                              matrix(l + "self_attn.q_proj.weight", q_width, d),
                              matrix(l + "self_attn.k_proj.weight", kv_width, d),
                              matrix(l + "self_attn.v_proj.weight", kv_width, d),
                              matrix(l + "self_attn.o_proj.weight", d, q_width),
                              vector_param(l + "post_attention_layernorm.weight", d, ParamInit::ones()),
                              matrix(l + "mlp.gate_proj.weight", c.intermediate, d),
                              matrix(l + "mlp.up_proj.weight", c.intermediate, d),
                              matrix(l + "mlp.down_proj.weight", d, c.intermediate)};
  if (c.qkv_bias) {
    p.push_back(vector_param(l + "self_attn.q_proj.bias", q_width, ParamInit::zeros()));
    p.push_back(vector_param(l + "self_attn.k_proj.bias", kv_width, ParamInit::zeros()));
    p.push_back(vector_param(l + "self_attn.v_proj.bias", kv_width, ParamInit::zeros()));
  }
  if (c.o_bias) p.push_back(vector_param(l + "self_attn.o_proj.bias", d, ParamInit::zeros()));
  return {fmt::format("layers.{}", i), std::move(p)};
}

UnitSpec embed_unit(const LlamaConfig& c) {
  return {"embed", {matrix("model.embed_tokens.weight", c.vocab_size, c.hidden)}};
}

UnitSpec head_unit(const LlamaConfig& c) {
  UnitSpec head{"head", {vector_param("model.norm.weight", c.hidden, ParamInit::ones())}};
  if (c.tie_word_embeddings) {
    head.borrows = {"embed"};  // the output layer is the embedding: the walk hands it to the head second
  } else {
    head.params.push_back(matrix("lm_head.weight", c.vocab_size, c.hidden));
  }
  return head;
}

}  // namespace

std::vector<UnitSpec> llama_units(const LlamaConfig& c) {
  validate(c);
  std::vector<UnitSpec> units;
  units.push_back(embed_unit(c));
  for (int i = 0; i < c.layers; ++i) units.push_back(layer_unit(c, i));
  units.push_back(head_unit(c));
  return units;
}

std::size_t llama_num_params(const LlamaConfig& config) {
  validate(config);
  return detail::model_params(detail::unit_numel(embed_unit(config)), config.layers,
                              detail::unit_numel(layer_unit(config, 0)), detail::unit_numel(head_unit(config)));
}

std::string describe(const LlamaConfig& c) {
  return fmt::format("Llama {} layers, hidden {}, {} heads ({} kv), intermediate {}, vocab {}, context {}{}", c.layers,
                     c.hidden, c.heads, c.kv(), c.intermediate, c.vocab_size, c.seq_len,
                     c.tie_word_embeddings ? ", tied embeddings" : "");
}

std::unique_ptr<UnitModel> make_host_llama(const LlamaConfig& config) {
  validate(config);
  return std::make_unique<detail::HostAdapter<LlamaModel<float>>>(LlamaModel<float>(config), llama_units(config),
                                                                  describe(config));
}

// ---- LlamaModel ------------------------------------------------------------------------------------

template <typename T>
LlamaModel<T>::LlamaModel(const LlamaConfig& config) : config_(config) {
  validate(config_);
  int next = kFixedLayerParams;
  if (config_.qkv_bias) {
    q_bias_ = next++;
    k_bias_ = next++;
    v_bias_ = next++;
  }
  if (config_.o_bias) o_bias_ = next;
}

template <typename T>
std::size_t LlamaModel<T>::unit_params(std::size_t unit) const {
  if (unit == 0) return kEmbedParams;
  if (unit + 1 == num_units()) return kHeadParams;
  return kFixedLayerParams + (config_.qkv_bias ? 3 : 0) + (config_.o_bias ? 1 : 0);
}

template <typename T>
void LlamaModel<T>::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                              int len, Pass pass) {
  detail::check_token_batch("LlamaModel", tokens, targets, batch, len, config_.seq_len, config_.vocab_size);
  tokens_.assign(tokens.begin(), tokens.end());
  targets_.assign(targets.begin(), targets.end());
  if (len != len_ || rope_cos_.empty())
    ops::rope_table(idx(len), idx(config_.dim()), config_.rope_theta, rope_cos_, rope_sin_);
  batch_ = batch;
  len_ = len;
  pass_ = pass;
  next_forward_ = 0;
  next_backward_ = 0;
  const std::size_t streams = pass != Pass::train ? 2 : kept_.enabled() ? 3 : idx(config_.layers) + 1;
  if (residual_.size() < streams) residual_.resize(streams);
  const std::size_t sets = pass == Pass::train && recompute_ != Recompute::full ? idx(config_.layers) : 1;
  if (layers_.size() < sets) layers_.resize(sets);
}

template <typename T>
void LlamaModel<T>::check_unit_params(const char* what, std::size_t unit, std::size_t count) const {
  if (count != unit_params(unit)) {
    throw UsageError(
        fmt::format("LlamaModel::{}: unit {} takes {} params, got {}", what, unit, unit_params(unit), count));
  }
}

template <typename T>
bool LlamaModel<T>::bf16_operand(std::size_t unit, std::size_t k) const {
  if (unit == 0 || unit >= num_units()) return false;
  if (unit + 1 == num_units()) return k == kOutput;  // lm_head.weight or the tied embedding
  return k == kQProj || k == kKProj || k == kVProj || k == kOProj || k == kGateProj || k == kUpProj || k == kDownProj;
}

template <typename T>
void LlamaModel<T>::take_params16(const char* what, std::size_t unit, std::span<const T* const> params,
                                  std::span<const bf16_t* const> params16) {
  detail::take_unit_params16<T>(
      "LlamaModel", what, unit, params, params16, [&](std::size_t k) { return bf16_operand(unit, k); }, w16_);
}

template <typename T>
bool LlamaModel<T>::attention_in_bf16() const {
  return w16_.size() > kQProj && w16_[kQProj] != nullptr;
}

template <typename T>
void LlamaModel<T>::linear_fwd(std::span<const T* const> p, std::size_t k, const T* bias, const T* x, T* y, Index rows,
                               Index in, Index out) {
  detail::unit_linear_forward(w16_, round_x_, p, k, bias, x, y, rows, in, out);
}

template <typename T>
void LlamaModel<T>::linear_bwd(std::span<const T* const> p, std::size_t k, const T* x, const T* dy, T* dx,
                               bool accumulate_dx, T* dw, T* dbias, Index rows, Index in, Index out) {
  detail::unit_linear_backward(w16_, round_x_, round_dy_, p, k, x, dy, dx, accumulate_dx, dw, dbias, rows, in, out);
}

template <typename T>
const T* LlamaModel<T>::param_or_null(std::span<const T* const> p, int k) const {
  return k < 0 ? nullptr : p[static_cast<std::size_t>(k)];
}

template <typename T>
T* LlamaModel<T>::grad_or_null(std::span<T* const> g, int k) const {
  return k < 0 ? nullptr : g[static_cast<std::size_t>(k)];
}

template <typename T>
void LlamaModel<T>::forward_unit(std::size_t unit, std::span<const T* const> params,
                                 std::span<const bf16_t* const> params16) {
  if (unit != next_forward_ || unit >= num_units() || len_ == 0) {
    throw UsageError(
        fmt::format("LlamaModel::forward_unit: unit {} called, expected unit {} (units run in order after set_batch)",
                    unit, next_forward_));
  }
  check_unit_params("forward_unit", unit, params.size());
  take_params16("forward_unit", unit, params, params16);
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const bool train = pass_ == Pass::train;
  if (unit == 0) {
    detail::resize_exact(residual(0), rows * d);
    T* out = residual(0).data();
    const T* table = params[0];
    par::for_chunks(rows, kEmbedRowChunk, [&](Index, Index b, Index e) {
      for (Index r = b; r < e; ++r) std::copy_n(table + idx(tokens_[r]) * d, d, out + r * d);
    });
  } else if (unit + 1 < num_units()) {
    std::vector<T>& out = residual(unit);
    detail::resize_exact(out, rows * d);
    LayerActs& kept = train ? kept_acts(unit) : layers_[0];
    forward_layer(kept, train ? recomputed_acts(unit) : kept, params, residual(unit - 1).data(), out.data());
    if (train && kept_.enabled() && overwritten(unit - 1)) kept_.offload(unit - 1, residual(unit - 1));
  } else {
    forward_head(params, residual(unit - 1).data());
    if (train) next_backward_ = num_units();
  }
  ++next_forward_;
}

template <typename T>
void LlamaModel<T>::forward_layer(LayerActs& a, LayerActs& r, std::span<const T* const> p, const T* in, T* out) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.intermediate);
  const Index len = idx(len_);
  const Index heads = idx(config_.heads);
  const Index kv = idx(config_.kv());
  const Index dim = idx(config_.dim());
  const Index q_width = heads * dim;
  const Index kv_width = kv * dim;
  detail::resize_exact(r.norm1, rows * d);
  detail::resize_exact(a.inv1, rows);
  ops::rmsnorm_forward(in, p[kNorm1], r.norm1.data(), a.inv1.data(), rows, d, config_.rms_norm_eps);
  detail::resize_exact(q_, rows * q_width);
  detail::resize_exact(k_, rows * kv_width);
  detail::resize_exact(v_, rows * kv_width);
  linear_fwd(p, kQProj, param_or_null(p, q_bias_), r.norm1.data(), q_.data(), rows, d, q_width);
  linear_fwd(p, kKProj, param_or_null(p, k_bias_), r.norm1.data(), k_.data(), rows, d, kv_width);
  linear_fwd(p, kVProj, param_or_null(p, v_bias_), r.norm1.data(), v_.data(), rows, d, kv_width);
  detail::resize_exact(a.qkv, rows * 3 * q_width);
  ops::gqa_pack(q_.data(), k_.data(), v_.data(), a.qkv.data(), rope_cos_.data(), rope_sin_.data(), rows, len, heads, kv,
                dim);
  detail::resize_exact(a.lse, idx(batch_) * heads * len);
  detail::resize_exact(a.att, rows * q_width);
  ops::flash_attention_forward(a.qkv.data(), a.lse.data(), a.att.data(), idx(batch_), len, heads, dim,
                               attention_in_bf16());
  detail::resize_exact(a.res1, rows * d);
  linear_fwd(p, kOProj, param_or_null(p, o_bias_), a.att.data(), a.res1.data(), rows, q_width, d);
  ops::add_inplace(a.res1.data(), in, rows * d);
  detail::resize_exact(r.norm2, rows * d);
  detail::resize_exact(a.inv2, rows);
  ops::rmsnorm_forward(a.res1.data(), p[kNorm2], r.norm2.data(), a.inv2.data(), rows, d, config_.rms_norm_eps);
  detail::resize_exact(a.gate, rows * f);
  detail::resize_exact(a.up, rows * f);
  detail::resize_exact(r.swiglu, rows * f);
  linear_fwd(p, kGateProj, nullptr, r.norm2.data(), a.gate.data(), rows, d, f);
  linear_fwd(p, kUpProj, nullptr, r.norm2.data(), a.up.data(), rows, d, f);
  ops::swiglu_forward(a.gate.data(), a.up.data(), r.swiglu.data(), rows * f);
  if (out == nullptr) return;
  linear_fwd(p, kDownProj, nullptr, r.swiglu.data(), out, rows, f, d);
  ops::add_inplace(out, a.res1.data(), rows * d);
}

template <typename T>
void LlamaModel<T>::forward_head(std::span<const T* const> p, const T* in) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  detail::resize_exact(normf_, rows * d);
  detail::resize_exact(invf_, rows);
  ops::rmsnorm_forward(in, p[0], normf_.data(), invf_.data(), rows, d, config_.rms_norm_eps);
  detail::resize_exact(logits_, rows * vocab);
  linear_fwd(p, 1, nullptr, normf_.data(), logits_.data(), rows, d, vocab);
  detail::resize_exact(position_loss_, rows);
  const T total = ops::cross_entropy_forward(logits_.data(), targets_.data(), position_loss_.data(), rows, vocab);
  loss_ = total / static_cast<T>(rows);
}

template <typename T>
void LlamaModel<T>::backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads,
                                  T seed_scale, std::span<const bf16_t* const> params16) {
  if (pass_ != Pass::train) {
    throw UsageError(
        fmt::format("LlamaModel::backward_unit: unit {} after an eval pass (set_batch with Pass::train)", unit));
  }
  if (next_backward_ == 0 || unit + 1 != next_backward_) {
    throw UsageError(fmt::format(
        "LlamaModel::backward_unit: unit {} called, but {} (units run in reverse order after every forward)", unit,
        next_backward_ == 0 ? std::string("no backward is due") : fmt::format("unit {} is next", next_backward_ - 1)));
  }
  check_unit_params("backward_unit", unit, params.size());
  take_params16("backward_unit", unit, params, params16);
  if (grads.size() != params.size()) {
    throw UsageError(fmt::format("LlamaModel::backward_unit: unit {} takes one gradient per param ({}), got {}", unit,
                                 params.size(), grads.size()));
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr) {
      throw UsageError(fmt::format("LlamaModel::backward_unit: unit {} gradient {} is null", unit, k));
    }
  }
  if (unit == 0) {
    backward_embed(grads);
  } else if (unit + 1 < num_units()) {
    backward_layer(unit, params, grads);
  } else {
    backward_head(params, grads, seed_scale);
  }
  --next_backward_;
}

template <typename T>
void LlamaModel<T>::backward_head(std::span<const T* const> p, std::span<T* const> g, T seed_scale) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  ops::cross_entropy_backward(logits_.data(), targets_.data(), logits_.data(), rows, vocab,
                              seed_scale / static_cast<T>(rows));
  detail::resize_exact(dnarrow_, rows * d);
  linear_bwd(p, 1, normf_.data(), logits_.data(), dnarrow_.data(), false, g[1], nullptr, rows, d, vocab);
  dresidual_.assign(rows * d, T(0));
  ops::rmsnorm_backward(residual(idx(config_.layers)).data(), p[0], invf_.data(), dnarrow_.data(), dresidual_.data(),
                        g[0], rows, d);
}

template <typename T>
void LlamaModel<T>::backward_layer(std::size_t unit, std::span<const T* const> p, std::span<T* const> g) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.intermediate);
  const Index len = idx(len_);
  const Index heads = idx(config_.heads);
  const Index kv = idx(config_.kv());
  const Index dim = idx(config_.dim());
  const Index q_width = heads * dim;
  const Index kv_width = kv * dim;
  if (kept_.enabled() && overwritten(unit - 1)) kept_.restore(unit - 1, residual(unit - 1));
  const T* in = residual(unit - 1).data();
  LayerActs& a = kept_acts(unit);
  LayerActs& r = recomputed_acts(unit);
  if (recompute_ == Recompute::full) {
    forward_layer(a, r, p, in, nullptr);
  } else if (recompute_ == Recompute::selective) {
    // The forward's own calls on the kept inputs: norm1 from the layer's input, norm2 from res1, SwiGLU
    // from gate and up.
    detail::resize_exact(r.norm1, rows * d);
    ops::rmsnorm_forward(in, p[kNorm1], r.norm1.data(), a.inv1.data(), rows, d, config_.rms_norm_eps);
    detail::resize_exact(r.norm2, rows * d);
    ops::rmsnorm_forward(a.res1.data(), p[kNorm2], r.norm2.data(), a.inv2.data(), rows, d, config_.rms_norm_eps);
    detail::resize_exact(r.swiglu, rows * f);
    ops::swiglu_forward(a.gate.data(), a.up.data(), r.swiglu.data(), rows * f);
  }
  T* dres = dresidual_.data();  // dL/d(layer output) now; dL/d(layer input) when done
  // MLP branch: out = res1 + down(silu(gate(norm2)) * up(norm2)).
  detail::resize_exact(dgate_, rows * f);
  detail::resize_exact(dup_, rows * f);
  linear_bwd(p, kDownProj, r.swiglu.data(), dres, dgate_.data(), false, g[kDownProj], nullptr, rows, f, d);
  ops::swiglu_backward(a.gate.data(), a.up.data(), dgate_.data(), dgate_.data(), dup_.data(), rows * f);
  detail::resize_exact(dnarrow_, rows * std::max(d, q_width));
  linear_bwd(p, kGateProj, r.norm2.data(), dgate_.data(), dnarrow_.data(), false, g[kGateProj], nullptr, rows, d, f);
  linear_bwd(p, kUpProj, r.norm2.data(), dup_.data(), dnarrow_.data(), true, g[kUpProj], nullptr, rows, d, f);
  ops::rmsnorm_backward(a.res1.data(), p[kNorm2], a.inv2.data(), dnarrow_.data(), dres, g[kNorm2], rows, d);
  // Attention branch: res1 = in + o_proj(attention(rope(q), rope(k), v)), q, k, v projections of norm1.
  linear_bwd(p, kOProj, a.att.data(), dres, dnarrow_.data(), false, g[kOProj], grad_or_null(g, o_bias_), rows, q_width,
             d);
  detail::resize_exact(dqkv_, rows * 3 * q_width);
  ops::flash_attention_backward(a.qkv.data(), a.att.data(), a.lse.data(), dnarrow_.data(), dqkv_.data(), idx(batch_),
                                len, heads, dim, attention_in_bf16());
  detail::resize_exact(q_, rows * q_width);
  detail::resize_exact(k_, rows * kv_width);
  detail::resize_exact(v_, rows * kv_width);
  ops::gqa_unpack(dqkv_.data(), q_.data(), k_.data(), v_.data(), rope_cos_.data(), rope_sin_.data(), rows, len, heads,
                  kv, dim);
  linear_bwd(p, kQProj, r.norm1.data(), q_.data(), dnarrow_.data(), false, g[kQProj], grad_or_null(g, q_bias_), rows, d,
             q_width);
  linear_bwd(p, kKProj, r.norm1.data(), k_.data(), dnarrow_.data(), true, g[kKProj], grad_or_null(g, k_bias_), rows, d,
             kv_width);
  linear_bwd(p, kVProj, r.norm1.data(), v_.data(), dnarrow_.data(), true, g[kVProj], grad_or_null(g, v_bias_), rows, d,
             kv_width);
  ops::rmsnorm_backward(in, p[kNorm1], a.inv1.data(), dnarrow_.data(), dres, g[kNorm1], rows, d);
}

template <typename T>
void LlamaModel<T>::backward_embed(std::span<T* const> g) {
  const Index d = idx(config_.hidden);
  const Index rows = idx(batch_) * idx(len_);
  T* table = g[0];
  // Rows sharing a token add into the same gradient row: the pool splits columns, each block adds every row
  // in row order.
  par::for_chunks(d, kEmbedColChunk, [&](Index, Index k0, Index k1) {
    for (Index r = 0; r < rows; ++r) {
      const T* dr = dresidual_.data() + r * d;
      T* row = table + idx(tokens_[r]) * d;
      for (Index k = k0; k < k1; ++k) row[k] += dr[k];
    }
  });
}

template <typename T>
void LlamaModel<T>::set_recompute(Recompute mode) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("LlamaModel::set_recompute: called between a train pass's forward and its backward");
  }
  if (mode == recompute_) return;
  if (kept_.enabled() && mode != Recompute::full) {
    throw UsageError(
        "LlamaModel::set_recompute: cpu_checkpointing offloads the inputs of full recomputation; turn "
        "it off first");
  }
  recompute_ = mode;
  // What the last mode kept is not what this one keeps: start from nothing (set_batch sizes layers_ again).
  layers_.clear();
  recomputed_ = LayerActs{};
}

template <typename T>
std::vector<T>& LlamaModel<T>::residual(std::size_t u) {
  if (pass_ != Pass::train) return residual_[u % 2];
  if (!kept_.enabled()) return residual_[u];
  // Offloaded: two buffers take turns as the layers' inputs and outputs, the host store keeps each layer's
  // input, and the last layer's output (the head's input) has a third of its own.
  return u == idx(config_.layers) ? residual_[2] : residual_[u % 2];
}

template <typename T>
void LlamaModel<T>::set_offload_kept_inputs(bool on) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("LlamaModel::set_offload_kept_inputs: called between a train pass's forward and its backward");
  }
  if (on && recompute_ != Recompute::full) {
    throw UsageError(
        fmt::format("LlamaModel: cpu_checkpointing offloads the inputs full recomputation keeps, and the "
                    "model recomputes \"{}\" (zero3.model.activation_checkpointing \"full\")",
                    to_string(recompute_)));
  }
  if (on == kept_.enabled()) return;
  kept_.set_enabled(on);
  residual_.clear();  // set_batch sizes the streams again for this layout
}

template <typename T>
std::size_t LlamaModel<T>::activation_bytes() const {
  std::size_t elems = 0;
  auto add = [&](const std::vector<T>& v) { elems += v.capacity(); };
  for (const std::vector<T>& r : residual_) add(r);
  std::vector<const LayerActs*> sets;
  for (const LayerActs& a : layers_) sets.push_back(&a);
  sets.push_back(&recomputed_);
  for (const LayerActs* a : sets) {
    for (const std::vector<T>* v : {&a->norm1, &a->inv1, &a->qkv, &a->lse, &a->att, &a->res1, &a->norm2, &a->inv2,
                                    &a->gate, &a->up, &a->swiglu}) {
      add(*v);
    }
  }
  for (const std::vector<T>* v : {&normf_, &invf_, &logits_, &position_loss_, &q_, &k_, &v_, &dresidual_, &dnarrow_,
                                  &dgate_, &dup_, &dqkv_, &rope_cos_, &rope_sin_}) {
    add(*v);
  }
  return elems * sizeof(T) + (round_x_.capacity() + round_dy_.capacity()) * sizeof(bf16_t) +
         (tokens_.capacity() + targets_.capacity()) * sizeof(std::int32_t);
}

template <typename T>
std::size_t LlamaModel<T>::planned_activation_bytes(int micro_batch, int eval_batch, int len, bool bf16_products,
                                                    Recompute recompute, bool offload) const {
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.intermediate);
  const Index vocab = idx(config_.vocab_size);
  const Index heads = idx(config_.heads);
  const Index q_width = heads * idx(config_.dim());
  const Index kv_width = idx(config_.kv()) * idx(config_.dim());
  const Index n = idx(len);
  const Index rows = idx(micro_batch) * n;
  const Index eval_rows = idx(eval_batch) * n;
  const Index layers = idx(config_.layers);
  detail::check_activation_bound(std::max(rows, eval_rows), layers, std::max({d, f, vocab, q_width, heads}));
  const auto both = [&](Index per_row) { return std::max(rows, eval_rows) * per_row; };
  const auto layer = [&](Index r, Index batch) {
    // norm1, res1, norm2; inv1, inv2; qkv; lse; att; gate, up, swiglu.
    return r * d * 3 + r * 2 + r * 3 * q_width + batch * heads * n + r * q_width + r * f * 3;
  };
  // Selective recomputation keeps norm1, norm2 and swiglu in recomputed_ only, one layer's worth.
  const bool selective = recompute == Recompute::selective;
  const auto dropped = [&](Index r) { return selective ? r * d * 2 + r * f : 0; };
  Index elems = 0;
  // residual_: a train pass keeps every unit's output, the held-out pass alternates two.
  if (offload) {
    // residual(): the held-out pass's two buffers, which a train pass shares (the second from 2 layers on),
    // and the head's input.
    elems += both(d) + std::max(layers >= 2 ? rows : 0, eval_rows) * d + rows * d;
  } else {
    for (Index u = 0; u <= layers; ++u) elems += u < 2 ? both(d) : rows * d;
  }
  const Index kept_layers = recompute == Recompute::full ? 1 : layers;
  for (Index b = 0; b < kept_layers; ++b) {
    // layers_[0] serves both passes: each of its buffers at the larger size (an eval pass keeps everything).
    const Index r = std::max(rows, eval_rows);
    elems += b > 0 ? layer(rows, idx(micro_batch)) - dropped(rows)
                   : layer(r, std::max(idx(micro_batch), idx(eval_batch))) - dropped(r) + dropped(eval_rows);
  }
  elems += dropped(rows);                                          // recomputed_
  elems += both(d) + both(1) + both(vocab) + both(1);              // normf_, invf_, logits_, losses
  elems += both(q_width) + 2 * both(kv_width);                     // q_, k_, v_
  elems += rows * d + rows * std::max(d, q_width) + 2 * rows * f;  // dresidual_, dnarrow_, dgate_, dup_
  elems += rows * 3 * q_width;                                     // dqkv_
  elems += 2 * n * (idx(config_.dim()) / 2);                       // the rotary table
  std::size_t bytes = elems * sizeof(T) + 2 * std::max(rows, eval_rows) * sizeof(std::int32_t);
  if (bf16_products) {
    bytes += (both(std::max({d, f, q_width})) + rows * std::max({q_width, f, d, vocab})) * sizeof(bf16_t);
  }
  return bytes;
}

template <typename T>
std::size_t LlamaModel<T>::planned_offloaded_bytes(int micro_batch, int len) const {
  // The inputs a later layer overwrites (overwritten()), each [rows, hidden].
  const Index layers = idx(config_.layers);
  return (layers >= 3 ? layers - 2 : 0) * idx(micro_batch) * idx(len) * idx(config_.hidden) * sizeof(T);
}

template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace zero3::models
