// The float64 reference trainer. Each formula cites the DeepSpeed source it comes from (paths in the DeepSpeed
// repository).
#include "reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::test {

using config::OptimizerType;
using config::SchedulerType;
using config::WarmupType;

std::vector<double> reference_init(const ParamSpec& param, std::uint64_t seed) {
  const std::size_t n = model::numel(param);
  std::vector<double> v(n);
  const CounterRng rng(seed, hash_name(param.name));
  for (std::size_t i = 0; i < n; ++i) {
    double x = 0.0;
    switch (param.init.kind) {
      case ParamInit::Kind::normal:
        x = param.init.a + param.init.b * rng.normal(i);
        break;
      case ParamInit::Kind::uniform:
        x = param.init.a + (param.init.b - param.init.a) * rng.uniform(i);
        break;
      case ParamInit::Kind::constant:
        x = param.init.a;
        break;
      case ParamInit::Kind::custom:
        throw UsageError("reference_init: custom inits are not modelled by the reference");
    }
    v[i] = static_cast<double>(static_cast<float>(x));  // the fp32 master
  }
  return v;
}

// ---- LR schedules (deepspeed/runtime/lr_schedules.py) -------------------------------------------------
namespace {

// WarmupLR / WarmupDecayLR warmup factor; N = max(2, warmup_num_steps).
double warmup_gamma(const config::SchedulerConfig& s, std::int64_t t) {
  const double n = static_cast<double>(std::max<std::int64_t>(2, s.warmup_num_steps));
  if (static_cast<double>(t) >= n) return 1.0;
  if (s.warmup_type == WarmupType::log) return std::log(static_cast<double>(t) + 1.0) / std::log(n);
  return static_cast<double>(t) / n;
}

RefLr one_cycle(const config::SchedulerConfig& s, std::int64_t t) {
  RefLr r;
  const bool momentum = s.cycle_momentum;
  if (t < 0) {  // the constructor's values: lr = min, betas = (min_mom, 0.99)
    r.lr = s.cycle_min_lr;
    if (momentum) r.betas = std::array<double, 2>{s.cycle_min_mom, 0.99};
    return r;
  }
  const double first = static_cast<double>(s.cycle_first_step_size);
  const double second = static_cast<double>(s.cycle_second_step_size);
  const double total = first + second;
  const double ratio = first / total;
  if (static_cast<double>(t) < total) {
    const double b = static_cast<double>(t) + 1.0;
    const double x = 1.0 + b / total - std::floor(1.0 + b / total);
    double scale = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
    const double ci = std::fmod(b, total);
    const bool first_half = ci <= first;
    const auto count = static_cast<double>(first_half ? s.cycle_first_stair_count : s.cycle_second_stair_count);
    if (count > 0) {
      const double pos = first_half ? ci * count / first : (total - ci) * count / second;
      scale = std::floor(pos) / count;
    }
    r.lr = s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * scale;
    if (momentum) {
      r.betas = std::array<double, 2>{s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * scale, 0.99};
    }
    return r;
  }
  if (s.decay_step_size == 0) {
    r.lr = s.cycle_min_lr;
    if (momentum) r.betas = std::array<double, 2>{s.cycle_max_mom, 0.99};
    return r;
  }
  const double d = static_cast<double>(t) - total + 1.0;
  const double k = d / static_cast<double>(s.decay_step_size);
  r.lr = s.cycle_min_lr / (1.0 + s.decay_lr_rate * k);
  if (momentum) r.betas = std::array<double, 2>{s.cycle_max_mom * (1.0 + s.decay_mom_rate * k), 0.99};
  return r;
}

}  // namespace

