// An out-of-tree program built against an installed zero3 (find_package + zero3::runtime): a host
// device, buffers, the cast / scale / sum-of-squares kernels checked against float64 references, the
// config parser on valid and invalid text, one engine step, and a model of its own trained with the
// library's loop (train_bigram.cpp). Exits non-zero on any mismatch, naming it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "consumer_checks.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/version.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/kernels/kernels.hpp"

namespace {

int g_failures = 0;
using consumer::expect;

// The checkpoint libraries come with zero3::runtime: a tag check and the Checkpointer's type.
void check_checkpoint_api() {
  bool refused = false;
  try {
    zero3::ckpt::check_tag("latest");
  } catch (const zero3::CheckpointError&) {
    refused = true;
  }
  zero3::ckpt::check_tag("global_step100");
  expect(refused, "ckpt::check_tag refuses the tag 'latest'");
  expect(zero3::ckpt::CheckpointerOptions{}.staging_bytes > 0, "Checkpointer options");
}

// fp32 -> bf16 on the host device's stream, bit-compared with the header's reference conversion; then
// x *= 0.5 in bf16 and the sum of squares against a float64 reference.
void check_kernels() {
  auto device = zero3::make_host_device();
  auto stream = device->create_stream("consumer");
  constexpr std::size_t kCount = 1000;
  zero3::Buffer src =
      device->allocate(kCount, zero3::DType::f32, zero3::MemoryKind::device, zero3::MemCategory::workspace);
  zero3::Buffer dst =
      device->allocate(kCount, zero3::DType::bf16, zero3::MemoryKind::device, zero3::MemCategory::workspace);
  zero3::Buffer out = device->allocate(1, zero3::DType::f32, zero3::MemoryKind::device, zero3::MemCategory::workspace);
  expect(device->memory().total(zero3::MemoryKind::device).current_bytes >= kCount * 6 + 4, "memory accounting");

  // Values that need rounding (ties included), plus Inf and NaN; the destination is poisoned first.
  float* x = src.view().as<float>();
  for (std::size_t i = 0; i < kCount; ++i) {
    x[i] = (static_cast<float>(i) - 500.0f) * 1.00390625f + static_cast<float>(i % 7) * 0.0009765625f;
  }
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = std::numeric_limits<float>::quiet_NaN();
  std::memset(dst.data(), 0xA5, dst.size_bytes());
  zero3::kernels::cast(*stream, dst.view(), src.cview());
  stream->synchronize();
  const auto* h = dst.view().as<zero3::bf16_t>();
  for (std::size_t i = 0; i < kCount; ++i) {
    const zero3::bf16_t want = zero3::float_to_bf16(x[i]);
    const bool same = std::isnan(x[i]) ? std::isnan(zero3::bf16_to_float(h[i])) : h[i].bits == want.bits;
    if (!same) {
      char msg[96];
      std::snprintf(msg, sizeof msg, "cast fp32->bf16 at %zu (%g): got 0x%04x, want 0x%04x", i, x[i],
                    unsigned{h[i].bits}, unsigned{want.bits});
      expect(false, msg);
      break;
    }
  }

  // Drop the non-finite values, halve (exact in bf16), then the sum of squares.
  x[1] = 3.0f;
  x[2] = -2.0f;
  zero3::kernels::cast(*stream, dst.view(), src.cview());
  zero3::kernels::scale(*stream, dst.view(), 0.5f);
  zero3::kernels::fill(*stream, out.view(), -1.0f);
  zero3::kernels::sum_squares(*stream, dst.cview(), out.view(), /*accumulate=*/false);
  stream->synchronize();
  double want = 0.0;
  for (std::size_t i = 0; i < kCount; ++i) {
    const double v = 0.5 * static_cast<double>(zero3::bf16_to_float(zero3::float_to_bf16(x[i])));
    want += v * v;
  }
  const double got = *out.view().as<float>();
  // fp32 accumulation of 1000 positive terms: relative error well under 1e-5.
  expect(std::fabs(got - want) <= 1e-5 * want,
         "sum_squares: got " + std::to_string(got) + " want " + std::to_string(want));
}

void check_config() {
  const char* valid = R"({
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 4096}
  })";
  zero3::config::ParseOptions options;
  options.world_size = 2;
  const auto result = zero3::config::parse_config_text(valid, options);
  for (const auto& e : result.errors) expect(false, zero3::config::format_diagnostic("error", e));
  expect(result.ok(), "valid config parses");
  if (result.ok()) {
    const auto& c = *result.config;
    expect(c.batch.train_batch_size == 16, "batch rule: 4 * 2 * 2 == " + std::to_string(c.batch.train_batch_size));
    expect(c.zero.stage == 3, "zero_optimization.stage");
    expect(c.zero.reduce_bucket_size == 4096, "zero_optimization.reduce_bucket_size");
    expect(c.model_dtype() == zero3::DType::bf16, "model dtype bf16");
    expect(c.optimizer && c.optimizer->type == zero3::config::OptimizerType::adamw && c.optimizer->betas[1] == 0.95,
           "optimizer block");
  }

  const auto bad = zero3::config::parse_config_text(R"({"zero_optimization": {"stage": "three"}})");
  bool named = false;
  for (const auto& e : bad.errors) named = named || e.path == "zero_optimization.stage";
  expect(!bad.ok() && named, "invalid stage is reported at zero_optimization.stage");

  // Exceptions thrown inside the static libraries are caught here by their public types.
  bool threw = false;
  try {
    zero3::config::load_config_or_throw("/nonexistent/zero3-consumer.json");
  } catch (const zero3::ConfigError&) {
    threw = true;
  }
  expect(threw, "load_config_or_throw on a missing file throws ConfigError");
}

