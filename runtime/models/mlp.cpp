// The MLP's units, param specs and the unit-by-unit forward and backward over the host kernels of gpt_ops.
// One prediction per window, so every activation is [batch, width]: small next to the GPT's [batch * len,
// width], and an eval pass that reuses buffers is all the saving there is to have.
#include "zero3/models/mlp.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "exact_resize.hpp"
#include "gpt_ops.hpp"
#include "host_adapter.hpp"
#include "param_count.hpp"
#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models {
namespace {

using ops::Index;

constexpr double kEmbedInitStd = 0.02;
constexpr double kHeadInitStd = 0.02;
constexpr std::size_t kEmbedParams = 1;
constexpr std::size_t kLayerParams = 2;
constexpr std::size_t kHeadParams = 2;

Index idx(int v) {
  return static_cast<Index>(v);
}

ParamSpec weight(std::string name, int rows, int cols, double std) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {rows, cols};
  p.init = ParamInit::normal({.std = std});
  return p;
}
ParamSpec bias(std::string name, int n) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {n};
  p.init = ParamInit::zeros();
  p.weight_decay = false;
  return p;
}

void require_positive(int value, const char* field) {
  if (value <= 0) throw ConfigError(fmt::format("zero3.model.{} must be positive, got {}", field, value));
}

}  // namespace

void validate(const MlpConfig& c) {
  require_positive(c.vocab_size, "vocab_size");
  require_positive(c.context, "seq_len");
  require_positive(c.layers, "layers");
  require_positive(c.hidden, "hidden_size");
  checked_mul<ConfigError>(c.context, c.hidden, "zero3.model: the first layer's input width (seq_len x hidden_size)");
}

namespace {

UnitSpec layer_unit(const MlpConfig& c, int i) {
  const std::string u = fmt::format("layers.{}", i);
  const int in = i == 0 ? c.input_width() : c.hidden;
  return {u,
          {weight(u + ".fc.weight", c.hidden, in, 1.0 / std::sqrt(static_cast<double>(in))),
           bias(u + ".fc.bias", c.hidden)}};
}

UnitSpec embed_unit(const MlpConfig& c) {
  return {"embed", {weight("wte.weight", c.vocab_size, c.hidden, kEmbedInitStd)}};
}

UnitSpec head_unit(const MlpConfig& c) {
  return {"head", {weight("head.weight", c.vocab_size, c.hidden, kHeadInitStd), bias("head.bias", c.vocab_size)}};
}

}  // namespace

std::vector<UnitSpec> mlp_units(const MlpConfig& c) {
  validate(c);
  std::vector<UnitSpec> units;
  units.push_back(embed_unit(c));
  for (int i = 0; i < c.layers; ++i) units.push_back(layer_unit(c, i));
  units.push_back(head_unit(c));
  return units;
}

std::size_t mlp_num_params(const MlpConfig& config) {
  validate(config);
  // The first layer's input is the window's embeddings; the others are alike.
  const std::size_t first =
      checked_add<ConfigError>(detail::unit_numel(embed_unit(config)), detail::unit_numel(layer_unit(config, 0)),
                               "zero3.model: the params of the model");
  const std::size_t other = config.layers > 1 ? detail::unit_numel(layer_unit(config, 1)) : 0;
  return detail::model_params(first, config.layers - 1, other, detail::unit_numel(head_unit(config)));
}

// ---- MlpModel ----------------------------------------------------------------------------------------

template <typename T>
MlpModel<T>::MlpModel(const MlpConfig& config) : config_(config) {
  validate(config_);
}

