// A GPT (pre-LayerNorm decoder-only transformer) computed on the host, for `zero3 train`.
// gpt_units() declares the engine units (embed, blocks.{i}, head) with their named params; a GptModel runs
// forward and backward one unit at a time from the full params the engine gathered, keeping the
// activations backward needs between the calls. The model owns only activations and scratch, never params
// or grads. One thread drives a GptModel; its work runs on the host models' thread pool (set_blas_threads),
// split so that the result does not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/models/kept_inputs.hpp"
#include "zero3/models/unit_model.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::models {

struct GptConfig {
  int vocab_size = 0;  // token ids are in [0, vocab_size)
  int seq_len = 0;     // context length: the longest sequence a batch may hold (rows of wpe)
  int layers = 0;      // transformer blocks
  int hidden = 0;      // d_model, the width of the residual stream
  int heads = 0;       // attention heads; hidden must be a multiple
  int mlp_ratio = 4;   // the MLP's inner width is mlp_ratio * hidden

  int head_dim() const { return hidden / heads; }
  int mlp_hidden() const { return mlp_ratio * hidden; }
};

// Throws ConfigError naming the field ("zero3.model.hidden") for a config no GPT can be built from:
// a non-positive size, or hidden not a multiple of heads.
void validate(const GptConfig& config);

// The units in forward order; within a unit, the params in the order GptModel takes them. All weights
// are row-major [out, in] (y = x W^T + b), as in PyTorch's nn.Linear.
//   "embed":     wte.weight [vocab, hidden] normal(0.02), wpe.weight [seq_len, hidden] normal(0.01)
//   "blocks.i":  blocks.i.ln1.weight [hidden] ones, blocks.i.ln1.bias [hidden] zeros,
//                blocks.i.attn.qkv.weight [3 hidden, hidden] normal(0.02) (rows: q, then k, then v; head h
//                owns rows h*head_dim .. of each), blocks.i.attn.qkv.bias [3 hidden] zeros,
//                blocks.i.attn.proj.weight [hidden, hidden] normal(0.02 / sqrt(2 layers)), .attn.proj.bias,
//                blocks.i.ln2.weight, .ln2.bias, blocks.i.mlp.fc.weight [4 hidden, hidden] normal(0.02),
//                .mlp.fc.bias [4 hidden], blocks.i.mlp.proj.weight [hidden, 4 hidden]
//                normal(0.02 / sqrt(2 layers)), .mlp.proj.bias [hidden]
//   "head":      ln_f.weight [hidden] ones, ln_f.bias [hidden] zeros, lm_head.weight [vocab, hidden]
//                normal(0.02); untied from wte so that no param belongs to two units.
// Biases and LayerNorm params take no weight decay.
std::vector<UnitSpec> gpt_units(const GptConfig& config);
// Elements of all params of the model.
std::size_t gpt_num_params(const GptConfig& config);

// The threads of the host models' compute, process-wide: one oneTBB arena of that many threads runs every
// matrix product (OpenBLAS and oneDNN single-threaded inside its blocks) and every element-wise, per-row
// and attention loop. The trainer sets it to its rank's share of the cores; by default it is the core
// count. Not while a model computes. Throws UsageError for threads < 1.
void set_blas_threads(int threads);
int blas_threads();
// bf16 matrix products are available on this host (oneDNN built in, AVX512-BF16 or AMX-BF16 on the CPU):
// GptModel<float> takes bf16 matrix weights (forward_unit's params16). ZERO3_HOST_BF16_GEMM=0 turns it off.
bool host_bf16_products();

// Forward and backward of the GPT on one micro-batch of `batch` sequences of `len` tokens, unit by unit.
// Training: set_batch(.., Pass::train); forward_unit(u, params) for u = 0 .. num_units()-1; loss();
// backward_unit(u, ...) for u = num_units()-1 .. 0. Evaluation (held-out loss): set_batch(.., Pass::eval);
// forward_unit for every unit; loss(). An eval pass keeps only the residual stream of the current unit
// and reuses one block's buffers, so it needs far less memory; backward_unit after it throws.
// `params[k]` points at the full k-th param of unit u, in gpt_units() order. Out-of-order calls and
// wrong counts throw UsageError naming the unit.
// bf16 compute (float model, host_bf16_products()): params16, when not empty, holds one pointer per param;
// a non-null params16[k] (allowed only where bf16_operand(u, k)) is that weight in bf16, and its layer
// multiplies in bf16 (the layer's input and output gradient rounded to bf16, fp32 accumulation, as torch
// autocast does); params[k] may then be null. LayerNorm, softmax, GELU and the loss stay fp32. Backward
// takes the same params16 as the unit's forward.
template <typename T>
class GptModel {
 public:
  using Pass = models::Pass;

