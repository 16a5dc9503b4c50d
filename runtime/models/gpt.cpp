// The GPT's units, param specs and the unit-by-unit forward and backward over the host kernels of
// gpt_ops. Backward runs the residual stream's gradient through one buffer, in place: each block adds its
// branches' input gradients to it, so no per-unit gradient copies are made. The four matrix weights of a
// block and lm_head may come in bf16 (params16): their layers then run bf16 products.
#include "zero3/models/gpt.hpp"

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
#include "param_count.hpp"
#include "unit_linear.hpp"
#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models {
namespace {

using ops::Index;

constexpr double kInitStd = 0.02;
constexpr double kPositionInitStd = 0.01;
constexpr std::size_t kEmbedParams = 2;
constexpr std::size_t kBlockParams = 12;
constexpr std::size_t kHeadParams = 3;

// Param positions within a block unit, in gpt_units() order.
enum BlockParam : std::size_t {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
};

Index idx(int v) {
  return static_cast<Index>(v);
}

// Rows per chunk of the embedding's loops, columns per block of its gradient's (the pool's chunking).
constexpr Index kEmbedRowChunk = 16;
constexpr Index kEmbedColChunk = 32;

ParamSpec weight(std::string name, int rows, int cols, double std) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {rows, cols};
  p.init = ParamInit::normal({.std = std});
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

void validate(const GptConfig& c) {
  require_positive(c.vocab_size, "vocab_size");
  require_positive(c.seq_len, "seq_len");
  require_positive(c.layers, "layers");
  require_positive(c.hidden, "hidden");
  require_positive(c.heads, "heads");
  require_positive(c.mlp_ratio, "mlp_ratio");
  if (c.hidden % c.heads != 0) {
    throw ConfigError(
        fmt::format("zero3.model.hidden ({}) must be a multiple of zero3.model.heads ({})", c.hidden, c.heads));
  }
  // The widths the params' shapes and the kernels' loops take as int.
  checked_mul<ConfigError>(c.mlp_ratio, c.hidden, "zero3.model: the MLP's width (4 x hidden_size)");
  checked_mul<ConfigError>(3, c.hidden, "zero3.model: the attention's q, k and v rows (3 x hidden_size)");
}

namespace {

UnitSpec embed_unit(const GptConfig& c) {
  return {"embed",
          {weight("wte.weight", c.vocab_size, c.hidden, kInitStd),
           weight("wpe.weight", c.seq_len, c.hidden, kPositionInitStd)}};
}

UnitSpec block_unit(const GptConfig& c, int i) {
  const int d = c.hidden;
  const int f = c.mlp_hidden();
  // GPT-2's scaling of the projections that write into the residual stream: 2 per block, so the stream's
  // variance at init does not grow with depth.
  const double residual_std = kInitStd / std::sqrt(2.0 * c.layers);
  const std::string u = fmt::format("blocks.{}", i);
  return {
      u,
      {vector_param(u + ".ln1.weight", d, ParamInit::ones()), vector_param(u + ".ln1.bias", d, ParamInit::zeros()),
       weight(u + ".attn.qkv.weight", 3 * d, d, kInitStd),
       vector_param(u + ".attn.qkv.bias", 3 * d, ParamInit::zeros()),
       weight(u + ".attn.proj.weight", d, d, residual_std), vector_param(u + ".attn.proj.bias", d, ParamInit::zeros()),
       vector_param(u + ".ln2.weight", d, ParamInit::ones()), vector_param(u + ".ln2.bias", d, ParamInit::zeros()),
       weight(u + ".mlp.fc.weight", f, d, kInitStd), vector_param(u + ".mlp.fc.bias", f, ParamInit::zeros()),
       weight(u + ".mlp.proj.weight", d, f, residual_std), vector_param(u + ".mlp.proj.bias", d, ParamInit::zeros())}};
}

UnitSpec head_unit(const GptConfig& c) {
  const int d = c.hidden;
  return {"head",
          {vector_param("ln_f.weight", d, ParamInit::ones()), vector_param("ln_f.bias", d, ParamInit::zeros()),
           weight("lm_head.weight", c.vocab_size, d, kInitStd)}};
}

}  // namespace

std::vector<UnitSpec> gpt_units(const GptConfig& c) {
  validate(c);
  std::vector<UnitSpec> units;
  units.push_back(embed_unit(c));
  for (int i = 0; i < c.layers; ++i) units.push_back(block_unit(c, i));
  units.push_back(head_unit(c));
  return units;
}

std::size_t gpt_num_params(const GptConfig& config) {
  validate(config);
  // Counted from one block, without declaring every unit: a count of layers no memory holds is counted too.
  return detail::model_params(detail::unit_numel(embed_unit(config)), config.layers,
                              detail::unit_numel(block_unit(config, 0)), detail::unit_numel(head_unit(config)));
}

void set_blas_threads(int threads) {
  if (threads < 1) throw UsageError(fmt::format("set_blas_threads: threads must be >= 1, got {}", threads));
  par::set_threads(threads);
  gemm::configure_backends();
}

int blas_threads() {
  return par::threads();
}

bool host_bf16_products() {
  return gemm::bf16_native();
}

// ---- GptModel ----------------------------------------------------------------------------------------

template <typename T>
GptModel<T>::GptModel(const GptConfig& config) : config_(config) {
  validate(config_);
}

template <typename T>
void GptModel<T>::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                            int len, Pass pass) {
  detail::check_token_batch("GptModel", tokens, targets, batch, len, config_.seq_len, config_.vocab_size);
  tokens_.assign(tokens.begin(), tokens.end());
  targets_.assign(targets.begin(), targets.end());
  batch_ = batch;
  len_ = len;
  pass_ = pass;
  next_forward_ = 0;
  next_backward_ = 0;
  const std::size_t streams = pass != Pass::train ? 2 : kept_.enabled() ? 3 : idx(config_.layers) + 1;
  if (residual_.size() < streams) residual_.resize(streams);
  const std::size_t block_sets = pass == Pass::train && recompute_ != Recompute::full ? idx(config_.layers) : 1;
  if (blocks_.size() < block_sets) blocks_.resize(block_sets);
}

