// The optimizer block (https://www.deepspeed.ai/docs/config-json/ "Optimizer Parameters"; deepspeed/runtime/
// engine.py, _configure_basic_optimizer). DeepSpeed passes "params" to the constructor as keyword arguments,
// so a parameter the type does not take is an error here too. "auto" values become the type's defaults.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// DeepSpeed's own optimizer names (matched case-insensitively) that zero3 does not implement.
constexpr std::array<std::string_view, 8> kDsOtherOptimizers = {"lamb", "onebitadam", "zerooneadam", "onebitlamb",
                                                                "muon", "muadam",     "muadamw",     "musgd"};
// torch.optim classes DeepSpeed falls back to (matched case-sensitively).
constexpr std::array<std::string_view, 11> kTorchOptimizers = {
    "SGD", "RMSprop", "Adadelta", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam", "Rprop", "SparseAdam", "Adafactor"};

// "auto" is the HF Trainer's placeholder for its own arguments (transformers' HfTrainerDeepSpeedConfig fills
// lr, betas, eps and weight_decay from TrainingArguments). zero3 has no trainer arguments, so it takes the
// values the HF Trainer would take by default, whatever the optimizer type.
constexpr double kHfLearningRate = 5e-5;
constexpr std::array<double, 2> kHfBetas = {0.9, 0.999};
constexpr double kHfEps = 1e-8;
constexpr double kHfWeightDecay = 0.0;

void auto_to_hf(ObjectReader& r, std::string_view key, Got got, double& out, double hf_default,
                std::string_view hf_name) {
  if (got != Got::automatic) return;
  out = hf_default;
  r.sink().resolved(r.path_of(key), json_text(out),
                    fmt::format("\"auto\": HF Trainer's default {} (no trainer arguments to take it from)", hf_name));
}

void read_betas(ObjectReader& r, std::array<double, 2>& betas) {
  if (r.is_auto("betas")) {
    r.raw("betas");
    betas = kHfBetas;
    r.sink().resolved(
        r.path_of("betas"), fmt::format("[{}, {}]", json_text(betas[0]), json_text(betas[1])),
        "\"auto\": HF Trainer's defaults adam_beta1, adam_beta2 (no trainer arguments to take them from)");
    return;
  }
  const Json* j = r.raw("betas");
  if (j == nullptr) return;
  if (!j->is_array() || j->size() != 2) {
    r.error("betas", fmt::format("expected a list of 2 numbers [beta1, beta2], got {}",
                                 j->is_array() ? fmt::format("a list of {}", j->size()) : describe(*j)));
    return;
  }
  std::array<double, 2> v{};
  bool ok = true;
  for (std::size_t i = 0; i < 2; ++i) {
    const Json& b = (*j)[i];
    const std::string path = index_path(r.path_of("betas"), i);
    if (!b.is_number()) {
      r.sink().error(path, fmt::format("expected a number in [0, 1), got {}", describe(b)));
      ok = false;
      continue;
    }
    v[i] = b.get<double>();
    if (!(v[i] >= 0.0 && v[i] < 1.0)) {
      r.sink().error(path, fmt::format("must be in [0, 1), got {}", b.dump()));
      ok = false;
    }
  }
  if (ok) betas = v;
}

// The CPU optimizers' own switch for 16-bit moments. DeepSpeed builds its CPU Adam with it false when
// bf16.bf16_optimizer_states is on; alone it would ask for moments in the model dtype beside an fp32 master,
// a pair the kernels do not store (kernels::optimizer_storage_supported).
void read_fp32_optimizer_states(ObjectReader& p, OptimizerConfig& o, const Config& c) {
  const Got got = p.get_bool("fp32_optimizer_states", o.fp32_optimizer_states);
  if (c.bf16.bf16_optimizer_states) {
    if (got == Got::value && o.fp32_optimizer_states) {
      p.warning("fp32_optimizer_states", "true is overridden by bf16.bf16_optimizer_states: the moments are bf16");
    }
    o.fp32_optimizer_states = false;
  } else if (got == Got::value && !o.fp32_optimizer_states) {
    p.not_implemented("fp32_optimizer_states",
                      "16-bit moments with fp32 master weights are not implemented (bf16.bf16_optimizer_states with "
                      "bf16.bf16_master_weights_and_grads stores both in bf16)");
  }
}

void reject_max_grad_norm(ObjectReader& r) {
  if (r.raw("max_grad_norm") != nullptr) {
    r.error("max_grad_norm", "not allowed in optimizer params (DeepSpeed raises); use the top-level gradient_clipping");
  }
}

void parse_adam(ObjectReader& r, OptimizerConfig& o) {
  auto_to_hf(r, "lr", r.get_number("lr", o.lr), o.lr, kHfLearningRate, "learning_rate");
  read_betas(r, o.betas);
  auto_to_hf(r, "eps", r.get_number("eps", o.eps), o.eps, kHfEps, "adam_epsilon");
  auto_to_hf(r, "weight_decay", r.get_number("weight_decay", o.weight_decay), o.weight_decay, kHfWeightDecay,
             "weight_decay");
  r.get_bool("bias_correction", o.bias_correction);
  bool adam_w_mode{};
  const Got mode = r.get_bool("adam_w_mode", adam_w_mode);
  if (o.type == OptimizerType::adamw && mode == Got::value && !adam_w_mode) {
    r.warning("adam_w_mode",
              "false has no effect with type AdamW (DeepSpeed: decoupled = type is AdamW or "
              "adam_w_mode); use type Adam for L2 regularisation");
  }
  o.decoupled_weight_decay = o.type == OptimizerType::adamw || adam_w_mode;
  r.not_implemented_if_true("amsgrad", "AMSGrad is not implemented");
  r.get_bool("torch_adam", o.torch_adam);
  r.get_bool("set_grad_none", o.set_grad_none);
  reject_max_grad_norm(r);
}

void parse_lion(ObjectReader& r, OptimizerConfig& o) {
  auto_to_hf(r, "lr", r.get_number("lr", o.lr), o.lr, kHfLearningRate, "learning_rate");
  read_betas(r, o.betas);
  auto_to_hf(r, "weight_decay", r.get_number("weight_decay", o.weight_decay), o.weight_decay, kHfWeightDecay,
             "weight_decay");
  r.get_bool("set_grad_none", o.set_grad_none);
  reject_max_grad_norm(r);
}

void parse_adagrad(ObjectReader& r, OptimizerConfig& o) {
  o.lr = 1e-2;
  o.eps = 1e-10;
  auto_to_hf(r, "lr", r.get_number("lr", o.lr), o.lr, kHfLearningRate, "learning_rate");
  auto_to_hf(r, "eps", r.get_number("eps", o.eps), o.eps, kHfEps, "adam_epsilon");
  auto_to_hf(r, "weight_decay", r.get_number("weight_decay", o.weight_decay), o.weight_decay, kHfWeightDecay,
             "weight_decay");
  for (std::string_view key : {"lr_decay", "initial_accumulator_value"}) {
    double v = 0.0;
    if (r.get_number(key, v) == Got::value && v != 0.0) {
      r.not_implemented(key, fmt::format("Adagrad {} != 0 is not implemented", key));
    }
  }
  r.not_implemented_if_true("amsgrad", "AMSGrad is not implemented");
  r.not_implemented_if_true("maximize", "maximize is not implemented");
  for (std::string_view key : {"foreach", "fused"}) {
    const Json* j = r.raw(key);
    if (j != nullptr && !j->is_boolean() && !j->is_null()) {
      r.error(key, fmt::format("expected true, false or null, got {}", describe(*j)));
    }
  }
  bool differentiable = false;
  r.get_bool("differentiable", differentiable);
  reject_max_grad_norm(r);
}

}  // namespace