RefLr reference_lr(const config::Config& config, std::int64_t t) {
  ZERO3_CHECK(config.optimizer.has_value(), "reference_lr: the config has no optimizer");
  const double base = config.optimizer->lr;
  if (!config.scheduler) return {base, std::nullopt};
  const config::SchedulerConfig& s = *config.scheduler;
  const double n = static_cast<double>(std::max<std::int64_t>(2, s.warmup_num_steps));
  switch (s.type) {
    case SchedulerType::warmup_lr:
      if (t < 0) return {s.warmup_min_lr, std::nullopt};
      return {s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * warmup_gamma(s, t), std::nullopt};
    case SchedulerType::warmup_decay_lr: {
      if (t < 0) return {s.warmup_min_lr, std::nullopt};
      double gamma = warmup_gamma(s, t);
      if (static_cast<double>(t) >= n) {
        const double total = static_cast<double>(s.total_num_steps);
        gamma = std::max(0.0, (total - static_cast<double>(t)) / std::max(1.0, total - n));
      }
      return {s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma, std::nullopt};
    }
    case SchedulerType::warmup_cosine_lr: {
      double ratio = 0.0;
      if (t < 0) {
        ratio = 0.0;
      } else if (static_cast<double>(t) < n) {
        const double r = s.warmup_type == WarmupType::log ? std::log(static_cast<double>(t) + 1.0) / std::log(n)
                                                          : static_cast<double>(t) / n;
        ratio = s.warmup_min_ratio + r * (1.0 - s.warmup_min_ratio);
      } else {
        const double total = static_cast<double>(s.total_num_steps);
        const double p = std::min(1.0, (static_cast<double>(t) - n + 1.0) / std::max(1.0, total - n));
        ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0);
      }
      return {base * ratio, std::nullopt};
    }
    case SchedulerType::one_cycle:
      return one_cycle(s, t);
    case SchedulerType::lr_range_test: {
      const double b = static_cast<double>(t) + 1.0;
      const double size = static_cast<double>(s.lr_range_test_step_size);
      const double i = s.lr_range_test_staircase ? std::floor(b / size) : b / size;
      return {s.lr_range_test_min_lr * (1.0 + s.lr_range_test_step_rate * i), std::nullopt};
    }
  }
  return {base, std::nullopt};
}

// ---- loss scaling (DynamicLossScaler, deepspeed/runtime/fp16/loss_scaler.py) --------------------------

RefLossScaler::RefLossScaler(const config::Config& config) {
  if (!config.fp16.enabled) return;  // bf16 / fp32: a static scale of 1
  if (!config.fp16.dynamic_loss_scale()) {
    scale_ = config.fp16.loss_scale;
    return;
  }
  dynamic_ = true;
  scale_ = std::ldexp(1.0, static_cast<int>(config.fp16.initial_scale_power));
  min_scale_ = static_cast<double>(config.fp16.min_loss_scale);
  window_ = config.fp16.loss_scale_window;
  hysteresis_ = config.fp16.hysteresis;
  hyst_left_ = hysteresis_;
  consecutive_ = config.fp16.consecutive_hysteresis;
}

void RefLossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || hyst_left_ == 1) {
      if (scale_ == min_scale_) throw std::runtime_error("reference loss scaler: overflow at the minimum scale");
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --hyst_left_;
    }
    last_overflow_ = iter_;
  } else {
    if (consecutive_) hyst_left_ = hysteresis_;
    const std::int64_t stable = iter_ - last_overflow_ - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_) hyst_left_ = hysteresis_;
      scale_ *= 2.0;
    }
  }
  ++iter_;
}

// ---- the trainer --------------------------------------------------------------------------------------

ReferenceTrainer::ReferenceTrainer(config::Config config, model::ModelConfig model, std::vector<UnitSpec> units,
                                   std::uint64_t data_seed)
    : config_(std::move(config)),
      model_(model),
      units_(std::move(units)),
      data_seed_(data_seed),
      net_(model_),
      scaler_(config_) {
  ZERO3_CHECK(config_.optimizer.has_value(), "ReferenceTrainer: the config has no optimizer");
  ZERO3_CHECK(units_.size() == net_.num_units(), "ReferenceTrainer: units do not match the model");
  if (config_.scheduler) schedule_iter_ = config_.scheduler->last_batch_iteration;
  const auto seed = static_cast<std::uint64_t>(config_.zero3.seed);
  for (const UnitSpec& u : units_) {
    for (const ParamSpec& p : u.params) {
      Param param;
      param.spec = p;
      param.master = reference_init(p, seed);
      if (p.trainable) store(param.master, config_.master_dtype());
      const std::size_t n = param.master.size();
      param.grad.assign(n, 0.0);
      if (p.trainable) {
        switch (config_.optimizer->type) {
          case OptimizerType::adam:
          case OptimizerType::adamw:
            param.state1.assign(n, 0.0);
            param.state2.assign(n, 0.0);
            break;
          case OptimizerType::lion:
            param.state1.assign(n, 0.0);
            break;
          case OptimizerType::adagrad:
            param.state2.assign(n, 0.0);
            break;
        }
      }
      names_.push_back(p.name);
      params_.emplace(p.name, std::move(param));
    }
  }
}

