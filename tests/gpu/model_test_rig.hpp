// The shared rig of the tests that compare a CUDA model with its float64 host model (test_gpt_cuda.cpp,
// test_llama_cuda.cpp): random params far from init, random batches, the host reference's loss and
// gradients, params and zero-filled grads on the device, train passes through UnitModel, and the per-tensor
// comparison against a tolerance relative to the reference tensor's range. A test names its host model for
// its config type by specializing HostModelOf.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/unit_model.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::test {

using zero3::models::Pass;
using zero3::models::UnitModel;

// The float64 host model of a config type: `using type = GptModel<double>;` for GptConfig.
template <typename Config>
struct HostModelOf;

constexpr float kSeedScale = 2.5f;  // the engine's loss multiplier: must scale every gradient

inline double round_to(DType t, double v) {
  unsigned char bytes[4];
  zero3::store_from_float(bytes, t, 0, static_cast<float>(v));
  return zero3::load_as_float(bytes, t, 0);
}

using Tensors = std::vector<std::vector<std::vector<double>>>;  // [unit][param][element]

// Random params far from init so that no gradient is trivially small and GELU and softmax are curved:
// weights normal(0, 1.2 / sqrt(hidden)) (pre-activations of about unit scale), constant-init params
// (LayerNorm, biases) their constant plus normal(0, 0.1). Every value is representable in `dtype`, so both
// models see the same params.
inline Tensors make_params(const std::vector<zero3::UnitSpec>& units, int hidden, std::uint64_t seed, DType dtype) {
  const double weight_std = 1.2 / std::sqrt(static_cast<double>(hidden));
  Tensors values;
  for (const zero3::UnitSpec& unit : units) {
    auto& unit_values = values.emplace_back();
    for (const zero3::ParamSpec& spec : unit.params) {
      const zero3::CounterRng rng(seed, zero3::hash_name(spec.name));
      const bool normal = spec.init.kind == zero3::ParamInit::Kind::normal;
      std::vector<double> v(spec.numel());
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double z = rng.normal(i);
        v[i] = round_to(dtype, normal ? weight_std * z : spec.init.a + 0.1 * z);
      }
      unit_values.push_back(std::move(v));
    }
  }
  return values;
}

struct Batch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  int batch = 0;
  int len = 0;
};

template <typename Config>
Batch make_batch(const Config& c, int batch, int len, std::uint64_t seed) {
  Batch b;
  b.batch = batch;
  b.len = len;
  const zero3::CounterRng rng(seed, 0xba7c4);
  for (int i = 0; i < batch * len; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng.uniform(static_cast<std::uint64_t>(i), 0) * c.vocab_size));
    b.targets.push_back(static_cast<std::int32_t>(rng.uniform(static_cast<std::uint64_t>(i), 1) * c.vocab_size));
  }
  return b;
}

// The first k positions of every sequence.
inline Batch prefix(const Batch& b, int k) {
  Batch p;
  p.batch = b.batch;
  p.len = k;
  for (int s = 0; s < b.batch; ++s) {
    for (int t = 0; t < k; ++t) {
      p.tokens.push_back(b.tokens[static_cast<std::size_t>(s * b.len + t)]);
      p.targets.push_back(b.targets[static_cast<std::size_t>(s * b.len + t)]);
    }
  }
  return p;
}

struct Reference {
  double loss = 0;
  std::vector<double> position_losses;
  Tensors grads;
};

template <typename Config>
Reference host_reference(const Config& config, const Tensors& params, const Batch& b, double seed_scale) {
  typename HostModelOf<Config>::type model(config);
  model.set_batch(b.tokens, b.targets, b.batch, b.len, Pass::train);
  auto pointers = [&](std::size_t u) {
    std::vector<const double*> p;
    for (const auto& v : params[u]) p.push_back(v.data());
    return p;
  };
  for (std::size_t u = 0; u < model.num_units(); ++u) model.forward_unit(u, pointers(u));
  Reference ref;
  ref.loss = model.loss();
  ref.position_losses.assign(model.position_losses().begin(), model.position_losses().end());
  for (const auto& unit : params) {
    auto& g = ref.grads.emplace_back();
    for (const auto& v : unit) g.emplace_back(v.size(), 0.0);
  }
  for (std::size_t u = model.num_units(); u-- > 0;) {
    std::vector<double*> g;
    for (auto& v : ref.grads[u]) g.push_back(v.data());
    model.backward_unit(u, pointers(u), g, seed_scale);
  }
  return ref;
}

// CUDA device 0, a stream, and device buffers filled and read through pinned staging.
struct Gpu {
  std::unique_ptr<zero3::Device> device = zero3::make_cuda_device(0);
  std::unique_ptr<zero3::Stream> stream = device->create_stream("model-test");

