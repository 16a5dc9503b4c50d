// A Llama-family decoder (Llama 2/3, TinyLlama, Mistral without sliding windows, Qwen2) computed on the
// host, for `zero3 train`: RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention, no
// biases (or q/k/v biases as Qwen2 has, or every attention projection's as Llama's attention_bias), one
// engine unit per decoder layer. Params carry Hugging Face's names (model.layers.3.self_attn.q_proj.weight),
// so a safetensors checkpoint maps onto the units by name. Same calling contract as GptModel (gpt.hpp):
// set_batch, forward_unit in order, loss, backward_unit in reverse; the model owns activations only.
//
//   zero3::models::LlamaConfig c{.vocab_size = 256, .seq_len = 128, .layers = 4, .hidden = 128,
//                                .heads = 4, .kv_heads = 2, .intermediate = 352};
//   auto model = zero3::models::make_host_llama(c);   // a UnitModel for the engine's host device
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

struct LlamaConfig {
  int vocab_size = 0;
  int seq_len = 0;  // context length of the training windows (the rotary table's positions)
  int layers = 0;
  int hidden = 0;        // hidden_size
  int heads = 0;         // num_attention_heads
  int kv_heads = 0;      // num_key_value_heads; 0: heads. Must divide heads.
  int head_dim = 0;      // 0: hidden / heads
  int intermediate = 0;  // intermediate_size of the SwiGLU MLP
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool qkv_bias = false;             // q, k and v projections carry biases (Qwen2; Llama's attention_bias)
  bool o_bias = false;               // o_proj carries a bias (Llama's attention_bias)
  bool tie_word_embeddings = false;  // the output layer is the input embedding (one param, two uses)

  int kv() const { return kv_heads == 0 ? heads : kv_heads; }
  int dim() const { return head_dim == 0 ? hidden / heads : head_dim; }
};

// ConfigError naming the field (zero3.model.<name>) for a config no model can be built from: a
// non-positive size, heads not a multiple of kv_heads, an odd head_dim, hidden not a multiple of heads
// without head_dim.
void validate(const LlamaConfig& config);

// Units in forward order, params in the order LlamaModel takes them; weights [out, in] as nn.Linear:
//   "embed":     model.embed_tokens.weight [vocab, hidden]
//   "layers.i":  model.layers.i.input_layernorm.weight [hidden], .self_attn.q_proj.weight [heads dim, hidden],
//                .self_attn.k_proj.weight and .v_proj.weight [kv_heads dim, hidden], .self_attn.o_proj.weight
//                [hidden, heads dim], .post_attention_layernorm.weight [hidden], .mlp.gate_proj.weight and
//                .mlp.up_proj.weight [intermediate, hidden], .mlp.down_proj.weight [hidden, intermediate];
//                then, when configured, q_proj.bias, k_proj.bias, v_proj.bias (qkv_bias) and o_proj.bias.
//   "head":      model.norm.weight [hidden], lm_head.weight [vocab, hidden]; with tie_word_embeddings only
//                model.norm.weight, and the unit borrows "embed" (UnitSpec::borrows): the model takes the
//                embedding as the head's second param and writes the output layer's gradient into the
//                embedding's second gradient buffer, which the engine adds to the embedding's own.
// Matrices and the embedding start normal(0, 0.02) as transformers initializes them, norms at one, biases at
// zero; norms and biases take no weight decay.
std::vector<UnitSpec> llama_units(const LlamaConfig& config);
std::size_t llama_num_params(const LlamaConfig& config);

template <typename T>
class LlamaModel {
 public:
  using Pass = models::Pass;

  explicit LlamaModel(const LlamaConfig& config);