ReferenceTrainer::Param& ReferenceTrainer::find(std::string_view name) {
  auto it = params_.find(name);
  if (it == params_.end()) throw UsageError(fmt::format("reference: no param named '{}'", name));
  return it->second;
}
const ReferenceTrainer::Param& ReferenceTrainer::find(std::string_view name) const {
  auto it = params_.find(name);
  if (it == params_.end()) throw UsageError(fmt::format("reference: no param named '{}'", name));
  return it->second;
}

const ParamSpec& ReferenceTrainer::spec(std::string_view name) const {
  return find(name).spec;
}
const std::vector<double>& ReferenceTrainer::master(std::string_view name) const {
  return find(name).master;
}
const std::vector<double>& ReferenceTrainer::state1(std::string_view name) const {
  return find(name).state1;
}
const std::vector<double>& ReferenceTrainer::state2(std::string_view name) const {
  return find(name).state2;
}
const std::vector<double>& ReferenceTrainer::grad(std::string_view name) const {
  return find(name).grad;
}

std::vector<double> ReferenceTrainer::compute_param(std::string_view name) const {
  const Param& p = find(name);
  std::vector<double> v(p.master.size());
  const DType dt = config_.model_dtype();
  for (std::size_t i = 0; i < v.size(); ++i) {
    float f = static_cast<float>(p.master[i]);
    if (dt == DType::bf16) f = bf16_to_float(float_to_bf16(f));
    if (dt == DType::f16) f = fp16_to_float(float_to_fp16(f));
    // fp32: the forward reads the float64 master itself (the reference is exact arithmetic).
    v[i] = dt == DType::f32 ? p.master[i] : static_cast<double>(f);
  }
  return v;
}

void store(std::vector<double>& values, DType dtype) {
  if (dtype == DType::f32) return;  // fp32 storage: the reference keeps exact arithmetic
  for (double& v : values) {
    const auto f = static_cast<float>(v);
    v = dtype == DType::bf16 ? bf16_to_float(float_to_bf16(f)) : fp16_to_float(float_to_fp16(f));
  }
}

RefStep ReferenceTrainer::step(bool overflow) {
  RefStep r;
  const std::int64_t tb = config_.batch.train_batch_size;
  const std::vector<std::int64_t> ids = model::all_ids(tb);
  net_.set_batch(model::make_batch<double>(model_, data_seed_, global_step_, ids));

  // Forward on the params as the engine's compute dtype holds them; backward with seed 1 (unscaled).
  std::vector<std::vector<std::vector<double>>> compute(units_.size());
  std::vector<std::vector<const double*>> ptrs(units_.size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (const ParamSpec& p : units_[u].params) compute[u].push_back(compute_param(p.name));
    for (const auto& v : compute[u]) ptrs[u].push_back(v.data());
    net_.forward(u, ptrs[u]);
  }
  r.loss = net_.loss();
  for (std::size_t u = units_.size(); u-- > 0;) {
    std::vector<double*> grads;
    for (const ParamSpec& p : units_[u].params) grads.push_back(find(p.name).grad.data());
    net_.backward(u, ptrs[u], grads, 1.0);
  }

  r.loss_scale = scaler_.scale();
  ++global_step_;
  if (overflow && config_.fp16.enabled) {  // ZeRO-3 checks fp16 only (deepspeed/runtime/zero/stage3.py)
    scaler_.update(true);
    ++skipped_;
    r.applied = false;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.lr = 0.0;
    r.next_loss_scale = scaler_.scale();
    return r;
  }

  // unscale_and_clip_grads (deepspeed/runtime/zero/stage3.py): global norm over trainable params;
  // c = max(1, (N + 1e-6) / clip).
  double sq = 0.0;
  for (const auto& [name, p] : params_) {
    if (!p.spec.trainable) continue;
    for (double g : p.grad) sq += g * g;
  }
  r.grad_norm = std::sqrt(sq);
  if (config_.gradient_clipping > 0.0) {
    r.clip_coef = std::max(1.0, (r.grad_norm + 1e-6) / config_.gradient_clipping);
  }
  const RefLr lr = reference_lr(config_, schedule_iter_);
  r.lr = lr.lr;
  for (auto& [name, p] : params_) {
    if (p.spec.trainable) update(p, lr, 1.0 / r.clip_coef);
  }
  ++schedule_iter_;
  scaler_.update(false);
  r.next_loss_scale = scaler_.scale();
  return r;
}

