// The host-computed test model family shared by `zero3 bench engine` and the engine's equivalence tests:
// an MLP (MSE loss) and a small pre-LayerNorm transformer (single-head causal attention, GELU MLP,
// cross-entropy per position), with forward and backward written by hand for float and double.
// One engine unit per layer or block plus a head unit; params are named ("blocks.0.ln1.weight") and
// initialized through ParamInit. Data are synthetic and deterministic in (seed, step, global sample id),
// so a global batch is the same whatever the world size. No engine code is called here: a Network only
// reads param pointers and writes gradients, so the same code runs sharded, plain, or as the float64
// reference. Plain values; a Network is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zero3/engine/engine.hpp"

namespace zero3::model {

enum class Arch : std::uint8_t { mlp, transformer };
enum class Activation : std::uint8_t { tanh, gelu };

struct ModelConfig {
  Arch arch = Arch::transformer;
  int d_in = 8;                              // input features per position
  int d_model = 16;                          // hidden width (MLP hidden layers; transformer residual stream)
  int d_ff = 32;                             // transformer MLP width
  int layers = 2;                            // MLP hidden layers / transformer blocks
  int seq_len = 4;                           // positions per sample; an MLP has 1
  int d_out = 5;                             // MLP: regression outputs; transformer: classes per position
  Activation activation = Activation::gelu;  // MLP hidden layers (the transformer MLP is always GELU)

  int positions() const { return arch == Arch::mlp ? 1 : seq_len; }
};

// Throws zero3::UsageError for a config the model cannot build (non-positive sizes).
void validate(const ModelConfig& config);

// The units in forward order with their params (declaration order is the order Network expects them).
// Weights: normal(0, 0.02); biases zeros; LayerNorm weights ones. Biases and LayerNorm params take no
// weight decay. The attention's qkv projection has no bias: the key part of one would get a gradient
// that is exactly zero (softmax ignores a shift shared by all scores), and Adam or Lion would turn the
// rounding noise there into full-size updates, so fp32 and float64 runs could not be compared.
std::vector<UnitSpec> model_units(const ModelConfig& config);
// The initial values of `param` as the engine makes them (docs/engine.md, "Init and the cross-rank check"):
// CounterRng(seed, hash_name(name)) at each element index, computed in double and stored as float. For trainers that
// run without the engine.
void init_param(const ParamSpec& param, std::uint64_t seed, std::span<float> out);
// Total elements of all params of `units`.
std::size_t total_elems(const std::vector<UnitSpec>& units);
std::size_t numel(const ParamSpec& param);

// One micro-batch: `samples` samples of positions() rows each.
template <typename T>
struct Batch {
  int samples = 0;
  std::vector<T> x;        // [samples, positions, d_in]
  std::vector<T> target;   // MLP: [samples, positions, d_out]
  std::vector<int> label;  // transformer: [samples, positions], each in [0, d_out)
};

// Sample `id` of optimizer step `step`: inputs are normal(0, 1) from CounterRng(seed, key(step)) at the
// sample's element indices; targets come from a fixed random "teacher" projection of the inputs
// (MLP: tanh(teacher x); transformer: argmax of teacher x), so the loss can go down.
template <typename T>
Batch<T> make_batch(const ModelConfig& config, std::uint64_t seed, std::int64_t step,
                    std::span<const std::int64_t> sample_ids);

// The global sample ids of rank `rank`'s micro-step `micro` (micro_batch samples): rank-strided over the
// global batch, id = rank + world * (micro * micro_batch + j). For every world size, gradient
// accumulation and micro-batch size with the same global batch, the union is ids 0 .. global - 1.
std::vector<std::int64_t> micro_batch_ids(int rank, int world, int micro, int micro_batch);
// Ids 0 .. count - 1: the whole global batch, as the unsharded reference trains on it.
std::vector<std::int64_t> all_ids(std::int64_t count);

// Forward and backward of the model on one micro-batch, unit by unit, keeping what backward needs.
// Usage: set_batch; forward(u, params) for u = 0 .. num_units()-1; loss(); backward(u, ...) for
// u = num_units()-1 .. 0. `params[k]` points at the full k-th param of unit u (model_units order).
template <typename T>
class Network {
 public:
  explicit Network(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  std::size_t num_units() const { return kinds_.size(); }

  void set_batch(const Batch<T>& batch);
  void forward(std::size_t unit, std::span<const T* const> params);
  // Mean loss over the micro-batch (valid after the last unit's forward).
  T loss() const { return loss_; }
  // Backward of `unit` (units in reverse order, after forward of all). The head unit seeds the chain with
  // d(loss)/d(loss) = `seed` (the loss multiplier: loss scale / accumulation steps, or 1). Writes (not
  // accumulates) the gradient of each of the unit's params into grads[k] (all non-null, full size).
  void backward(std::size_t unit, std::span<const T* const> params, std::span<T* const> grads, T seed);

 private:
  enum class Kind : std::uint8_t { input, hidden, block, head_mse, head_ce };
  struct Cache {
    std::vector<T> a;     // LN1 output (block), LN_f output (head_ce), pre-activation (hidden)
    std::vector<T> stat;  // LN mean, rstd pairs
    std::vector<T> qkv;   // [rows, 3D]
    std::vector<T> prob;  // [samples, S, S] attention probabilities
    std::vector<T> att;   // [rows, D] attention output before the projection
    std::vector<T> h1;    // [rows, D] residual after attention
    std::vector<T> b;     // [rows, D] LN2 output
    std::vector<T> stat2;
    std::vector<T> f_pre;  // [rows, F]
    std::vector<T> f_act;  // [rows, F]
  };

  int in_width(std::size_t unit) const;
  int out_width(std::size_t unit) const;

  ModelConfig config_;
  std::vector<Kind> kinds_;
  Batch<T> batch_;
  int rows_ = 0;
  std::vector<std::vector<T>> act_;  // act_[u]: input of unit u; act_[num_units]: the head's output
  std::vector<Cache> cache_;
  std::vector<T> dact_;  // gradient w.r.t. the output of the unit whose backward runs next
  std::vector<T> dtmp_, dtmp2_, dtmp3_;
  std::vector<T> scratch_;
  std::vector<T> zeros_;
  T loss_ = 0;
};

extern template class Network<float>;
extern template class Network<double>;

}  // namespace zero3::model