template <typename T>
void MlpModel<T>::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                            int len, Pass pass) {
  if (batch < 0 || (batch == 0 && pass == Pass::train)) {
    throw UsageError(fmt::format("MlpModel::set_batch: batch must be >= 1 (>= 0 for an eval pass), got {}", batch));
  }
  if (len < config_.context) {
    throw UsageError(
        fmt::format("MlpModel::set_batch: len must be >= the MLP's context (zero3.model.seq_len = {}), got {}",
                    config_.context, len));
  }
  const Index rows = idx(batch) * idx(len);
  if (tokens.size() != rows || targets.size() != rows) {
    throw UsageError(fmt::format("MlpModel::set_batch: tokens ({}) and targets ({}) must hold batch * len = {} ids",
                                 tokens.size(), targets.size(), rows));
  }
  for (Index i = 0; i < rows; ++i) {
    for (const auto& [ids, what] : {std::pair{tokens, "tokens"}, std::pair{targets, "targets"}}) {
      if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
        throw UsageError(
            fmt::format("MlpModel::set_batch: {}[{}] (window {}, position {}) = {} is outside the vocabulary [0, {})",
                        what, i, i / idx(len), i % idx(len), ids[i], config_.vocab_size));
      }
    }
  }
  const Index context = idx(config_.context);
  detail::resize_exact(inputs_, idx(batch) * context);
  detail::resize_exact(targets_, idx(batch));
  for (Index b = 0; b < idx(batch); ++b) {
    const Index last = (b + 1) * idx(len);  // one past the window's last position
    for (Index j = 0; j < context; ++j) inputs_[b * context + j] = tokens[last - context + j];
    targets_[b] = targets[last - 1];
  }
  batch_ = batch;
  pass_ = pass;
  has_batch_ = true;
  next_forward_ = 0;
  next_backward_ = 0;
  const std::size_t pre_sets = pass == Pass::train && recompute_ != Recompute::full ? idx(config_.layers) : 1;
  const std::size_t post_sets = pass != Pass::train ? 2 : kept_.enabled() ? 3 : idx(config_.layers);
  if (pre_.size() < pre_sets) pre_.resize(pre_sets);
  if (post_.size() < post_sets) post_.resize(post_sets);
}

template <typename T>
void MlpModel<T>::check_call(const char* what, std::size_t unit, std::size_t count, const T* const* ptrs) const {
  const std::size_t expected = unit == 0 ? kEmbedParams : unit + 1 == num_units() ? kHeadParams : kLayerParams;
  if (count != expected) {
    throw UsageError(fmt::format("MlpModel::{}: unit {} takes {} params, got {}", what, unit, expected, count));
  }
  for (std::size_t k = 0; k < count; ++k) {
    if (ptrs[k] == nullptr) throw UsageError(fmt::format("MlpModel::{}: unit {} param {} is null", what, unit, k));
  }
}

// Layer i reads the embeddings (i == 0) or layer i-1's output; in eval the outputs alternate between two
// buffers (layer i writes i % 2), since nothing is kept for a backward.
template <typename T>
std::size_t MlpModel<T>::post_slot(std::size_t layer) const {
  if (pass_ != Pass::train) return layer % 2;
  if (!kept_.enabled()) return layer;
  // Offloaded: two buffers take turns as the layers' inputs and outputs, the host store keeps each layer's
  // input, and the last layer's output (the head's input) has a third of its own.
  return layer + 1 == idx(config_.layers) ? 2 : layer % 2;
}

template <typename T>
const T* MlpModel<T>::layer_input(std::size_t layer) const {
  return layer == 0 ? embed_.data() : post_[post_slot(layer - 1)].data();
}

template <typename T>
T* MlpModel<T>::layer_output(std::size_t layer) {
  return post_[post_slot(layer)].data();
}