template <typename T>
void GptModel<T>::check_unit_params(const char* what, std::size_t unit, std::size_t count) const {
  const std::size_t expected = unit == 0 ? kEmbedParams : unit + 1 == num_units() ? kHeadParams : kBlockParams;
  if (count != expected) {
    throw UsageError(fmt::format("GptModel::{}: unit {} takes {} params, got {}", what, unit, expected, count));
  }
}

template <typename T>
bool GptModel<T>::bf16_operand(std::size_t unit, std::size_t k) const {
  if (unit == 0 || unit >= num_units()) return false;
  if (unit + 1 == num_units()) return k == 2;  // lm_head.weight
  return k == kQkvWeight || k == kAttnProjWeight || k == kFcWeight || k == kMlpProjWeight;
}

template <typename T>
void GptModel<T>::take_params16(const char* what, std::size_t unit, std::span<const T* const> params,
                                std::span<const bf16_t* const> params16) {
  detail::take_unit_params16<T>(
      "GptModel", what, unit, params, params16, [&](std::size_t k) { return bf16_operand(unit, k); }, w16_);
}

template <typename T>
bool GptModel<T>::attention_in_bf16() const {
  return w16_.size() > kQkvWeight && w16_[kQkvWeight] != nullptr;
}

template <typename T>
void GptModel<T>::linear_fwd(std::span<const T* const> p, std::size_t k, const T* bias, const T* x, T* y, Index rows,
                             Index in, Index out) {
  detail::unit_linear_forward(w16_, round_x_, p, k, bias, x, y, rows, in, out);
}

template <typename T>
void GptModel<T>::linear_bwd(std::span<const T* const> p, std::size_t k, const T* x, const T* dy, T* dx, T* dw,
                             T* dbias, Index rows, Index in, Index out) {
  detail::unit_linear_backward(w16_, round_x_, round_dy_, p, k, x, dy, dx, false, dw, dbias, rows, in, out);
}