  Buffer upload(const std::vector<double>& v, DType t) {
    Buffer d = device->allocate(v.size(), t, MemoryKind::device, MemCategory::param_gathered);
    Buffer staging = device->allocate(v.size(), t, MemoryKind::pinned_host, MemCategory::staging);
    for (std::size_t i = 0; i < v.size(); ++i) zero3::store_from_float(staging.data(), t, i, static_cast<float>(v[i]));
    device->copy_async(d.view(), staging.cview(), *stream);
    stream->synchronize();
    return d;
  }
  std::vector<double> download(const Buffer& d) {
    Buffer staging = device->allocate(d.count(), d.dtype(), MemoryKind::pinned_host, MemCategory::staging);
    device->copy_async(staging.view(), d.cview(), *stream);
    stream->synchronize();
    std::vector<double> v(d.count());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = zero3::load_as_float(staging.data(), d.dtype(), i);
    return v;
  }
};

// Params (and zero-filled grads, as the engine hands them over) of every unit on the device.
struct DeviceTensors {
  std::vector<std::vector<Buffer>> buffers;

  DeviceTensors(Gpu& gpu, const Tensors& values, DType t) {
    for (const auto& unit : values) {
      auto& u = buffers.emplace_back();
      for (const auto& v : unit) u.push_back(gpu.upload(v, t));
    }
  }
  std::vector<BufferView> views(std::size_t unit) const {
    std::vector<BufferView> out;
    for (const Buffer& b : buffers[unit]) out.push_back(b.view());
    return out;
  }
};

inline Tensors zeros_like(const Tensors& t) {
  Tensors z;
  for (const auto& unit : t) {
    auto& u = z.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.size(), 0.0);
  }
  return z;
}

inline double forward_pass(UnitModel& model, Gpu& gpu, const DeviceTensors& params, const Batch& b, Pass pass) {
  model.set_batch(b.tokens, b.targets, b.batch, b.len, pass);
  for (std::size_t u = 0; u < model.units().size(); ++u) model.forward_unit(u, params.views(u), *gpu.stream);
  return model.loss(*gpu.stream);
}

inline void backward_pass(UnitModel& model, Gpu& gpu, const DeviceTensors& params, const DeviceTensors& grads) {
  for (std::size_t u = model.units().size(); u-- > 0;) {
    model.backward_unit(u, params.views(u), grads.views(u), kSeedScale, *gpu.stream);
  }
  gpu.stream->synchronize();
}

// What every CUDA decoder's eval passes promise, checked on `model` after its passes over `params`:
// position t sees tokens 0..t only (cut after k positions, the batch's loss is the mean of the reference's
// first k position losses, within loss_tol); a rank without held-out samples walks every unit and computes
// nothing; an eval pass keeps one layer's activations, less than a train pass (two fresh models of `make`).
template <typename Make>
void check_eval_contract(UnitModel& model, const Make& make, Gpu& gpu, const DeviceTensors& params, const Batch& b,
                         const Reference& ref, double loss_tol) {
  for (int k = 1; k <= b.len; ++k) {
    double sum = 0;
    for (int s = 0; s < b.batch; ++s) {
      for (int t = 0; t < k; ++t) sum += ref.position_losses[static_cast<std::size_t>(s) * b.len + t];
    }
    const double want = sum / (b.batch * k);
    const double got = forward_pass(model, gpu, params, prefix(b, k), Pass::eval);
    INFO("first " << k << " positions: device " << got << ", reference " << want);
    CHECK(std::abs(got - want) <= loss_tol * want);
  }
  model.set_batch({}, {}, 0, 0, Pass::eval);
  for (std::size_t u = 0; u < model.units().size(); ++u) model.forward_unit(u, params.views(u), *gpu.stream);
  CHECK(model.loss(*gpu.stream) == 0.0);
  std::unique_ptr<UnitModel> eval_model = make();
  forward_pass(*eval_model, gpu, params, b, Pass::eval);
  std::unique_ptr<UnitModel> train_model = make();
  forward_pass(*train_model, gpu, params, b, Pass::train);
  CHECK(eval_model->activation_bytes() > 0);
  CHECK(eval_model->activation_bytes() < train_model->activation_bytes());
}

// Max |got - want| against tol times the reference tensor's max |value|.
inline void check_tensor(const std::string& name, const std::vector<double>& got, const std::vector<double>& want,
                         double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  double worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= worst)) {  // NaN counts as worst
      worst = err;
      worst_at = i;
    }
  }
  INFO(name << ": max |error| " << worst << " at element " << worst_at << " (device " << got[worst_at] << ", reference "
            << want[worst_at] << "), reference max |value| " << scale << ", tolerance " << tol);
  CHECK(scale > 0);
  CHECK(worst <= tol * scale);
}

struct DtypeCase {
  DType dtype;
  double grad_tol;
  double loss_tol;
};