template <typename T>
void MlpModel<T>::forward_unit(std::size_t unit, std::span<const T* const> params) {
  if (!has_batch_ || unit != next_forward_ || unit >= num_units()) {
    throw UsageError(
        fmt::format("MlpModel::forward_unit: unit {} called, expected {} (units run in order after set_batch)", unit,
                    !has_batch_                    ? std::string("set_batch first")
                    : next_forward_ == num_units() ? std::string("none: every unit's forward is done")
                                                   : fmt::format("unit {}", next_forward_)));
  }
  check_call("forward_unit", unit, params.size(), params.data());
  const Index rows = idx(batch_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  const bool train = pass_ == Pass::train;
  if (unit == 0) {
    const Index width = idx(config_.input_width());
    detail::resize_exact(embed_, rows * width);
    const T* wte = params[0];
    for (Index i = 0; i < rows * idx(config_.context); ++i) {
      const T* e = wte + idx(inputs_[i]) * d;
      std::copy(e, e + d, embed_.data() + i * d);  // row b is its context's embeddings, oldest first
    }
  } else if (unit + 1 < num_units()) {
    const std::size_t layer = unit - 1;
    const Index in = layer == 0 ? idx(config_.input_width()) : d;
    std::vector<T>& pre = pre_[train && recompute_ != Recompute::full ? layer : 0];
    detail::resize_exact(pre, rows * d);
    detail::resize_exact(post_[post_slot(layer)], rows * d);
    ops::linear_forward(layer_input(layer), params[0], params[1], pre.data(), rows, in, d);
    ops::gelu_forward(pre.data(), layer_output(layer), rows * d);
    if (train && kept_.enabled() && overwritten(layer)) kept_.offload(layer, input_buffer(layer));
  } else {
    detail::resize_exact(logits_, rows * vocab);
    ops::linear_forward(layer_input(idx(config_.layers)), params[0], params[1], logits_.data(), rows, d, vocab);
    detail::resize_exact(position_loss_, rows);
    const T total = ops::cross_entropy_forward(logits_.data(), targets_.data(), position_loss_.data(), rows, vocab);
    loss_ = rows == 0 ? T(0) : total / static_cast<T>(rows);
    if (train) next_backward_ = num_units();
  }
  ++next_forward_;
}

template <typename T>
void MlpModel<T>::backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads,
                                T seed_scale) {
  if (pass_ != Pass::train) {
    throw UsageError(
        fmt::format("MlpModel::backward_unit: unit {} after an eval pass (set_batch with Pass::train)", unit));
  }
  if (next_backward_ == 0 || unit + 1 != next_backward_) {
    throw UsageError(fmt::format(
        "MlpModel::backward_unit: unit {} called, but {} (units run in reverse order after every forward)", unit,
        next_backward_ == 0 ? std::string("no backward is due") : fmt::format("unit {} is next", next_backward_ - 1)));
  }
  check_call("backward_unit", unit, params.size(), params.data());
  if (grads.size() != params.size()) {
    throw UsageError(fmt::format("MlpModel::backward_unit: unit {} takes one gradient per param ({}), got {}", unit,
                                 params.size(), grads.size()));
  }
  for (std::size_t k = 0; k < grads.size(); ++k) {
    if (grads[k] == nullptr)
      throw UsageError(fmt::format("MlpModel::backward_unit: unit {} gradient {} is null", unit, k));
  }
  const Index rows = idx(batch_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  if (unit + 1 == num_units()) {
    // dlogits overwrite the logits: nothing reads them after this.
    ops::cross_entropy_backward(logits_.data(), targets_.data(), logits_.data(), rows, vocab,
                                seed_scale / static_cast<T>(rows));
    detail::resize_exact(dpost_, rows * d);
    ops::linear_backward(layer_input(idx(config_.layers)), params[0], logits_.data(), dpost_.data(), false, grads[0],
                         grads[1], rows, d, vocab);
  } else if (unit > 0) {
    const std::size_t layer = unit - 1;
    const Index in = layer == 0 ? idx(config_.input_width()) : d;
    if (kept_.enabled() && overwritten(layer)) kept_.restore(layer, input_buffer(layer));
    const T* pre = pre_[recompute_ == Recompute::full ? 0 : layer].data();
    if (recompute_ == Recompute::full) {
      // The forward's own product again, into the one buffer all layers share.
      ops::linear_forward(layer_input(layer), params[0], params[1], pre_[0].data(), rows, in, d);
    }
    detail::resize_exact(dpre_, rows * d);
    ops::gelu_backward(pre, dpost_.data(), dpre_.data(), rows * d);
    // dpost_ now becomes dL/d(this layer's input): the previous layer's output, or the embeddings.
    T* dx = dpost_.data();
    if (layer == 0) {
      detail::resize_exact(dembed_, rows * in);
      dx = dembed_.data();
    }
    ops::linear_backward(layer_input(layer), params[0], dpre_.data(), dx, false, grads[0], grads[1], rows, in, d);
  } else {
    T* dwte = grads[0];
    for (Index i = 0; i < rows * idx(config_.context); ++i) {
      const T* g = dembed_.data() + i * d;
      T* row = dwte + idx(inputs_[i]) * d;
      for (Index k = 0; k < d; ++k) row[k] += g[k];
    }
  }
  --next_backward_;
}

template <typename T>
void MlpModel<T>::set_recompute(Recompute mode) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("MlpModel::set_recompute: called between a train pass's forward and its backward");
  }
  if (mode == recompute_) return;
  if (kept_.enabled() && mode != Recompute::full) {
    throw UsageError(
        "MlpModel::set_recompute: cpu_checkpointing offloads the inputs of full recomputation; turn it "
        "off first");
  }
  recompute_ = mode;
  pre_.clear();  // set_batch sizes it again for this mode
}

