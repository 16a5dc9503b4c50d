// A host-computed model (GptModel<float>, MlpModel<float>: forward_unit/backward_unit over raw float
// pointers) behind the UnitModel interface. The engine's params and grads live in host memory (host
// device), possibly in bf16/fp16. A model that declares bf16 matrix weights (bf16_operand) gets those
// as they are, for bf16 products, where the CPU has them (gemm::bf16_native); every other 16-bit param
// is widened into float scratch before a unit runs, and gradients are computed into float scratch and
// rounded into the engine's buffers. Computation runs on the calling thread and the host pool after the
// compute stream has delivered the gathers.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "exact_resize.hpp"
#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::models::detail {

template <typename Model>
class HostAdapter final : public UnitModel {
 public:
  HostAdapter(Model model, std::vector<UnitSpec> units, std::string description)
      : model_(std::move(model)), units_(std::move(units)), description_(std::move(description)) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      std::vector<const ParamSpec*>& visit = visit_params_.emplace_back();
      for (const std::size_t v : visit_units(units_, u)) {
        for (const ParamSpec& p : units_[v].params) visit.push_back(&p);
      }
    }
  }
  // units_ is not to move from under visit_params_' pointers.
  HostAdapter(const HostAdapter&) = delete;
  HostAdapter& operator=(const HostAdapter&) = delete;

  const std::vector<UnitSpec>& units() const override { return units_; }
  std::string describe() const override { return description_; }

  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass) override {
    empty_ = batch == 0 && pass == Pass::eval;  // a rank without held-out samples still walks the units
    if (!empty_) model_.set_batch(tokens, targets, batch, len, pass);
  }

  void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) override {
    check_host("forward_unit", unit, params);
    stream.synchronize();
    if (empty_) return;
    const std::vector<const float*> p = widen(unit, params);
    if constexpr (kTakesBf16) {
      model_.forward_unit(unit, p, params16_);
    } else {
      model_.forward_unit(unit, p);
    }
  }

  double loss(Stream& /*stream*/) override { return empty_ ? 0.0 : static_cast<double>(model_.loss()); }

  void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                     float seed_scale, Stream& stream) override {
    check_host("backward_unit", unit, params);
    if (grads.size() != params.size()) {
      throw UsageError(fmt::format("{}: unit {} ({}): {} grads for {} params", description_, unit, units_.at(unit).name,
                                   grads.size(), params.size()));
    }
    stream.synchronize();  // the gathers and the zero fill of the gradient buffers
    const std::vector<const float*> p = widen(unit, params);
    // Grown, never shrunk: a unit with fewer params would otherwise free the scratch the next step reallocates.
    if (grad_scratch_.size() < grads.size()) grad_scratch_.resize(grads.size());
    std::vector<float*> g;
    for (std::size_t k = 0; k < grads.size(); ++k) {
      if (grads[k].dtype == DType::f32) {  // the engine's buffer is zero-filled: accumulate straight into it
        g.push_back(grads[k].template as<float>());
        continue;
      }
      grad_scratch_[k].assign(grads[k].count, 0.0f);
      g.push_back(grad_scratch_[k].data());
    }
    if constexpr (kTakesBf16) {
      model_.backward_unit(unit, p, g, seed_scale, params16_);
    } else {
      model_.backward_unit(unit, p, g, seed_scale);
    }
    for (std::size_t k = 0; k < grads.size(); ++k) {
      if (grads[k].dtype == DType::f32) continue;
      par::for_chunks(grads[k].count, kConvertChunk, [&](std::size_t, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) store_from_float(grads[k].data, grads[k].dtype, i, grad_scratch_[k][i]);
      });
    }
  }

  bool can_recompute(Recompute mode) const override { return kRecomputes || mode == Recompute::none; }
  void set_recompute(Recompute mode) override {
    if constexpr (kRecomputes) {
      model_.set_recompute(mode);
    } else {
      UnitModel::set_recompute(mode);
    }
  }

  bool can_offload_kept_inputs() const override { return kOffloads; }
  void set_offload_kept_inputs(bool on) override {
    if constexpr (kOffloads) {
      model_.set_offload_kept_inputs(on);
    } else {
      UnitModel::set_offload_kept_inputs(on);
    }
  }
  KeptInputsOffload take_kept_inputs_offload() override {
    if constexpr (kOffloads) {
      return {.host_bytes = model_.kept_inputs().host_bytes(), .exposed_copy_ms = model_.kept_inputs().take_copy_ms()};
    } else {
      return {};
    }
  }

  std::size_t activation_bytes() const override {
    std::size_t scratch = 0;
    for (const auto& s : param_scratch_) scratch += s.capacity() * sizeof(float);
    for (const auto& s : grad_scratch_) scratch += s.capacity() * sizeof(float);
    return model_.activation_bytes() + scratch;
  }
  // A host model runs on the host device only, whose device memory is host memory: its activations count
  // as device memory there, as a GPU model's do, for the start-up check, --device-memory-gb and
  // zero3.accumulation.
  MemoryKind activation_memory() const override { return MemoryKind::device; }

  std::size_t planned_activation_bytes(const ActivationShape& shape) const override {
    bool bf16_products = false;
    if constexpr (kTakesBf16) bf16_products = shape.params == DType::bf16 && gemm::bf16_native();
    // The adapter's own scratch: at each param position k, the largest 16-bit param widened to float (those
    // the model does not multiply as bf16) and the largest 16-bit gradient computed in float.
    std::vector<std::size_t> widened;
    std::vector<std::size_t> grads;
    if (shape.params != DType::f32) {
      for (std::size_t u = 0; u < units_.size(); ++u) {
        const std::vector<const ParamSpec*>& params = visit_params_[u];
        widened.resize(std::max(widened.size(), params.size()));
        grads.resize(std::max(grads.size(), params.size()));
        for (std::size_t k = 0; k < params.size(); ++k) {
          bool as_bf16 = false;
          if constexpr (kTakesBf16) as_bf16 = bf16_products && model_.bf16_operand(u, k);
          if (!as_bf16) widened[k] = std::max(widened[k], params[k]->numel());
          if (params[k]->trainable) grads[k] = std::max(grads[k], params[k]->numel());
        }
      }
    }
    std::size_t scratch = 0;
    for (const std::size_t n : widened) scratch += n;
    for (const std::size_t n : grads) scratch += n;
    std::size_t model = 0;
    if constexpr (requires(const Model& m) { m.planned_activation_bytes(0, 0, 0, false, Recompute::none); }) {
      model = model_.planned_activation_bytes(shape.micro_batch, shape.eval_batch, shape.len, bf16_products,
                                              shape.recompute, shape.offload_kept_inputs);
    } else {
      model = model_.planned_activation_bytes(shape.micro_batch, shape.eval_batch, shape.recompute,
                                              shape.offload_kept_inputs);
    }
    return model + scratch * sizeof(float);
  }
  std::size_t planned_offloaded_bytes(const ActivationShape& shape) const override {
    if (!shape.offload_kept_inputs) return 0;
    if constexpr (requires(const Model& m) { m.planned_offloaded_bytes(0, 0); }) {
      return model_.planned_offloaded_bytes(shape.micro_batch, shape.len);
    } else {
      return model_.planned_offloaded_bytes(shape.micro_batch);
    }
  }

 private:
  static constexpr bool kRecomputes = requires(Model & m) { m.set_recompute(Recompute::full); };
  static constexpr bool kOffloads = requires(Model & m) { m.set_offload_kept_inputs(true); };
  static constexpr bool kTakesBf16 = requires(const Model& m) { m.bf16_operand(std::size_t{}, std::size_t{}); };
  static constexpr std::size_t kConvertChunk = std::size_t{1} << 14;

  void check_host(const char* what, std::size_t unit, std::span<const BufferView> params) const {
    if (unit >= units_.size()) {
      throw UsageError(fmt::format("{}: {}: unit {} of {}", description_, what, unit, units_.size()));
    }
    if (params.size() != visit_params_[unit].size()) {
      throw UsageError(fmt::format("{}: {}: unit {} ({}) takes {} params, got {}", description_, what, unit,
                                   units_[unit].name, visit_params_[unit].size(), params.size()));
    }
  }

  // Float pointers for the model, and in params16_ the bf16 weights it multiplies as they are (their
  // float pointer null).
  std::vector<const float*> widen(std::size_t unit, std::span<const BufferView> params) {
    std::vector<const float*> ptrs;
    param_scratch_.resize(std::max(param_scratch_.size(), params.size()));
    params16_.assign(params.size(), nullptr);
    for (std::size_t k = 0; k < params.size(); ++k) {
      const BufferView& v = params[k];
      if (v.dtype == DType::f32) {
        ptrs.push_back(v.template as<const float>());
        continue;
      }
      if constexpr (kTakesBf16) {
        if (v.dtype == DType::bf16 && gemm::bf16_native() && model_.bf16_operand(unit, k)) {
          params16_[k] = v.template as<const bf16_t>();
          ptrs.push_back(nullptr);
          continue;
        }
      }
      resize_exact(param_scratch_[k], v.count);
      float* dst = param_scratch_[k].data();
      par::for_chunks(v.count, kConvertChunk, [&](std::size_t, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) dst[i] = load_as_float(v.data, v.dtype, i);
      });
      ptrs.push_back(dst);
    }
    return ptrs;
  }

  Model model_;
  std::vector<UnitSpec> units_;
  std::vector<std::vector<const ParamSpec*>> visit_params_;  // per unit: its params, then its borrowed units'
  std::string description_;
  bool empty_ = false;
  std::vector<std::vector<float>> param_scratch_;
  std::vector<std::vector<float>> grad_scratch_;
  std::vector<const bf16_t*> params16_;
};

}  // namespace zero3::models::detail
