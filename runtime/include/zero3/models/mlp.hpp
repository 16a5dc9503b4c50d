// A next-token MLP computed on the host, for quick `zero3 train` runs: it reads the last `context` tokens
// of each window, concatenates their embeddings and predicts the window's last target through GELU layers.
// mlp_units() declares the engine units (embed, layers.{i}, head); an MlpModel runs forward and backward one
// unit at a time from the full params the engine gathered, with the same calling contract as GptModel, so
// one adapter drives both. The model owns only activations and scratch, never params or grads. One thread
// drives an MlpModel; its matrix products run on OpenBLAS's own threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zero3/models/kept_inputs.hpp"
#include "zero3/models/unit_model.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::models {

struct MlpConfig {
  int vocab_size = 0;  // token ids are in [0, vocab_size)
  int context = 0;     // tokens the MLP sees: the last `context` tokens of each window (zero3.model.seq_len)
  int layers = 0;      // hidden layers, >= 1
  int hidden = 0;      // embedding width and the width of every hidden layer

  int input_width() const { return context * hidden; }  // the first layer's input: context embeddings
};

// Throws ConfigError naming the field by its JSON key ("zero3.model.hidden_size"; context is
// "zero3.model.seq_len") for a config no MLP can be built from: a non-positive size.
void validate(const MlpConfig& config);

// The units in forward order; within a unit, the params in the order MlpModel takes them. Weights are
// row-major [out, in] (y = x W^T + b), as in PyTorch's nn.Linear.
//   "embed":     wte.weight [vocab, hidden] normal(0.02)
//   "layers.i":  layers.i.fc.weight [hidden, in] normal(1 / sqrt(in)), in = context * hidden for i == 0,
//                else hidden; layers.i.fc.bias [hidden] zeros
//   "head":      head.weight [vocab, hidden] normal(0.02), head.bias [vocab] zeros
// The hidden layers' fan-in scaling keeps the pre-activations at the embeddings' scale at every depth, so
// deep stacks neither vanish nor blow up at init; the small head makes the first prediction near uniform.
// Biases take no weight decay.
std::vector<UnitSpec> mlp_units(const MlpConfig& config);
// Elements of all params of the model.
std::size_t mlp_num_params(const MlpConfig& config);

// Forward and backward of the MLP on one micro-batch of `batch` windows of `len` tokens, unit by unit: one
// prediction per window, of targets[b, len - 1] from tokens[b, len - context .. len). Training:
// set_batch(.., Pass::train); forward_unit(u, params) for u = 0 .. num_units()-1; loss(); backward_unit(u,
// ...) for u = num_units()-1 .. 0. Evaluation: set_batch(.., Pass::eval); forward_unit for every unit;
// loss(). An eval pass keeps only the current layer's output (two hidden buffers used in turn) and throws on
// backward_unit. `params[k]` points at the full k-th param of unit u, in mlp_units() order. Out-of-order
// calls and wrong counts throw UsageError naming the unit.
template <typename T>
class MlpModel {
 public:
  using Pass = models::Pass;

  explicit MlpModel(const MlpConfig& config);

  const MlpConfig& config() const { return config_; }
  std::size_t num_units() const { return static_cast<std::size_t>(config_.layers) + 2; }