template <typename T>
void GptModel<T>::forward_unit(std::size_t unit, std::span<const T* const> params,
                               std::span<const bf16_t* const> params16) {
  if (unit != next_forward_ || unit >= num_units() || len_ == 0) {
    throw UsageError(
        fmt::format("GptModel::forward_unit: unit {} called, expected unit {} (units run in order "
                    "after set_batch)",
                    unit, next_forward_));
  }
  check_unit_params("forward_unit", unit, params.size());
  take_params16("forward_unit", unit, params, params16);
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const bool train = pass_ == Pass::train;
  // Train keeps every unit's output; eval alternates two buffers (unit u writes u % 2).
  if (unit == 0) {
    detail::resize_exact(residual(0), rows * d);
    forward_embed(params, residual(0).data());
  } else if (unit + 1 < num_units()) {
    std::vector<T>& out = residual(unit);
    detail::resize_exact(out, rows * d);
    BlockActs& kept = train ? kept_acts(unit) : blocks_[0];
    forward_block(kept, train ? recomputed_acts(unit) : kept, params, residual(unit - 1).data(), out.data());
    if (train && kept_.enabled() && overwritten(unit - 1)) kept_.offload(unit - 1, residual(unit - 1));
  } else {
    forward_head(params, residual(unit - 1).data());
    if (train) next_backward_ = num_units();
  }
  ++next_forward_;
}

template <typename T>
void GptModel<T>::forward_embed(std::span<const T* const> params, T* out) {
  const Index d = idx(config_.hidden);
  const T* wte = params[0];
  const T* wpe = params[1];
  const Index rows = idx(batch_) * idx(len_);
  par::for_chunks(rows, kEmbedRowChunk, [&](Index, Index begin, Index end) {
    for (Index r = begin; r < end; ++r) {
      const T* tok = wte + idx(tokens_[r]) * d;
      const T* pos = wpe + (r % idx(len_)) * d;
      T* o = out + r * d;
      for (Index k = 0; k < d; ++k) o[k] = tok[k] + pos[k];
    }
  });
}

template <typename T>
void GptModel<T>::forward_block(BlockActs& a, BlockActs& r, std::span<const T* const> p, const T* in, T* out) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.mlp_hidden());
  const Index len = idx(len_);
  const Index heads = idx(config_.heads);
  detail::resize_exact(r.ln1, rows * d);
  detail::resize_exact(a.ln1_stat, 2 * rows);
  ops::layernorm_forward(in, p[kLn1Weight], p[kLn1Bias], r.ln1.data(), a.ln1_stat.data(), rows, d);
  detail::resize_exact(a.qkv, rows * 3 * d);
  linear_fwd(p, kQkvWeight, p[kQkvBias], r.ln1.data(), a.qkv.data(), rows, d, 3 * d);
  detail::resize_exact(a.lse, idx(batch_) * heads * len);
  detail::resize_exact(a.att, rows * d);
  ops::flash_attention_forward(a.qkv.data(), a.lse.data(), a.att.data(), idx(batch_), len, heads,
                               idx(config_.head_dim()), attention_in_bf16());
  detail::resize_exact(a.res1, rows * d);
  linear_fwd(p, kAttnProjWeight, p[kAttnProjBias], a.att.data(), a.res1.data(), rows, d, d);
  ops::add_inplace(a.res1.data(), in, rows * d);
  detail::resize_exact(r.ln2, rows * d);
  detail::resize_exact(a.ln2_stat, 2 * rows);
  ops::layernorm_forward(a.res1.data(), p[kLn2Weight], p[kLn2Bias], r.ln2.data(), a.ln2_stat.data(), rows, d);
  detail::resize_exact(a.fc, rows * f);
  linear_fwd(p, kFcWeight, p[kFcBias], r.ln2.data(), a.fc.data(), rows, d, f);
  detail::resize_exact(r.gelu, rows * f);
  ops::gelu_forward(a.fc.data(), r.gelu.data(), rows * f);
  if (out == nullptr) return;
  linear_fwd(p, kMlpProjWeight, p[kMlpProjBias], r.gelu.data(), out, rows, f, d);
  ops::add_inplace(out, a.res1.data(), rows * d);
}

template <typename T>
void GptModel<T>::forward_head(std::span<const T* const> p, const T* in) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  detail::resize_exact(lnf_, rows * d);
  detail::resize_exact(lnf_stat_, 2 * rows);
  ops::layernorm_forward(in, p[0], p[1], lnf_.data(), lnf_stat_.data(), rows, d);
  detail::resize_exact(logits_, rows * vocab);
  linear_fwd(p, 2, nullptr, lnf_.data(), logits_.data(), rows, d, vocab);
  detail::resize_exact(position_loss_, rows);
  const T total = ops::cross_entropy_forward(logits_.data(), targets_.data(), position_loss_.data(), rows, vocab);
  loss_ = total / static_cast<T>(rows);
}