template <typename T>
void MlpModel<T>::set_offload_kept_inputs(bool on) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("MlpModel::set_offload_kept_inputs: called between a train pass's forward and its backward");
  }
  if (on && recompute_ != Recompute::full) {
    throw UsageError(
        fmt::format("MlpModel: cpu_checkpointing offloads the inputs full recomputation keeps, and the "
                    "model recomputes \"{}\" (zero3.model.activation_checkpointing \"full\")",
                    to_string(recompute_)));
  }
  if (on == kept_.enabled()) return;
  kept_.set_enabled(on);
  post_.clear();  // set_batch sizes the outputs again for this layout
}

template <typename T>
std::size_t MlpModel<T>::activation_bytes() const {
  std::size_t elems = embed_.capacity() + logits_.capacity() + position_loss_.capacity() + dpost_.capacity() +
                      dpre_.capacity() + dembed_.capacity();
  for (const std::vector<T>& v : pre_) elems += v.capacity();
  for (const std::vector<T>& v : post_) elems += v.capacity();
  return elems * sizeof(T) + (inputs_.capacity() + targets_.capacity()) * sizeof(std::int32_t);
}

template <typename T>
std::size_t MlpModel<T>::planned_activation_bytes(int micro_batch, int eval_batch, Recompute recompute,
                                                  bool offload) const {
  const Index rows = idx(micro_batch);
  const Index eval_rows = idx(eval_batch);
  const Index both = std::max(rows, eval_rows);
  const Index d = idx(config_.hidden);
  const Index in = idx(config_.input_width());
  const Index layers = idx(config_.layers);
  detail::check_activation_bound(both, layers, std::max({in, d, idx(config_.vocab_size)}));
  Index elems = both * in + both * idx(config_.vocab_size) + both;  // embed_, logits_, losses
  const Index pre_sets = recompute == Recompute::full ? 1 : layers;
  for (Index l = 0; l < pre_sets; ++l) elems += (l == 0 ? both : rows) * d;  // pre_: eval uses the first
  // post_: a train pass keeps every layer's output, the held-out pass alternates two.
  if (offload) {
    // post_slot(): the held-out pass's two buffers, which a train pass shares (the first from 2 layers on,
    // the second from 3), and the head's input.
    const Index first = std::max(layers >= 2 ? rows : 0, layers >= 1 ? eval_rows : 0);
    const Index second = std::max(layers >= 3 ? rows : 0, layers >= 2 ? eval_rows : 0);
    elems += (first + second + rows) * d;
  } else {
    for (Index l = 0; l < layers; ++l) elems += (l < 2 ? both : rows) * d;
  }
  elems += rows * d + rows * d + rows * in;  // dpost_, dpre_, dembed_
  return elems * sizeof(T) + (both * idx(config_.context) + both) * sizeof(std::int32_t);
}

template <typename T>
std::size_t MlpModel<T>::planned_offloaded_bytes(int micro_batch) const {
  // The inputs of layers 1 .. layers - 3 (overwritten()).
  const Index layers = idx(config_.layers);
  return (layers >= 4 ? layers - 3 : 0) * idx(micro_batch) * idx(config_.hidden) * sizeof(T);
}

template class MlpModel<float>;
template class MlpModel<double>;

}  // namespace zero3::models

namespace zero3::models {

std::string describe(const MlpConfig& config) {
  return fmt::format("MLP {} hidden layers of {}, context {}, vocab {}", config.layers, config.hidden, config.context,
                     config.vocab_size);
}

std::unique_ptr<UnitModel> make_host_mlp(const MlpConfig& config) {
  validate(config);
  return std::make_unique<detail::HostAdapter<MlpModel<float>>>(MlpModel<float>(config), mlp_units(config),
                                                                describe(config));
}

}  // namespace zero3::models