void parse_optimizer(ObjectReader& top, Context& cx) {
  if (!top.has("optimizer")) {
    cx.sink.not_implemented("optimizer",
                            "no optimizer block: zero3 trains only with a configured optimizer "
                            "(DeepSpeed would expect a client optimizer or run ZeRO-3 inference)");
    top.skip("optimizer");
    return;
  }
  const Json* j = top.get_object("optimizer");
  if (j == nullptr) return;
  ObjectReader r(*j, "optimizer", "optimizer", cx.sink);
  OptimizerConfig o;
  std::string type;
  const Got got = r.get_string("type", type);
  r.get_bool("legacy_fusion", o.legacy_fusion);
  const Json* params = r.get_object("params");
  if (got == Got::absent) r.error("type", "required key is missing (Adam, AdamW, Lion or Adagrad)");
  if (got != Got::value) {
    r.finish();
    return;
  }
  const std::string lower = lowercase(type);
  std::string_view block;
  if (lower == "adam" || lower == "adamw") {
    o.type = lower == "adam" ? OptimizerType::adam : OptimizerType::adamw;
    block = "optimizer.params (Adam/AdamW)";
  } else if (lower == "lion") {
    o.type = OptimizerType::lion;
    block = "optimizer.params (Lion)";
  } else if (lower == "adagrad") {
    o.type = OptimizerType::adagrad;
    block = "optimizer.params (Adagrad)";
  } else {
    const bool ds_other =
        std::find(kDsOtherOptimizers.begin(), kDsOtherOptimizers.end(), lower) != kDsOtherOptimizers.end();
    const bool torch = std::find(kTorchOptimizers.begin(), kTorchOptimizers.end(), type) != kTorchOptimizers.end();
    if (ds_other || torch) {
      const bool one_bit = lower == "onebitadam" || lower == "zerooneadam" || lower == "onebitlamb";
      if (one_bit && cx.config.zero.stage > 0) {
        r.error("type", fmt::format("{} is incompatible with ZeRO (DeepSpeed asserts)", type));
      } else if (cx.config.zero.stage > 0 && lower != "muon" && !cx.config.zero_allow_untested_optimizer) {
        r.error("type", fmt::format("{} is not in DeepSpeed's tested ZeRO optimizer list; DeepSpeed requires "
                                    "zero_allow_untested_optimizer: true",
                                    type));
      }
      r.not_implemented("type", fmt::format("optimizer {} is not implemented (zero3 has Adam, AdamW, Lion, Adagrad); "
                                            "its params are not checked",
                                            type));
      if (params != nullptr) r.skip("params");
      r.finish();
      return;
    }
    constexpr std::array<std::string_view, 4> kOurs = {"Adam", "AdamW", "Lion", "Adagrad"};
    std::string_view guess = closest_name(type, kOurs);
    if (guess.empty()) guess = closest_name(type, kTorchOptimizers);
    r.error("type", fmt::format("unknown optimizer type \"{}\"{}", type,
                                guess.empty() ? std::string(" (zero3 implements Adam, AdamW, Lion, Adagrad)")
                                              : fmt::format(" (did you mean '{}'?)", guess)));
    r.finish();
    return;
  }
  ObjectReader p(params ? *params : empty_object(), r.path_of("params"), block, cx.sink);
  switch (o.type) {
    case OptimizerType::adam:
    case OptimizerType::adamw:
      parse_adam(p, o);
      break;
    case OptimizerType::lion:
      parse_lion(p, o);
      break;
    case OptimizerType::adagrad:
      parse_adagrad(p, o);
      break;
  }
  read_fp32_optimizer_states(p, o, cx.config);
  p.finish();
  r.finish();
  cx.config.optimizer = o;
}

}  // namespace zero3::config::detail