  explicit GptModel(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  std::size_t num_units() const { return static_cast<std::size_t>(config_.layers) + 2; }

  // Copies the batch: tokens and targets are [batch, len] row-major, each id in [0, vocab_size);
  // 1 <= len <= seq_len. Throws UsageError naming the first bad id or size.
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass = Pass::train);
  void forward_unit(std::size_t unit, std::span<const T* const> params, std::span<const bf16_t* const> params16 = {});
  // Param k of `unit` is a matrix weight whose products may run in bf16 (qkv, attn.proj, mlp.fc,
  // mlp.proj, lm_head).
  bool bf16_operand(std::size_t unit, std::size_t k) const;
  // Mean cross-entropy over the batch's batch * len positions, in nats (valid after the head's forward).
  T loss() const { return loss_; }
  // The head's logits [batch, len, vocab] (valid after the head's forward until its backward, which
  // overwrites them with their gradient) and each position's cross-entropy [batch, len].
  std::span<const T> logits() const { return logits_; }
  std::span<const T> position_losses() const { return position_loss_; }
  // Backward of `unit` (reverse order, after every forward of a train pass). The head seeds the chain with
  // dL/dlogits times `seed_scale` (the engine's loss multiplier: loss scale / accumulation steps).
  // Accumulates (+=) each param's gradient into grads[k] (full size, all non-null; zero-filled by the
  // caller for a plain gradient).
  void backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads, T seed_scale,
                     std::span<const bf16_t* const> params16 = {});

  // Activation checkpointing for the next train passes (set between passes): Recompute::full keeps only each
  // block's input (the residual stream) and runs the block's forward again inside its backward, in one block's
  // buffers; Recompute::selective keeps the products' and attention's outputs and recomputes the two
  // LayerNorms and GELU. The recomputation repeats the forward's calls, so the gradients are bitwise those of
  // Recompute::none.
  void set_recompute(Recompute mode);
  Recompute recompute() const { return recompute_; }
  // cpu_checkpointing (UnitModel::set_offload_kept_inputs), with Recompute::full only: a train pass moves the
  // blocks' inputs that a later block overwrites to a host store after the block's forward and back for its
  // backward (kept_inputs.hpp).
  void set_offload_kept_inputs(bool on);
  bool offload_kept_inputs() const { return kept_.enabled(); }
  KeptInputs<T>& kept_inputs() { return kept_; }

  // Bytes of the activations and scratch this model holds now (allocated capacity): what a train pass
  // keeps from forward to backward dominates; for the memory tracker's activations category.
  std::size_t activation_bytes() const;
  // What activation_bytes() reports after train passes of `micro_batch` sequences and held-out passes of
  // `eval_batch` (0: none) of `len` tokens; `bf16_products`: the linear layers take bf16 operands.
  // `offload`: with cpu_checkpointing (Recompute::full), whose host store planned_offloaded_bytes() counts.
  std::size_t planned_activation_bytes(int micro_batch, int eval_batch, int len, bool bf16_products,
                                       Recompute recompute = Recompute::none, bool offload = false) const;
  std::size_t planned_offloaded_bytes(int micro_batch, int len) const;

 private:
  // What one block keeps from forward for its backward; rows = batch * len.
  struct BlockActs {
    std::vector<T> ln1;       // [rows, hidden] LN1 output
    std::vector<T> ln1_stat;  // [rows, 2] mean, 1/std
    std::vector<T> qkv;       // [rows, 3 hidden]
    std::vector<T> lse;       // [batch, heads, len] attention rows' log-sum-exp (flash_attention.hpp)
    std::vector<T> att;       // [rows, hidden] heads' outputs, concatenated, before the projection
    std::vector<T> res1;      // [rows, hidden] residual stream after attention
    std::vector<T> ln2;       // [rows, hidden]
    std::vector<T> ln2_stat;  // [rows, 2]
    std::vector<T> fc;        // [rows, 4 hidden] before GELU
    std::vector<T> gelu;      // [rows, 4 hidden]
  };

  void check_unit_params(const char* what, std::size_t unit, std::size_t count) const;
  // Checks params16 against params and keeps the unit's bf16 weights in w16_.
  void take_params16(const char* what, std::size_t unit, std::span<const T* const> params,
                     std::span<const bf16_t* const> params16);
  // The linear layer of weight param k (bf16 products when w16_[k] is set).
  // The current layer's attention multiplies in bf16: its projections do (w16_ set).
  bool attention_in_bf16() const;
  void linear_fwd(std::span<const T* const> p, std::size_t k, const T* bias, const T* x, T* y, std::size_t rows,
                  std::size_t in, std::size_t out);
  void linear_bwd(std::span<const T* const> p, std::size_t k, const T* x, const T* dy, T* dx, T* dw, T* dbias,
                  std::size_t rows, std::size_t in, std::size_t out);
  void forward_embed(std::span<const T* const> params, T* out);
  // The block's forward into `acts`, except what `recomputed` takes (ln1, ln2 and gelu; the same object when
  // everything is kept); out == nullptr stops after the MLP's activation (what a backward recomputes).
  void forward_block(BlockActs& acts, BlockActs& recomputed, std::span<const T* const> params, const T* in, T* out);
  // Every block's buffers and `extra`, for counting.
  std::vector<const BlockActs*> blocks_with(const BlockActs& extra) const;
  // Where block `unit`'s forward keeps what it keeps, and where what it recomputes goes.
  BlockActs& kept_acts(std::size_t unit) { return recompute_ == Recompute::full ? blocks_[0] : blocks_[unit - 1]; }
  BlockActs& recomputed_acts(std::size_t unit) {
    return recompute_ == Recompute::selective ? recomputed_ : kept_acts(unit);
  }
  void forward_head(std::span<const T* const> params, const T* in);
  void backward_embed(std::span<T* const> grads);
  void backward_block(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads);
  void backward_head(std::span<const T* const> params, std::span<T* const> grads, T seed_scale);

  GptConfig config_;
  Pass pass_ = Pass::train;
  int batch_ = 0;
  int len_ = 0;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int32_t> targets_;
  std::size_t next_forward_ = 0;   // the unit forward_unit expects next
  std::size_t next_backward_ = 0;  // one past the unit backward_unit expects next; 0: none

  // Train: residual_[u] is the input of unit u (residual_[num_units-1] feeds the head). Eval: only
  // residual_[0] and residual_[1] are used, in turn.
  // The residual stream: unit u's output (u = layers: the head's input), in a train pass's layout.
  std::vector<T>& residual(std::size_t u);
  // Offloaded, input k (unit k's output) is overwritten by block k + 2's output unless that is the last block's:
  // only those inputs go to the host store; the last two blocks' are still in place for their backward.
  bool overwritten(std::size_t k) const { return k + 3 <= static_cast<std::size_t>(config_.layers); }
  std::vector<std::vector<T>> residual_;
  std::vector<BlockActs> blocks_;  // train: one per block (Recompute::full: one, reused); eval: one, reused
  BlockActs recomputed_;           // Recompute::selective: ln1, ln2 and gelu of the block in hand
  Recompute recompute_ = Recompute::none;
  KeptInputs<T> kept_;            // cpu_checkpointing: residual_[u - 1] of block u between its forward and backward
  std::vector<T> lnf_;            // [rows, hidden] final LayerNorm output
  std::vector<T> lnf_stat_;       // [rows, 2]
  std::vector<T> logits_;         // [rows, vocab]
  std::vector<T> position_loss_;  // [rows]
  T loss_ = 0;

  // Backward scratch: the gradient flowing into the residual stream, and per-block temporaries.
  std::vector<T> dresidual_;
  std::vector<T> dwide_;    // [rows, 4 hidden]
  std::vector<T> dnarrow_;  // [rows, hidden]
  std::vector<T> dqkv_;     // [rows, 3 hidden]

  std::vector<const bf16_t*> w16_;  // the current unit's bf16 weights (null: fp32 products)
  std::vector<bf16_t> round_x_;     // a bf16 layer's input, rounded
  std::vector<bf16_t> round_dy_;    // a bf16 layer's output gradient, rounded
};

extern template class GptModel<float>;
extern template class GptModel<double>;

// GptModel<float> behind UnitModel, for the engine's host device: params and grads in host memory, in
// f32, bf16 or f16. bf16 matrix weights go to bf16 products where host_bf16_products(); every other
// 16-bit param is widened to float before each unit; gradients are computed in fp32 and rounded back.
std::unique_ptr<UnitModel> make_host_gpt(const GptConfig& config);
// "GPT 2 layers, hidden 64, 4 heads, vocab 16, context 32"
std::string describe(const GptConfig& config);

}  // namespace zero3::models