template <typename T>
void GptModel<T>::backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads,
                                T seed_scale, std::span<const bf16_t* const> params16) {
  if (pass_ != Pass::train) {
    throw UsageError(
        fmt::format("GptModel::backward_unit: unit {} after an eval pass (set_batch with Pass::train)", unit));
  }
  if (next_backward_ == 0 || unit + 1 != next_backward_) {
    throw UsageError(fmt::format(
        "GptModel::backward_unit: unit {} called, but {} (units run in reverse order "
        "after every forward)",
        unit,
        next_backward_ == 0 ? std::string("no backward is due") : fmt::format("unit {} is next", next_backward_ - 1)));
  }
  check_unit_params("backward_unit", unit, params.size());
  take_params16("backward_unit", unit, params, params16);
  if (grads.size() != params.size()) {
    throw UsageError(fmt::format("GptModel::backward_unit: unit {} takes one gradient per param ({}), got {}", unit,
                                 params.size(), grads.size()));
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr)
      throw UsageError(fmt::format("GptModel::backward_unit: unit {} gradient {} is null", unit, k));
  }
  if (unit == 0) {
    backward_embed(grads);
  } else if (unit + 1 < num_units()) {
    backward_block(unit, params, grads);
  } else {
    backward_head(params, grads, seed_scale);
  }
  --next_backward_;
}

template <typename T>
void GptModel<T>::backward_head(std::span<const T* const> p, std::span<T* const> g, T seed_scale) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index vocab = idx(config_.vocab_size);
  // dlogits overwrite the logits: at GPT vocabularies they are the largest activation, and nothing reads
  // the logits after this.
  ops::cross_entropy_backward(logits_.data(), targets_.data(), logits_.data(), rows, vocab,
                              seed_scale / static_cast<T>(rows));
  detail::resize_exact(dnarrow_, rows * d);
  linear_bwd(p, 2, lnf_.data(), logits_.data(), dnarrow_.data(), g[2], nullptr, rows, d, vocab);
  dresidual_.assign(rows * d, T(0));
  ops::layernorm_backward(residual(idx(config_.layers)).data(), p[0], lnf_stat_.data(), dnarrow_.data(),
                          dresidual_.data(), g[0], g[1], rows, d);
}

template <typename T>
void GptModel<T>::backward_block(std::size_t unit, std::span<const T* const> p, std::span<T* const> g) {
  const Index rows = idx(batch_) * idx(len_);
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.mlp_hidden());
  const Index len = idx(len_);
  if (kept_.enabled() && overwritten(unit - 1)) kept_.restore(unit - 1, residual(unit - 1));
  const T* in = residual(unit - 1).data();
  BlockActs& a = kept_acts(unit);
  BlockActs& r = recomputed_acts(unit);
  if (recompute_ == Recompute::full) {
    forward_block(a, r, p, in, nullptr);
  } else if (recompute_ == Recompute::selective) {
    // The forward's own calls on the kept inputs: ln1 from the block's input, ln2 and GELU from res1 and fc.
    detail::resize_exact(r.ln1, rows * d);
    ops::layernorm_forward(in, p[kLn1Weight], p[kLn1Bias], r.ln1.data(), a.ln1_stat.data(), rows, d);
    detail::resize_exact(r.ln2, rows * d);
    ops::layernorm_forward(a.res1.data(), p[kLn2Weight], p[kLn2Bias], r.ln2.data(), a.ln2_stat.data(), rows, d);
    detail::resize_exact(r.gelu, rows * f);
    ops::gelu_forward(a.fc.data(), r.gelu.data(), rows * f);
  }
  T* dres = dresidual_.data();  // dL/d(block output) now; dL/d(block input) when done
  // MLP branch: out = res1 + proj(gelu(fc(ln2(res1)))).
  detail::resize_exact(dwide_, rows * f);
  linear_bwd(p, kMlpProjWeight, r.gelu.data(), dres, dwide_.data(), g[kMlpProjWeight], g[kMlpProjBias], rows, f, d);
  ops::gelu_backward(a.fc.data(), dwide_.data(), dwide_.data(), rows * f);
  detail::resize_exact(dnarrow_, rows * d);
  linear_bwd(p, kFcWeight, r.ln2.data(), dwide_.data(), dnarrow_.data(), g[kFcWeight], g[kFcBias], rows, d, f);
  ops::layernorm_backward(a.res1.data(), p[kLn2Weight], a.ln2_stat.data(), dnarrow_.data(), dres, g[kLn2Weight],
                          g[kLn2Bias], rows, d);
  // Attention branch: res1 = in + proj(attention(qkv(ln1(in)))).
  linear_bwd(p, kAttnProjWeight, a.att.data(), dres, dnarrow_.data(), g[kAttnProjWeight], g[kAttnProjBias], rows, d, d);
  detail::resize_exact(dqkv_, rows * 3 * d);
  ops::flash_attention_backward(a.qkv.data(), a.att.data(), a.lse.data(), dnarrow_.data(), dqkv_.data(), idx(batch_),
                                len, idx(config_.heads), idx(config_.head_dim()), attention_in_bf16());
  linear_bwd(p, kQkvWeight, r.ln1.data(), dqkv_.data(), dnarrow_.data(), g[kQkvWeight], g[kQkvBias], rows, d, 3 * d);
  ops::layernorm_backward(in, p[kLn1Weight], a.ln1_stat.data(), dnarrow_.data(), dres, g[kLn1Weight], g[kLn1Bias], rows,
                          d);
}

