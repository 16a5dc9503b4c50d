// A one-unit engine on the host device, for tests/mpi/scope_guard_test.sh (the scope-memory guard,
// docs/device.md). `scope_guard_probe MODE`, under mpirun at any world size:
//   train        3 optimizer steps whose forward and backward run on compute_stream() (launch_host), reading
//                the gathered params and writing the gradients through the scope pointers; rank 0 prints
//                the losses and the final params. The output must not depend on the guard.
//   touch-param  reads GatherScope::param memory from the host thread (after synchronize()): the contract
//                violation the guard stops; prints "survived" when nothing stopped it.
//   touch-grad   writes GradScope::grad memory from the host thread, likewise.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/engine/engine.hpp"

namespace {

using namespace zero3;

constexpr int kIn = 16;
constexpr int kOut = 24;
constexpr int kRows = 4;

config::Config make_config(int world_size) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero3": {"device": "host", "seed": 7}})";
  config::ParseOptions options;
  options.world_size = world_size;
  options.world_size_source = "mpirun";
  const config::ParseResult r = config::parse_config_text(text, options);
  if (!r.runnable()) throw ConfigError("scope_guard_probe: the config was rejected");
  return *r.config;
}

// One step's forward and backward of y = x W + b, loss = mean(y^2) / 2, on the compute stream.
double forward_backward(Engine& engine, int step, int rank) {
  double loss = 0.0;
  {
    Engine::GatherScope g = engine.gather("layer");
    Engine::GradScope gr = engine.grads("layer");
    const float* w = g.param("layer.w").as<float>();
    const float* b = g.param("layer.b").as<float>();
    float* dw = gr.grad("layer.w").as<float>();
    float* db = gr.grad("layer.b").as<float>();
    const auto scale = static_cast<float>(engine.loss_multiplier());
    engine.compute_stream().launch_host([=, &loss] {
      double sum = 0.0;
      for (int r = 0; r < kRows; ++r) {
        float x[kIn];
        for (int i = 0; i < kIn; ++i)
          x[i] = static_cast<float>((step + 1) * (r + 2) + i * (rank + 1) % 7) * 0.05f - 0.4f;
        for (int o = 0; o < kOut; ++o) {
          float y = b[o];
          for (int i = 0; i < kIn; ++i) y += x[i] * w[i * kOut + o];
          sum += 0.5 * static_cast<double>(y) * y / (kRows * kOut);
          const float dy = scale * y / (kRows * kOut);
          db[o] += dy;
          for (int i = 0; i < kIn; ++i) dw[i * kOut + o] += x[i] * dy;
        }
      }
      loss = sum;
    });
  }
  engine.compute_stream().synchronize();
  return loss;
}

void train(Engine& engine, int rank) {
  for (int step = 0; step < 3; ++step) {
    const double loss = forward_backward(engine, step, rank);
    const StepResult r = engine.step();
    if (rank == 0) std::printf("step %d: loss %.9g, grad norm %.9g\n", step, loss, r.grad_norm);
  }
  for (const char* name : {"layer.w", "layer.b"}) {
    const std::vector<float> v = engine.gather_tensor(name, TensorKind::param);
    if (rank != 0) continue;
    std::printf("%s:", name);
    for (const float x : v) std::printf(" %.9g", x);
    std::printf("\n");
  }
}

void touch(Engine& engine, bool grad) {
  Engine::GatherScope g = engine.gather("layer");
  if (grad) {
    Engine::GradScope gr = engine.grads("layer");
    engine.compute_stream().synchronize();
    volatile float* dw = gr.grad("layer.w").as<float>();
    dw[0] = 1.0f;  // the host thread writes scope memory
    std::printf("survived\n");
    return;
  }
  engine.compute_stream().synchronize();
  const volatile float* w = g.param("layer.w").as<float>();
  std::printf("survived: %g\n", static_cast<double>(w[0]));  // the host thread reads scope memory
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode != "train" && mode != "touch-param" && mode != "touch-grad") {
    std::fprintf(stderr, "usage: scope_guard_probe train|touch-param|touch-grad\n");
    return 2;
  }
  try {
    const comm::World world = comm::World::from_environment();
    log::set_rank(world.rank, world.size);
    Engine engine(make_config(world.size), world);
    ParamSpec w{"layer.w", {kIn, kOut}, ParamInit::normal({.std = 0.3})};
    ParamSpec b{"layer.b", {kOut}, ParamInit::uniform({.low = -0.1, .high = 0.1})};
    b.weight_decay = false;
    engine.add_unit({"layer", {w, b}});
    engine.finalize();
    if (mode == "train") {
      train(engine, world.rank);
    } else {
      touch(engine, mode == "touch-grad");
    }
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scope_guard_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