  const LlamaConfig& config() const { return config_; }
  std::size_t num_units() const { return static_cast<std::size_t>(config_.layers) + 2; }

  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass = Pass::train);
  void forward_unit(std::size_t unit, std::span<const T* const> params, std::span<const bf16_t* const> params16 = {});
  // Param k of `unit` is a projection matrix whose products may run in bf16.
  bool bf16_operand(std::size_t unit, std::size_t k) const;
  T loss() const { return loss_; }
  std::span<const T> logits() const { return logits_; }
  std::span<const T> position_losses() const { return position_loss_; }
  void backward_unit(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads, T seed_scale,
                     std::span<const bf16_t* const> params16 = {});

  // Activation checkpointing, as GptModel::set_recompute: Recompute::full keeps each layer's input and runs the
  // layer's forward again in its backward; Recompute::selective keeps the products' and attention's outputs
  // (q, k, v rotated and packed, att, res1, gate, up) and recomputes the two RMSNorms and SwiGLU. Bitwise the
  // gradients of Recompute::none.
  void set_recompute(Recompute mode);
  Recompute recompute() const { return recompute_; }
  // cpu_checkpointing (UnitModel::set_offload_kept_inputs), with Recompute::full only: a train pass moves the
  // layers' inputs that a later layer overwrites to a host store after the layer's forward and back for its
  // backward (kept_inputs.hpp).
  void set_offload_kept_inputs(bool on);
  bool offload_kept_inputs() const { return kept_.enabled(); }
  KeptInputs<T>& kept_inputs() { return kept_; }

  std::size_t activation_bytes() const;
  // `offload`: with cpu_checkpointing (Recompute::full), whose host store planned_offloaded_bytes() counts.
  std::size_t planned_activation_bytes(int micro_batch, int eval_batch, int len, bool bf16_products,
                                       Recompute recompute = Recompute::none, bool offload = false) const;
  std::size_t planned_offloaded_bytes(int micro_batch, int len) const;

 private:
  struct LayerActs {
    std::vector<T> norm1;   // [rows, hidden] input_layernorm output
    std::vector<T> inv1;    // [rows] its 1/rms
    std::vector<T> qkv;     // [rows, 3 heads dim] rotated q, k, v per query head
    std::vector<T> lse;     // [batch, heads, len] attention rows' log-sum-exp
    std::vector<T> att;     // [rows, heads dim]
    std::vector<T> res1;    // [rows, hidden] residual stream after attention
    std::vector<T> norm2;   // [rows, hidden]
    std::vector<T> inv2;    // [rows]
    std::vector<T> gate;    // [rows, intermediate] before SiLU
    std::vector<T> up;      // [rows, intermediate]
    std::vector<T> swiglu;  // [rows, intermediate] silu(gate) * up
  };

  std::size_t unit_params(std::size_t unit) const;
  void check_unit_params(const char* what, std::size_t unit, std::size_t count) const;
  void take_params16(const char* what, std::size_t unit, std::span<const T* const> params,
                     std::span<const bf16_t* const> params16);
  // The current layer's attention multiplies in bf16: its projections do (w16_ set).
  bool attention_in_bf16() const;
  void linear_fwd(std::span<const T* const> p, std::size_t k, const T* bias, const T* x, T* y, std::size_t rows,
                  std::size_t in, std::size_t out);
  void linear_bwd(std::span<const T* const> p, std::size_t k, const T* x, const T* dy, T* dx, bool accumulate_dx, T* dw,
                  T* dbias, std::size_t rows, std::size_t in, std::size_t out);
  const T* param_or_null(std::span<const T* const> p, int k) const;
  T* grad_or_null(std::span<T* const> g, int k) const;
  // The layer's forward into `a`, except what `r` takes (norm1, norm2, swiglu; the same object when everything
  // is kept); out == nullptr stops after SwiGLU (what a backward recomputes).
  void forward_layer(LayerActs& a, LayerActs& r, std::span<const T* const> p, const T* in, T* out);
  LayerActs& kept_acts(std::size_t unit) { return recompute_ == Recompute::full ? layers_[0] : layers_[unit - 1]; }
  LayerActs& recomputed_acts(std::size_t unit) {
    return recompute_ == Recompute::selective ? recomputed_ : kept_acts(unit);
  }
  void forward_head(std::span<const T* const> p, const T* in);
  void backward_layer(std::size_t unit, std::span<const T* const> p, std::span<T* const> g);
  void backward_head(std::span<const T* const> p, std::span<T* const> g, T seed_scale);
  void backward_embed(std::span<T* const> g);

  LlamaConfig config_;
  int q_bias_ = -1;  // param positions of the optional biases in a layer unit, -1 when absent
  int k_bias_ = -1;
  int v_bias_ = -1;
  int o_bias_ = -1;
  Pass pass_ = Pass::train;
  int batch_ = 0;
  int len_ = 0;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int32_t> targets_;
  std::size_t next_forward_ = 0;
  std::size_t next_backward_ = 0;
  std::vector<T> rope_cos_;  // [len, dim / 2]
  std::vector<T> rope_sin_;

  // The residual stream: unit u's output (u = layers: the head's input), in a train pass's layout.
  std::vector<T>& residual(std::size_t u);
  // Offloaded, input k (unit k's output) is overwritten by layer k + 2's output unless that is the last layer's:
  // only those inputs go to the host store; the last two layers' are still in place for their backward.
  bool overwritten(std::size_t k) const { return k + 3 <= static_cast<std::size_t>(config_.layers); }
  std::vector<std::vector<T>> residual_;  // as GptModel: train keeps each unit's input, eval alternates two
  std::vector<LayerActs> layers_;
  LayerActs recomputed_;  // Recompute::selective: norm1, norm2 and swiglu of the layer in hand
  Recompute recompute_ = Recompute::none;
  KeptInputs<T> kept_;  // cpu_checkpointing: residual_[u - 1] of layer u between its forward and backward
  std::vector<T> normf_;
  std::vector<T> invf_;
  std::vector<T> logits_;
  std::vector<T> position_loss_;
  T loss_ = 0;

  std::vector<T> q_;  // [rows, heads dim] projections before rotation (forward), their gradients (backward)
  std::vector<T> k_;  // [rows, kv_heads dim]
  std::vector<T> v_;
  std::vector<T> dresidual_;
  std::vector<T> dnarrow_;  // [rows, max(hidden, heads dim)]
  std::vector<T> dgate_;    // [rows, intermediate]
  std::vector<T> dup_;
  std::vector<T> dqkv_;

  std::vector<const bf16_t*> w16_;
  std::vector<bf16_t> round_x_;
  std::vector<bf16_t> round_dy_;
};

extern template class LlamaModel<float>;
extern template class LlamaModel<double>;

// LlamaModel<float> behind UnitModel for the engine's host device (the same adapter as the GPT's).
std::unique_ptr<UnitModel> make_host_llama(const LlamaConfig& config);
// "Llama 4 layers, hidden 128, 4 heads (2 kv), intermediate 352, vocab 256, context 128"
std::string describe(const LlamaConfig& config);

}  // namespace zero3::models