template <typename T>
void GptModel<T>::backward_embed(std::span<T* const> g) {
  const Index d = idx(config_.hidden);
  T* dwte = g[0];
  T* dwpe = g[1];
  const Index rows = idx(batch_) * idx(len_);
  // Rows sharing a token (or a position) add into the same gradient row, so the pool splits columns:
  // each block adds every row in row order.
  par::for_chunks(d, kEmbedColChunk, [&](Index, Index k0, Index k1) {
    for (Index r = 0; r < rows; ++r) {
      const T* dr = dresidual_.data() + r * d;
      T* tok = dwte + idx(tokens_[r]) * d;
      T* pos = dwpe + (r % idx(len_)) * d;
      for (Index k = k0; k < k1; ++k) {
        tok[k] += dr[k];
        pos[k] += dr[k];
      }
    }
  });
}

template <typename T>
void GptModel<T>::set_recompute(Recompute mode) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("GptModel::set_recompute: called between a train pass's forward and its backward");
  }
  if (mode == recompute_) return;
  if (kept_.enabled() && mode != Recompute::full) {
    throw UsageError(
        "GptModel::set_recompute: cpu_checkpointing offloads the inputs of full recomputation; turn it "
        "off first");
  }
  recompute_ = mode;
  // What the last mode kept is not what this one keeps: start from nothing (set_batch sizes blocks_ again).
  blocks_.clear();
  recomputed_ = BlockActs{};
}

template <typename T>
std::vector<T>& GptModel<T>::residual(std::size_t u) {
  if (pass_ != Pass::train) return residual_[u % 2];
  if (!kept_.enabled()) return residual_[u];
  // Offloaded: two buffers take turns as the blocks' inputs and outputs, the host store keeps each block's
  // input, and the last block's output (the head's input) has a third of its own.
  return u == idx(config_.layers) ? residual_[2] : residual_[u % 2];
}

template <typename T>
void GptModel<T>::set_offload_kept_inputs(bool on) {
  if (next_forward_ != 0 && next_backward_ != 0) {
    throw UsageError("GptModel::set_offload_kept_inputs: called between a train pass's forward and its backward");
  }
  if (on && recompute_ != Recompute::full) {
    throw UsageError(
        fmt::format("GptModel: cpu_checkpointing offloads the inputs full recomputation keeps, and the "
                    "model recomputes \"{}\" (zero3.model.activation_checkpointing \"full\")",
                    to_string(recompute_)));
  }
  if (on == kept_.enabled()) return;
  kept_.set_enabled(on);
  residual_.clear();  // set_batch sizes the streams again for this layout
}

template <typename T>
std::vector<const typename GptModel<T>::BlockActs*> GptModel<T>::blocks_with(const BlockActs& extra) const {
  std::vector<const BlockActs*> all;
  for (const BlockActs& a : blocks_) all.push_back(&a);
  all.push_back(&extra);
  return all;
}