// `passes` train passes on the batch into the same (first zero-filled) grads: each adds its gradient (+=).
template <typename Config>
void compare_train_pass(UnitModel& model, Gpu& gpu, const Config& config, const Tensors& params,
                        const DeviceTensors& device_params, const Batch& b, const DtypeCase& dc, int passes = 1) {
  INFO("batch " << b.batch << ", len " << b.len << ", " << zero3::dtype_name(dc.dtype) << ", " << passes
                << " pass(es)");
  const Reference ref = host_reference(config, params, b, kSeedScale);
  const DeviceTensors grads(gpu, zeros_like(params), dc.dtype);
  for (int pass = 0; pass < passes; ++pass) {
    const double loss = forward_pass(model, gpu, device_params, b, Pass::train);
    CHECK(std::abs(loss - ref.loss) <= dc.loss_tol * ref.loss);
    backward_pass(model, gpu, device_params, grads);
    CHECK(loss == model.loss(*gpu.stream));  // backward keeps the forward's loss
  }
  const std::vector<zero3::UnitSpec>& units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (std::size_t k = 0; k < units[u].params.size(); ++k) {
      std::vector<double> want = ref.grads[u][k];
      for (double& w : want) w *= passes;
      check_tensor(units[u].params[k].name, gpu.download(grads.buffers[u][k]), want, dc.grad_tol);
    }
  }
}

// The model's loss and every gradient against the float64 host model, params made from `seed` in dc.dtype,
// over three train passes: batch 3 of len 5 (3 <= 4 heads: attention batched per sequence), batch 6 at full
// length (buffers regrown; 6 > 4 heads: batched per head), and the first batch again, twice into the same
// grads (buffers reused, not shrunk; the passes add up).
template <typename Config>
void compare_train_passes(UnitModel& model, Gpu& gpu, const Config& config, const DtypeCase& dc, std::uint64_t seed) {
  REQUIRE(model.units().size() == static_cast<std::size_t>(config.layers) + 2);
  CHECK(model.activation_memory() == MemoryKind::device);
  const Tensors params = make_params(model.units(), config.hidden, seed, dc.dtype);
  const DeviceTensors device_params(gpu, params, dc.dtype);
  const Batch first = make_batch(config, 3, 5, seed + 1);
  compare_train_pass(model, gpu, config, params, device_params, first, dc);
  const Batch second = make_batch(config, 6, config.seq_len, seed + 2);
  compare_train_pass(model, gpu, config, params, device_params, second, dc);
  compare_train_pass(model, gpu, config, params, device_params, first, dc, 2);
}

// Activation checkpointing on the device: each mode's train pass gives bitwise the loss and every gradient of
// Recompute::none on the same model, params (made from `seed` in `dtype`) and batch.
template <typename Config>
void check_recompute_bitwise(UnitModel& model, Gpu& gpu, const Config& config, DType dtype, std::uint64_t seed) {
  const Tensors params = make_params(model.units(), config.hidden, seed, dtype);
  const DeviceTensors device_params(gpu, params, dtype);
  const Batch b = make_batch(config, 3, config.seq_len, seed + 1);
  const auto run = [&](zero3::Recompute mode, std::vector<std::vector<double>>& grads_out, bool offload = false) {
    model.set_offload_kept_inputs(false);
    model.set_recompute(mode);
    model.set_offload_kept_inputs(offload);
    const DeviceTensors grads(gpu, zeros_like(params), dtype);
    const double loss = forward_pass(model, gpu, device_params, b, Pass::train);
    backward_pass(model, gpu, device_params, grads);
    grads_out.clear();
    for (const auto& unit : grads.buffers) {
      for (const Buffer& g : unit) grads_out.push_back(gpu.download(g));  // exact: equal values, equal bits
    }
    return loss;
  };
  std::vector<std::vector<double>> stored;
  const double stored_loss = run(zero3::Recompute::none, stored);
  for (const zero3::Recompute mode : {zero3::Recompute::full, zero3::Recompute::selective}) {
    INFO(zero3::dtype_name(dtype) << ", recompute " << zero3::to_string(mode));
    REQUIRE(model.can_recompute(mode));
    std::vector<std::vector<double>> again;
    CHECK(run(mode, again) == stored_loss);
    REQUIRE(again.size() == stored.size());
    for (std::size_t k = 0; k < stored.size(); ++k) {
      INFO("gradient " << k);
      CHECK(again[k] == stored[k]);
    }
  }
  // cpu_checkpointing: full recomputation's kept inputs through pinned memory on the copy stream.
  INFO(zero3::dtype_name(dtype) << ", recompute full, kept inputs offloaded");
  REQUIRE(model.can_offload_kept_inputs());
  std::vector<std::vector<double>> offloaded;
  CHECK(run(zero3::Recompute::full, offloaded, true) == stored_loss);
  REQUIRE(offloaded.size() == stored.size());
  for (std::size_t k = 0; k < stored.size(); ++k) {
    INFO("gradient " << k);
    CHECK(offloaded[k] == stored[k]);
  }
  gpu.stream->synchronize();
  const UnitModel::KeptInputsOffload o = model.take_kept_inputs_offload();
  const std::size_t planned = model.planned_offloaded_bytes({.micro_batch = 3,
                                                             .len = config.seq_len,
                                                             .params = dtype,
                                                             .recompute = zero3::Recompute::full,
                                                             .offload_kept_inputs = true});
  CHECK(planned > 0);  // the rig's models have layers whose inputs a later layer overwrites
  CHECK(o.host_bytes == planned);
  CHECK(o.exposed_copy_ms >= 0.0);
  model.set_offload_kept_inputs(false);
  model.set_recompute(zero3::Recompute::none);
}

}  // namespace zero3::test