  // Copies what the MLP reads of the batch: tokens and targets are [batch, len] row-major, each id in
  // [0, vocab_size); len >= context. batch == 0 is allowed for an eval pass (loss 0). Every id is checked,
  // also those the MLP does not read. Throws UsageError naming the first bad id or size.
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass = Pass::train);
  void forward_unit(std::size_t unit, std::span<const T* const> params);
  // Mean cross-entropy over the batch's `batch` predictions, in nats (valid after the head's forward).
  T loss() const { return loss_; }
  // The head's logits [batch, vocab] (valid after the head's forward until its backward, which overwrites
  // them with their gradient) and each window's cross-entropy [batch].
  std::span<const T> logits() const { return logits_; }
  std::span<const T> position_losses() const { return position_loss_; }
  // Backward of `unit` (reverse order, after every forward of a train pass). The head seeds the chain with
  // dL/dlogits times `seed_scale` (the engine's loss multiplier: loss scale / accumulation steps).
  // Accumulates (+=) each param's gradient into grads[k] (full size, all non-null; zero-filled by the
  // caller for a plain gradient).
  void backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads, T seed_scale);

  // Bytes of the activations and scratch this model holds now (allocated capacity), for the memory
  // tracker's activations category.
  std::size_t activation_bytes() const;
  // What activation_bytes() reports after train passes of `micro_batch` windows and held-out passes of
  // `eval_batch` (0: none).
  // `offload`: with cpu_checkpointing (Recompute::full), whose host store planned_offloaded_bytes() counts.
  std::size_t planned_activation_bytes(int micro_batch, int eval_batch, Recompute recompute = Recompute::none,
                                       bool offload = false) const;
  std::size_t planned_offloaded_bytes(int micro_batch) const;

  // Activation checkpointing, as GptModel::set_recompute: Recompute::full keeps each layer's output (the next
  // layer's input) and recomputes its pre-activation product in backward, in one layer's buffer;
  // Recompute::selective keeps everything, as none does (a layer's only intermediate is a product's output).
  void set_recompute(Recompute mode);
  Recompute recompute() const { return recompute_; }
  // cpu_checkpointing (UnitModel::set_offload_kept_inputs), with Recompute::full only: a train pass moves the
  // layers' inputs that a later layer overwrites to a host store after the layer's forward and back for its
  // backward (kept_inputs.hpp).
  void set_offload_kept_inputs(bool on);
  bool offload_kept_inputs() const { return kept_.enabled(); }
  KeptInputs<T>& kept_inputs() { return kept_; }

 private:
  void check_call(const char* what, std::size_t unit, std::size_t params, const T* const* ptrs) const;
  const T* layer_input(std::size_t layer) const;
  T* layer_output(std::size_t layer);
  std::size_t post_slot(std::size_t layer) const;  // where layer `layer`'s output lives in this pass
  // Offloaded, layer l's input (layer l - 1's output) is overwritten by layer l + 1's output unless that is the
  // last layer's; the first layer's input is the embeddings' own buffer. Only overwritten inputs go to the host
  // store.
  bool overwritten(std::size_t layer) const {
    return layer >= 1 && layer + 3 <= static_cast<std::size_t>(config_.layers);
  }
  std::vector<T>& input_buffer(std::size_t layer) { return layer == 0 ? embed_ : post_[post_slot(layer - 1)]; }

  MlpConfig config_;
  Pass pass_ = Pass::train;
  int batch_ = 0;
  bool has_batch_ = false;
  std::vector<std::int32_t> inputs_;   // [batch, context]: the tokens the MLP reads
  std::vector<std::int32_t> targets_;  // [batch]: each window's last target
  std::size_t next_forward_ = 0;       // the unit forward_unit expects next
  std::size_t next_backward_ = 0;      // one past the unit backward_unit expects next; 0: none

  std::vector<T> embed_;              // [batch, context * hidden] the first layer's input
  std::vector<std::vector<T>> pre_;   // train: [layer][batch, hidden] before GELU; eval: one, reused
  std::vector<std::vector<T>> post_;  // train: [layer][batch, hidden] after GELU; eval: two, in turn
  std::vector<T> logits_;             // [batch, vocab]
  std::vector<T> position_loss_;      // [batch]
  T loss_ = 0;

  // Backward scratch: dL/d(current layer's output) and dL/d(its pre-activation); dL/d(embed_).
  std::vector<T> dpost_;
  std::vector<T> dpre_;
  std::vector<T> dembed_;
  Recompute recompute_ = Recompute::none;
  KeptInputs<T> kept_;  // cpu_checkpointing: slot l holds layer l's input between its forward and backward
};

extern template class MlpModel<float>;
extern template class MlpModel<double>;

// MlpModel<float> behind UnitModel, for the engine's host device (see make_host_gpt).
std::unique_ptr<UnitModel> make_host_mlp(const MlpConfig& config);
// "MLP 2 hidden layers of 64, context 2, vocab 16"
std::string describe(const MlpConfig& config);

}  // namespace zero3::models