template <typename T>
std::size_t GptModel<T>::activation_bytes() const {
  std::size_t elems = 0;
  auto add = [&](const std::vector<T>& v) { elems += v.capacity(); };
  for (const std::vector<T>& r : residual_) add(r);
  for (const BlockActs* a : blocks_with(recomputed_)) {
    for (const std::vector<T>* v :
         {&a->ln1, &a->ln1_stat, &a->qkv, &a->lse, &a->att, &a->res1, &a->ln2, &a->ln2_stat, &a->fc, &a->gelu}) {
      add(*v);
    }
  }
  for (const std::vector<T>* v :
       {&lnf_, &lnf_stat_, &logits_, &position_loss_, &dresidual_, &dwide_, &dnarrow_, &dqkv_}) {
    add(*v);
  }
  return elems * sizeof(T) + (round_x_.capacity() + round_dy_.capacity()) * sizeof(bf16_t) +
         (tokens_.capacity() + targets_.capacity()) * sizeof(std::int32_t);
}

template <typename T>
std::size_t GptModel<T>::planned_activation_bytes(int micro_batch, int eval_batch, int len, bool bf16_products,
                                                  Recompute recompute, bool offload) const {
  const Index d = idx(config_.hidden);
  const Index f = idx(config_.mlp_hidden());
  const Index vocab = idx(config_.vocab_size);
  const Index heads = idx(config_.heads);
  const Index n = idx(len);
  const Index rows = idx(micro_batch) * n;
  const Index eval_rows = idx(eval_batch) * n;
  const Index layers = idx(config_.layers);
  detail::check_activation_bound(std::max(rows, eval_rows), layers, std::max({d, f, vocab, heads}));
  // Each buffer holds the larger of its train and held-out sizes where both passes use it.
  const auto both = [&](Index per_row) { return std::max(rows, eval_rows) * per_row; };
  const auto block = [&](Index r, Index batch) {  // one BlockActs
    // ln1, att, res1, ln2; the two stats; qkv; lse; fc and gelu.
    return r * d * 4 + 2 * r * 2 + r * 3 * d + batch * heads * n + r * f * 2;
  };
  // Selective recomputation keeps ln1, ln2 and gelu in recomputed_ only, one block's worth.
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
  const Index kept_blocks = recompute == Recompute::full ? 1 : layers;
  for (Index b = 0; b < kept_blocks; ++b) {
    if (b > 0) {
      elems += block(rows, idx(micro_batch)) - dropped(rows);
      continue;
    }
    // blocks_[0] serves both passes: each of its buffers at the larger size (an eval pass keeps everything).
    const Index r = std::max(rows, eval_rows);
    elems += block(r, std::max(idx(micro_batch), idx(eval_batch))) - dropped(r) + dropped(eval_rows);
  }
  elems += dropped(rows);                                  // recomputed_
  elems += both(d) + both(2) + both(vocab) + both(1);      // lnf_, lnf_stat_, logits_, losses
  elems += rows * d + rows * f + rows * d + rows * 3 * d;  // backward scratch
  std::size_t bytes = elems * sizeof(T) + 2 * std::max(rows, eval_rows) * sizeof(std::int32_t);  // tokens, targets
  if (bf16_products) {
    // round_x_: a layer's input (at most the MLP's inner width); round_dy_: a layer's output gradient.
    bytes += (both(std::max(d, f)) + rows * std::max({3 * d, f, vocab})) * sizeof(bf16_t);
  }
  return bytes;
}

template <typename T>
std::size_t GptModel<T>::planned_offloaded_bytes(int micro_batch, int len) const {
  // The inputs a later block overwrites (overwritten()), each [rows, hidden].
  const Index layers = idx(config_.layers);
  return (layers >= 3 ? layers - 2 : 0) * idx(micro_batch) * idx(len) * idx(config_.hidden) * sizeof(T);
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace zero3::models

namespace zero3::models {

std::string describe(const GptConfig& config) {
  return fmt::format("GPT {} layers, hidden {}, {} heads, vocab {}, context {}", config.layers, config.hidden,
                     config.heads, config.vocab_size, config.seq_len);
}

std::unique_ptr<UnitModel> make_host_gpt(const GptConfig& config) {
  validate(config);
  return std::make_unique<detail::HostAdapter<GptModel<float>>>(GptModel<float>(config), gpt_units(config),
                                                                describe(config));
}

}  // namespace zero3::models
