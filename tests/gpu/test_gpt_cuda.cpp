// The CUDA GPT against the host GptModel<double> on the same params and batch: the loss, every param's
// gradient (fp32, bf16 and fp16 params and grads), per-position losses through causality (the loss of a
// batch cut to its first k positions is the mean of the reference's first k position losses), an eval pass
// (same loss as train), an empty eval pass, a second batch shape on the same model (buffers regrown,
// attention batched per head instead of per sequence), two passes adding into the same grads, and the
// calling contract. Skipped (exit 77) without a device: see gpu_main.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/gpt_cuda.hpp"

namespace {

using zero3::Buffer;
using zero3::BufferView;
using zero3::DType;
using zero3::MemCategory;
using zero3::MemoryKind;
using zero3::models::GptConfig;
using zero3::models::GptModel;
using zero3::models::Pass;
using zero3::models::UnitModel;

// Tolerances, relative to the largest |value| of the reference tensor (gradients) or to the loss.
// fp32: the device computes in fp32 (pure fp32 GEMMs, no tf32) what the reference computes in float64;
// rounding errors of ~1e-7 per operation over a few dozen chained operations stay far below 1e-4, while a
// wrong term, scale or index moves a gradient by a sizeable fraction of its tensor's range.
constexpr double kF32GradTol = 1e-4;
constexpr double kF32LossTol = 1e-5;
// bf16: params are bf16 on both sides (exactly), but the device rounds every activation and output
// gradient to bf16 (8 significant bits, 2^-9 relative) before each linear layer's GEMM, and its gradients
// are stored in bf16: ~3 significant digits, compounded over about ten chained products through two blocks.
// 5e-2 of the tensor's range bounds that; dtype bugs (a wrong operand type, a missed cast) give O(1) errors.
// A numpy emulation of these rounding points on this config and param scale, over 3600 random passes:
// worst gradient error 3.7e-2 of the range for bf16 (99.9% of passes below 2.3e-2), 3.9e-3 for fp16; loss
// 9e-4 and 1.2e-4. Narrower models are worse conditioned: at hidden 16, vocab 11, 0.3% of bf16 passes
// exceeded 5e-2 (worst 0.2), so this test, with a random seed per run, keeps the widths below.
constexpr double kBf16GradTol = 5e-2;
constexpr double kBf16LossTol = 1e-2;
// fp16: 11 significant bits (8x finer than bf16); attention's products run in tf32 (11 bits as well).
constexpr double kF16GradTol = 1.5e-2;
constexpr double kF16LossTol = 3e-3;

constexpr float kSeedScale = 2.5f;  // the engine's loss multiplier: must scale every gradient

// Small, yet wide enough that every strided loop of the kernels runs more than once: hidden 48 > 32 lanes
// (LayerNorm, a warp per row; two column tiles of the column sums), seq_len 40 > 32 lanes (the softmax rows
// of a full-length batch), vocab 300 > 256 threads (cross-entropy, a block per row).
GptConfig tiny_config() {
  GptConfig c;
  c.vocab_size = 300;
  c.seq_len = 40;
  c.layers = 2;
  c.hidden = 48;
  c.heads = 4;
  return c;
}

double round_to(DType t, double v) {
  unsigned char bytes[4];
  zero3::store_from_float(bytes, t, 0, static_cast<float>(v));
  return zero3::load_as_float(bytes, t, 0);
}

using Tensors = std::vector<std::vector<std::vector<double>>>;  // [unit][param][element]

// Random params far from init so that no gradient is trivially small and GELU and softmax are curved:
// weights normal(0, 1.2 / sqrt(hidden)) (pre-activations of about unit scale), constant-init params
// (LayerNorm, biases) their constant plus normal(0, 0.1). Every value is representable in `dtype`, so both
// models see the same params.
Tensors make_params(const std::vector<zero3::UnitSpec>& units, int hidden, std::uint64_t seed, DType dtype) {
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

Batch make_batch(const GptConfig& c, int batch, int len, std::uint64_t seed) {
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
Batch prefix(const Batch& b, int k) {
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

Reference host_reference(const GptConfig& config, const Tensors& params, const Batch& b, double seed_scale) {
  GptModel<double> model(config);
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
  std::unique_ptr<zero3::Stream> stream = device->create_stream("gpt-cuda-test");

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

Tensors zeros_like(const Tensors& t) {
  Tensors z;
  for (const auto& unit : t) {
    auto& u = z.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.size(), 0.0);
  }
  return z;
}

double forward_pass(UnitModel& model, Gpu& gpu, const DeviceTensors& params, const Batch& b, Pass pass) {
  model.set_batch(b.tokens, b.targets, b.batch, b.len, pass);
  for (std::size_t u = 0; u < model.units().size(); ++u) model.forward_unit(u, params.views(u), *gpu.stream);
  return model.loss(*gpu.stream);
}

void backward_pass(UnitModel& model, Gpu& gpu, const DeviceTensors& params, const DeviceTensors& grads) {
  for (std::size_t u = model.units().size(); u-- > 0;) {
    model.backward_unit(u, params.views(u), grads.views(u), kSeedScale, *gpu.stream);
  }
  gpu.stream->synchronize();
}

// Max |got - want| against tol times the reference tensor's max |value|.
void check_tensor(const std::string& name, const std::vector<double>& got, const std::vector<double>& want,
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
void compare_train_pass(UnitModel& model, Gpu& gpu, const GptConfig& config, const Tensors& params,
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

}  // namespace

TEST_CASE("cuda gpt: loss and every gradient match the float64 host model", "[models][gpu]") {
  const DtypeCase dc =
      GENERATE(DtypeCase{DType::f32, kF32GradTol, kF32LossTol}, DtypeCase{DType::bf16, kBf16GradTol, kBf16LossTol},
               DtypeCase{DType::f16, kF16GradTol, kF16LossTol});
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  const GptConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_gpt(config, *gpu.device);
  REQUIRE(model->units().size() == static_cast<std::size_t>(config.layers) + 2);
  CHECK(model->activation_memory() == MemoryKind::device);
  const Tensors params = make_params(model->units(), config.hidden, seed, dc.dtype);
  const DeviceTensors device_params(gpu, params, dc.dtype);

  // batch 3 <= 4 heads: attention batched per sequence; len 5 < seq_len 40.
  const Batch first = make_batch(config, 3, 5, seed + 1);
  compare_train_pass(*model, gpu, config, params, device_params, first, dc);
  // The same model on a larger batch: buffers regrown; batch 6 > 4 heads: attention batched per head.
  const Batch second = make_batch(config, 6, config.seq_len, seed + 2);
  compare_train_pass(*model, gpu, config, params, device_params, second, dc);
  // And back to the first shape (buffers reused, not shrunk), two passes into the same grads: they add up.
  compare_train_pass(*model, gpu, config, params, device_params, first, dc, 2);
}

TEST_CASE("cuda gpt: eval passes, per-position losses and causality", "[models][gpu]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  const GptConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_gpt(config, *gpu.device);
  const Tensors params = make_params(model->units(), config.hidden, seed, DType::f32);
  const DeviceTensors device_params(gpu, params, DType::f32);
  const Batch b = make_batch(config, 3, 5, seed + 1);
  const Reference ref = host_reference(config, params, b, kSeedScale);

  const double train_loss = forward_pass(*model, gpu, device_params, b, Pass::train);
  const double eval_loss = forward_pass(*model, gpu, device_params, b, Pass::eval);
  CHECK(std::abs(eval_loss - train_loss) <= 1e-6 * train_loss);
  CHECK(std::abs(eval_loss - ref.loss) <= kF32LossTol * ref.loss);

  // Position t sees tokens 0..t only: cutting the batch after k positions leaves the first k position
  // losses as they were, so the loss of the cut batch is their mean.
  for (int k = 1; k <= b.len; ++k) {
    double sum = 0;
    for (int s = 0; s < b.batch; ++s) {
      for (int t = 0; t < k; ++t) sum += ref.position_losses[static_cast<std::size_t>(s * b.len + t)];
    }
    const double want = sum / (b.batch * k);
    const double got = forward_pass(*model, gpu, device_params, prefix(b, k), Pass::eval);
    INFO("first " << k << " positions: device " << got << ", reference " << want);
    CHECK(std::abs(got - want) <= kF32LossTol * want);
  }

  // A rank without held-out samples: every unit's forward runs (and checks its params), nothing is computed.
  model->set_batch({}, {}, 0, 0, Pass::eval);
  for (std::size_t u = 0; u < model->units().size(); ++u) {
    model->forward_unit(u, device_params.views(u), *gpu.stream);
  }
  CHECK(model->loss(*gpu.stream) == 0.0);

  // Eval keeps one block's activations: a fresh model's eval pass holds less than a train pass.
  std::unique_ptr<UnitModel> eval_model = zero3::models::make_cuda_gpt(config, *gpu.device);
  forward_pass(*eval_model, gpu, device_params, b, Pass::eval);
  std::unique_ptr<UnitModel> train_model = zero3::models::make_cuda_gpt(config, *gpu.device);
  forward_pass(*train_model, gpu, device_params, b, Pass::train);
  CHECK(eval_model->activation_bytes() > 0);
  CHECK(eval_model->activation_bytes() < train_model->activation_bytes());
}

TEST_CASE("cuda gpt: calls out of order throw naming the unit", "[models][gpu]") {
  using Catch::Matchers::Contains;
  const GptConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_gpt(config, *gpu.device);
  const Tensors params = make_params(model->units(), config.hidden, 7, DType::f32);
  const DeviceTensors device_params(gpu, params, DType::f32);
  const DeviceTensors grads(gpu, zeros_like(params), DType::f32);
  const Batch b = make_batch(config, 2, 4, 9);
  const std::size_t head = model->units().size() - 1;

  REQUIRE_THROWS_AS(model->forward_unit(0, device_params.views(0), *gpu.stream), zero3::UsageError);  // no batch
  model->set_batch(b.tokens, b.targets, b.batch, b.len, Pass::train);
  REQUIRE_THROWS_WITH(model->forward_unit(1, device_params.views(1), *gpu.stream), Contains("blocks.0"));
  REQUIRE_THROWS_AS(model->forward_unit(0, device_params.views(1), *gpu.stream), zero3::UsageError);  // wrong params
  REQUIRE_THROWS_AS(model->loss(*gpu.stream), zero3::UsageError);  // before the head's forward
  model->forward_unit(0, device_params.views(0), *gpu.stream);
  REQUIRE_THROWS_WITH(model->backward_unit(0, device_params.views(0), grads.views(0), 1.0f, *gpu.stream),
                      Contains("embed"));
  for (std::size_t u = 1; u <= head; ++u) model->forward_unit(u, device_params.views(u), *gpu.stream);
  REQUIRE_THROWS_WITH(model->backward_unit(1, device_params.views(1), grads.views(1), 1.0f, *gpu.stream),
                      Contains("head"));
  REQUIRE_THROWS_AS(model->forward_unit(0, device_params.views(0), *gpu.stream), zero3::UsageError);  // pass done
  model->backward_unit(head, device_params.views(head), grads.views(head), 1.0f, *gpu.stream);
  gpu.stream->synchronize();

  // No backward after an eval pass; batch 0 only for eval; ids checked.
  forward_pass(*model, gpu, device_params, b, Pass::eval);
  REQUIRE_THROWS_AS(model->backward_unit(head, device_params.views(head), grads.views(head), 1.0f, *gpu.stream),
                    zero3::UsageError);
  REQUIRE_THROWS_AS(model->set_batch({}, {}, 0, 0, Pass::train), zero3::UsageError);
  Batch bad = b;
  bad.targets[3] = config.vocab_size;
  REQUIRE_THROWS_WITH(model->set_batch(bad.tokens, bad.targets, bad.batch, bad.len, Pass::train),
                      Contains("targets[3]"));
  REQUIRE_THROWS_AS(model->set_batch(b.tokens, b.targets, b.batch, config.seq_len + 1, Pass::train), zero3::UsageError);
}

TEST_CASE("cuda gpt: a host device is refused", "[models][gpu]") {
  std::unique_ptr<zero3::Device> host = zero3::make_host_device();
  REQUIRE_THROWS_AS(zero3::models::make_cuda_gpt(tiny_config(), *host), zero3::ConfigError);
  CHECK(zero3::models::cuda_gpt_available());
}