// A one-unit model through the engine, single process: constant init 0.5, a gradient of ones, one AdamW
// step without clipping or decay. Adam's first step moves every element by lr * 1 / (1 + eps): 0.5 -> 0.4.
void check_engine() {
  const char* text = R"({
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": 0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero3": {"device": "host"}
  })";
  zero3::config::ParseOptions opts;
  opts.world_size = 1;
  opts.world_size_source = "consumer";
  auto parsed = zero3::config::parse_config_text(text, opts);
  expect(parsed.ok() && parsed.config.has_value(), "engine config parses");
  if (!parsed.config) return;
  zero3::comm::World world;  // single process
  world.source = "consumer";
  zero3::Engine engine(*parsed.config, world);
  engine.add_unit({"fc", {{"fc.weight", {3, 5}, zero3::ParamInit::constant(0.5)}}});
  engine.finalize();
  {
    auto g = engine.gather("fc");
    auto gr = engine.grads("fc");
    zero3::BufferView grad = gr.grad("fc.weight");
    zero3::kernels::fill(engine.compute_stream(), grad, 1.0f);
  }
  const zero3::StepResult r = engine.step();
  expect(r.boundary && r.applied, "engine step applied");
  const std::vector<float> w = engine.gather_tensor("fc.weight", zero3::TensorKind::master);
  expect(w.size() == 15, "gather_tensor returns all 15 elements");
  const double want = 0.5 - 0.1 / (1.0 + 1e-8);
  for (float v : w)
    expect(std::abs(v - want) < 1e-6, "AdamW first step moves 0.5 to 0.4 (got " + std::to_string(v) + ")");
}

}  // namespace

void consumer::expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAIL %s\n", what.c_str());
    ++g_failures;
  }
}

int main() {
  try {
    // One MPI bootstrap for the whole process: MPI cannot be initialized again once the last one is gone.
    zero3::comm::World world;
    world.source = "consumer";
    const std::shared_ptr<zero3::comm::Bootstrap> bootstrap = zero3::comm::make_mpi_bootstrap(world);
    check_kernels();
    check_config();
    check_engine();
    check_checkpoint_api();
    consumer::check_train_loop(bootstrap);
  } catch (const std::exception& e) {
    expect(false, std::string("exception: ") + e.what());
  }
  expect(zero3::built_with_cuda() == static_cast<bool>(ZERO3_CONSUMER_EXPECT_CUDA),
         "zero3_HAVE_CUDA matches the build");
  expect(zero3::kVersionString == ZERO3_CONSUMER_PACKAGE_VERSION &&
             zero3::kVersionString == std::to_string(zero3::kVersionMajor) + "." +
                                          std::to_string(zero3::kVersionMinor) + "." +
                                          std::to_string(zero3::kVersionPatch),
         "zero3/core/version.hpp gives the version find_package found");
  if (g_failures != 0) return 1;
  std::printf("consumer: ok (cuda backend %s)\n", zero3::built_with_cuda() ? "built" : "not built");
  return 0;
}
