// The unsharded float64 reference the engine is tested against. It trains the test model (tests/model/
// model.hpp, Network<double>) on the whole global batch of each step in one process, with its own
// implementations of everything the engine does around the model, written from DeepSpeed's source (paths in
// the DeepSpeed repository) and not from the engine's code: parameter init (docs/engine.md, "Init and the
// cross-rank check": CounterRng per name, stored in fp32), Adam/AdamW, Lion and Adagrad (csrc/adam, csrc/lion,
// csrc/adagrad), the five LR schedules (deepspeed/runtime/lr_schedules.py), the dynamic loss scaler
// (deepspeed/runtime/fp16/loss_scaler.py) and gradient clipping (unscale_and_clip_grads in
// deepspeed/runtime/zero/stage3.py). Frozen params, weight_decay=false and lr_scale are honoured as ParamSpec
// describes them. With 16-bit optimizer storage (Config::master_dtype, optimizer_state_dtype) the master and
// the moments are rounded to their dtypes (through fp32, to nearest even) at init and after every update.
// Plain single-threaded values.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::test {

// The initial values of a param as the engine materializes them: the value computed in double from
// CounterRng(seed, hash_name(name)) at each element index (normal: mean + std * normal(i); uniform:
// a + (b - a) * uniform(i); constant: a), then stored in the fp32 master, so double(float(value)).
std::vector<double> reference_init(const ParamSpec& param, std::uint64_t seed);

// The lr (and, for OneCycle with cycle_momentum, the betas) a schedule gives at iteration t (t = -1: as
// constructed), from deepspeed/runtime/lr_schedules.py. No scheduler block: the optimizer's lr.
struct RefLr {
  double lr = 0.0;
  std::optional<std::array<double, 2>> betas;
};
RefLr reference_lr(const config::Config& config, std::int64_t t);

// DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), or a static scale; 1
// without fp16.
class RefLossScaler {
 public:
  explicit RefLossScaler(const config::Config& config);
  double scale() const { return scale_; }
  // Throws std::runtime_error when an overflow happens at the minimum scale (DeepSpeed aborts there).
  void update(bool overflow);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  std::int64_t window_ = 1000;
  std::int64_t hysteresis_ = 2;
  std::int64_t hyst_left_ = 2;
  bool consecutive_ = false;
  std::int64_t iter_ = 0;
  std::int64_t last_overflow_ = -1;
};

struct RefStep {
  bool applied = true;
  double loss = 0.0;       // mean over the global batch, before the update
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradient before clipping; +Inf on overflow
  double lr = 0.0;         // the scheduled lr applied (0 when skipped)
  double loss_scale = 1.0;
  double next_loss_scale = 1.0;
  double clip_coef = 1.0;  // the divisor clipping applied (1 = no clipping)
};

class ReferenceTrainer {
 public:
  // `units` as declared to the engine (names, shapes, init, trainable, weight_decay, lr_scale). Uses from
  // `config`: batch.train_batch_size, optimizer, scheduler, gradient_clipping, fp16/bf16 and zero3.seed.
  ReferenceTrainer(config::Config config, model::ModelConfig model, std::vector<UnitSpec> units,
                   std::uint64_t data_seed);

  // One optimizer step on global step `global_step()`'s batch (train_batch_size samples, ids 0..tb-1).
  // `overflow`: the gradients are taken to contain an Inf (as injected into the engine's run): the step
  // is skipped as fp16 ZeRO-3 would skip it.
  RefStep step(bool overflow = false);

  std::int64_t global_step() const { return global_step_; }
  std::int64_t skipped_steps() const { return skipped_; }
  double loss_scale() const { return scaler_.scale(); }
  const std::vector<std::string>& param_names() const { return names_; }
  const ParamSpec& spec(std::string_view name) const;
  const std::vector<double>& master(std::string_view name) const;
  // The param as the forward sees it: the master rounded to the model dtype (fp32, bf16 or fp16).
  std::vector<double> compute_param(std::string_view name) const;
  // Adam: m and v; Lion: m (state2 empty); Adagrad: the sum of squares in state2 (state1 empty).
  const std::vector<double>& state1(std::string_view name) const;
  const std::vector<double>& state2(std::string_view name) const;
  // The last step's gradient (unscaled, before clipping), for trainable params.
  const std::vector<double>& grad(std::string_view name) const;

 private:
  struct Param {
    ParamSpec spec;
    std::vector<double> master, state1, state2, grad;
    std::int64_t steps = 0;  // applied optimizer steps, for bias correction
  };
  Param& find(std::string_view name);
  const Param& find(std::string_view name) const;
  void update(Param& p, const RefLr& lr, double grad_mult);

  config::Config config_;
  model::ModelConfig model_;
  std::vector<UnitSpec> units_;
  std::uint64_t data_seed_;
  std::vector<std::string> names_;
  std::map<std::string, Param, std::less<>> params_;
  model::Network<double> net_;
  RefLossScaler scaler_;
  std::int64_t schedule_iter_ = -1;
  std::int64_t global_step_ = 0;
  std::int64_t skipped_ = 0;
};

// `values` as stored in `dtype`: rounded to it (through fp32, to nearest even); unchanged for fp32.
void store(std::vector<double>& values, DType dtype);

// Relative differences used by the tests: ||a - b|| / max(||b||, tiny), and the largest
// |a_i - b_i| / (atol + rtol |b_i|) (<= 1 means every element is within its bound).
double norm_rel_error(const std::vector<float>& a, const std::vector<double>& b);
double element_bound_ratio(const std::vector<float>& a, const std::vector<double>& b, double atol, double rtol,
                           std::size_t* worst_index = nullptr);

}  // namespace zero3::test