// One optimizer step of one param, in float64: DeepSpeed's CPU Adam, Lion and Adagrad (csrc/adam/cpu_adam_impl.cpp,
// csrc/lion/cpu_lion_impl.cpp, csrc/adagrad/cpu_adagrad.cpp). Then the master and the moments are stored as the
// config stores them (16-bit: rounded to nearest even, once per update).
void ReferenceTrainer::update(Param& p, const RefLr& sched, double grad_mult) {
  const config::OptimizerConfig& o = *config_.optimizer;
  const double lr = sched.lr * p.spec.lr_scale;
  const double wd = p.spec.weight_decay ? o.weight_decay : 0.0;
  const std::array<double, 2> betas = sched.betas.value_or(o.betas);
  const double b1 = betas[0];
  const double b2 = betas[1];
  ++p.steps;
  const std::size_t n = p.master.size();
  switch (o.type) {
    case OptimizerType::adam:
    case OptimizerType::adamw: {
      const bool decoupled = o.type == OptimizerType::adamw || o.decoupled_weight_decay;
      const double t = static_cast<double>(p.steps);
      const double bc1 = o.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
      const double bc2 = o.bias_correction ? std::sqrt(1.0 - std::pow(b2, t)) : 1.0;
      for (std::size_t i = 0; i < n; ++i) {
        double g = p.grad[i] * grad_mult;
        double& w = p.master[i];
        if (wd > 0.0 && !decoupled) g += wd * w;  // classic Adam: L2 in the gradient
        double& m = p.state1[i];
        double& v = p.state2[i];
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        const double denom = std::sqrt(v) / bc2 + o.eps;
        if (wd > 0.0 && decoupled) w -= lr * wd * w;  // decay reads p before the Adam update
        w -= (lr / bc1) * m / denom;
      }
      break;
    }
    case OptimizerType::lion:
      for (std::size_t i = 0; i < n; ++i) {
        const double g = p.grad[i] * grad_mult;
        double& w = p.master[i];
        double& m = p.state1[i];
        const double c = b1 * m + (1.0 - b1) * g;
        const double sign = c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0);
        w = w * (1.0 - lr * wd) - lr * sign;
        m = b2 * m + (1.0 - b2) * g;
      }
      break;
    case OptimizerType::adagrad:
      for (std::size_t i = 0; i < n; ++i) {
        double& w = p.master[i];
        double g = p.grad[i] * grad_mult;
        if (wd > 0.0) g += wd * w;  // L2 in the gradient, as DeepSpeed's CPU Adagrad
        double& s = p.state2[i];
        s += g * g;
        w -= lr * g / (std::sqrt(s) + o.eps);
      }
      break;
  }
  store(p.master, config_.master_dtype());
  store(p.state1, config_.optimizer_state_dtype());
  store(p.state2, config_.optimizer_state_dtype());
}

double norm_rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  ZERO3_CHECK(a.size() == b.size(), "norm_rel_error: sizes differ");
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double element_bound_ratio(const std::vector<float>& a, const std::vector<double>& b, double atol, double rtol,
                           std::size_t* worst_index) {
  ZERO3_CHECK(a.size() == b.size(), "element_bound_ratio: sizes differ");
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double r = std::fabs(static_cast<double>(a[i]) - b[i]) / (atol + rtol * std::fabs(b[i]));
    if (!std::isfinite(r)) r = std::numeric_limits<double>::infinity();
    if (r > worst || (i == 0 && worst_index != nullptr)) {
      worst = std::max(worst, r);
      if (worst_index != nullptr) *worst_index = i;
    }
  }
  return worst;
}

}  // namespace zero3::test
