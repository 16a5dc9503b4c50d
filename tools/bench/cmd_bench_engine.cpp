// `zero3-bench engine`: the step time of the library's host GPT (bench_trainer.hpp) trained by the ZeRO-3
// engine through its unit walk, next to the same model trained without it (whole fp32 buffers walked by a
// plain train::UnitSource, the same model code, the same host optimizer kernels on a host device stream),
// in one run, plus the engine's communication volume per step and its gathered-params peak. Runs as a
// single process without mpirun (the world then has one rank, where the engine uses its units in place and
// runs no collective: docs/engine.md, "World size 1"); under mpirun every rank runs both trainers and rank 0
// reports.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_trainer.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/kernels/kernels.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/train/unit_walk.hpp"

namespace zero3::tools {
namespace {

struct BenchOptions {
  bool json = false;
  int repeats = 5;
  int steps = 3;
  ModelShape shape;
};

constexpr double kLr = 1e-3;
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kEps = 1e-8;
constexpr double kWeightDecay = 0.01;
constexpr double kClip = 1.0;

// The engine's config: AdamW with clipping, fp32, DeepSpeed's ZeRO-3 defaults except max_reuse_distance 0,
// so every sharded unit is gathered for forward and again for backward (the volume the expected count
// assumes), on the host device.
config::Config engine_config(const BenchOptions& o, int world_size) {
  const std::string text = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, "gradient_clipping": {},
          "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "betas": [{}, {}], "eps": {}, "weight_decay": {}}}}},
          "zero_optimization": {{"stage": 3, "stage3_max_reuse_distance": 0}}, "zero3": {}}})",
      o.shape.micro_batch, kClip, kLr, kBeta1, kBeta2, kEps, kWeightDecay, zero3_block(o.shape));
  return bench::parse_builtin_config(text, world_size, "zero3-bench engine");
}

// ---- plain: whole fp32 buffers, no sharding, the same model code and optimizer kernels ------------------

// The model's units over whole fp32 buffers on a host device: master weights the model reads directly and
// gradient buffers zero-filled on `stream` before each unit's backward, as the engine's are.
class PlainUnits final : public train::UnitSource {
 public:
  struct Param {
    Buffer master, m, v, grad;
    bool weight_decay = true;
  };

  PlainUnits(const std::vector<UnitSpec>& units, Device& device, Stream& stream) : stream_(stream) {
    for (const UnitSpec& u : units) {
      std::vector<Param>& unit = units_.emplace_back();
      for (const ParamSpec& p : u.params) {
        const std::size_t n = p.numel();
        Param& param = unit.emplace_back();
        param.master = device.allocate(n, DType::f32, MemoryKind::device, MemCategory::master);
        param.m = device.allocate(n, DType::f32, MemoryKind::device, MemCategory::optim_state);
        param.v = device.allocate(n, DType::f32, MemoryKind::device, MemCategory::optim_state);
        param.grad = device.allocate(n, DType::f32, MemoryKind::device, MemCategory::grad_buffer);
        param.weight_decay = p.weight_decay;
        kernels::fill(stream, param.m.view(), 0.0f);
        kernels::fill(stream, param.v.view(), 0.0f);
      }
    }
  }

  std::size_t num_units() const override { return units_.size(); }
  void visit(std::size_t unit, bool with_grads, const train::UnitFn& fn) override {
    std::vector<BufferView> params;
    std::vector<BufferView> grads;
    for (Param& p : units_.at(unit)) {
      params.push_back(p.master.view());
      if (!with_grads) continue;
      kernels::fill(stream_, p.grad.view(), 0.0f);
      grads.push_back(p.grad.view());
    }
    fn(train::UnitViews{unit, params, grads});
  }

  std::vector<std::vector<Param>>& params() { return units_; }

 private:
  Stream& stream_;
  std::vector<std::vector<Param>> units_;
};

class PlainTrainer {
 public:
  // Starts from the engine's initial params (copied through one untraced forward walk of its units), so
  // both trainers train the same model on the same data (`config`'s, as the engine's trainer reads it).
  PlainTrainer(const config::Config& config, const comm::World& world, const ModelShape& shape, Engine& initial)
      : device_(make_host_device()),
        stream_(device_->create_stream("plain")),
        model_(models::make_host_gpt(gpt_config(shape))),
        units_(model_->units(), *device_, *stream_),
        data_(config, world) {
    norm_ = device_->allocate(1, DType::f32, MemoryKind::device, MemCategory::workspace);
    stream_->synchronize();
    const Engine::UntracedScope untraced = initial.untraced();
    train::EngineUnits engine_units(initial, model_->units());
    train::walk_forward(engine_units, [&](const train::UnitViews& u) {
      initial.compute_stream().synchronize();  // the gather is complete
      std::vector<PlainUnits::Param>& mine = units_.params()[u.unit];
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const BufferView& from = u.params[k];
        ZERO3_CHECK(from.dtype == DType::f32 && from.count == mine[k].master.count(),
                    "zero3-bench engine: the engine's params are not the plain trainer's fp32 shape");
        std::memcpy(mine[k].master.data(), from.data, from.count * sizeof(float));
      }
    });
  }
  ~PlainTrainer() {
    try {
      stream_->synchronize();
    } catch (const std::exception& e) {
      log::error("bench: the plain trainer's stream failed: {}", e.what());
    }
  }
  PlainTrainer(const PlainTrainer&) = delete;
  PlainTrainer& operator=(const PlainTrainer&) = delete;

  double step(std::int64_t s) {
    Stream& st = *stream_;
    const train::TokenBatch b = data_.batch(s);
    model_->set_batch(b.tokens, b.targets, b.batch, b.len, models::Pass::train);
    train::walk_forward(units_, [&](const train::UnitViews& u) { model_->forward_unit(u.unit, u.params, st); });
    train::walk_backward(
        units_, [&](const train::UnitViews& u) { model_->backward_unit(u.unit, u.params, u.grads, 1.0f, st); });
    const double loss = model_->loss(st);
    // Global norm, clipping folded into the optimizer's gradient scale, as the engine does.
    kernels::fill(st, norm_.view(), 0.0f);
    for (const auto& unit : units_.params()) {
      for (const PlainUnits::Param& p : unit) kernels::sum_squares(st, p.grad.cview(), norm_.view(), true);
    }
    st.synchronize();
    const double norm = std::sqrt(static_cast<double>(*norm_.view().as<float>()));
    const double clip = std::max(1.0, (norm + 1e-6) / kClip);
    ++t_;
    for (auto& unit : units_.params()) {
      for (PlainUnits::Param& p : unit) {
        kernels::AdamArgs a;
        a.lr = static_cast<float>(kLr);
        a.beta1 = static_cast<float>(kBeta1);
        a.beta2 = static_cast<float>(kBeta2);
        a.eps = static_cast<float>(kEps);
        a.weight_decay = p.weight_decay ? static_cast<float>(kWeightDecay) : 0.0f;
        a.adamw = true;
        a.step = t_;
        a.grad_scale = static_cast<float>(1.0 / clip);
        st.device().kernels().adam_step(st, a, p.master.view(), p.m.view(), p.v.view(), p.grad.cview(), BufferView{});
      }
    }
    st.synchronize();
    return loss;
  }

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  // Reads the buffers below from the calling thread only (the host model synchronizes the stream first).
  std::unique_ptr<models::UnitModel> model_;
  PlainUnits units_;
  BenchData data_;
  Buffer norm_;
  std::int64_t t_ = 0;
};

void run_bench(const BenchOptions& o) {
  const comm::World world = bench::bench_world();
  const config::Config cfg = engine_config(o, world.size);

  Zero3Trainer zero3(cfg, world, o.shape);
  PlainTrainer plain(cfg, world, o.shape, zero3.engine());

  // One warm-up step each (the engine records its gather trace in its first step), then alternate blocks
  // of `steps` steps so drift in machine load hits both sides alike.
  std::int64_t zero3_next = 0;
  std::int64_t plain_next = 0;
  double zero3_loss = zero3.step(zero3_next++);
  double plain_loss = plain.step(plain_next++);
  zero3.engine().reset_peaks();
  std::vector<double> zero3_ms;
  std::vector<double> plain_ms;
  for (int r = 0; r < o.repeats; ++r) {
    zero3_ms.push_back(bench::time_steps_ms(o.steps, zero3_next, [&](std::int64_t s) { zero3_loss = zero3.step(s); }));
    plain_ms.push_back(bench::time_steps_ms(o.steps, plain_next, [&](std::int64_t s) { plain_loss = plain.step(s); }));
  }
  const EngineStats st = zero3.engine().stats();
  const MemoryTracker::Counter gathered = zero3.engine().memory().get(MemoryKind::device, MemCategory::param_gathered);
  const bench::Spread z = bench::spread(zero3_ms);
  const bench::Spread p = bench::spread(plain_ms);
  const double z_ms = z.median;
  const double p_ms = p.median;
  const std::uint64_t comm = st.last_step_all_gather_elems + st.last_step_reduce_scatter_elems;
  // Each sharded unit: gathered for forward and for backward, its gradient reduce-scattered. Persistent
  // units are never gathered; their gradients are all-reduced (reported separately). At world size 1 the
  // engine runs no collective (zero3.single_rank_in_place, on by default).
  const bool in_place = world.size == 1 && cfg.zero3.single_rank_in_place;
  const std::uint64_t expected = in_place ? 0 : 3 * st.total_elems - 3 * st.persistent_elems;
  if (world.rank != 0) return;

  if (o.json) {
    fmt::print(
        "{{\"overhead_ratio\": {:.4f}, \"zero3_step_ms\": {:.3f}, \"plain_step_ms\": {:.3f}, "
        "\"comm_elems_per_step\": {}, \"expected_comm_elems_per_step\": {}, \"all_gather_elems_per_step\": {}, "
        "\"reduce_scatter_elems_per_step\": {}, \"all_reduce_elems_per_step\": {}, \"gathered_peak_elems\": {}, "
        "\"param_gathered_peak_bytes\": {}, \"params\": {}, \"persistent_elems\": {}, \"world_size\": {}, "
        "\"repeats\": {}, \"steps\": {}, \"zero3_loss\": {:.6f}, \"plain_loss\": {:.6f}}}\n",
        z_ms / p_ms, z_ms, p_ms, comm, expected, st.last_step_all_gather_elems, st.last_step_reduce_scatter_elems,
        st.last_step_all_reduce_elems, st.gathered_peak_elems, gathered.peak_bytes, st.total_elems, st.persistent_elems,
        world.size, o.repeats, o.steps, zero3_loss, plain_loss);
    return;
  }
  fmt::print(
      "zero3-bench engine: {}; micro-batch {}; {} params ({} persistent); world size {}; AdamW, clip {}, fp32, host "
      "device\n",
      zero3.model().describe(), o.shape.micro_batch, st.total_elems, st.persistent_elems, world.size, kClip);
  if (world.size > 1) fmt::print("note: the plain trainer does not communicate; compare the times at world size 1\n");
  fmt::print("step time, median (range) of {} x {} steps:\n", o.repeats, o.steps);
  fmt::print("  {:<34} {:>26}  (loss {:.6f})\n", "plain (no zero3)", bench::median_and_range_ms(p), plain_loss);
  fmt::print("  {:<34} {:>26}  (loss {:.6f})\n", "zero3", bench::median_and_range_ms(z), zero3_loss);
  fmt::print("  {:<34} {:>10.3f}\n", "overhead ratio (zero3 / plain)", z_ms / p_ms);
  fmt::print("communication per step (elements):\n");
  fmt::print("  {:<34} {:>12}  (all-gather {}, reduce-scatter {})\n", "gathered + reduce-scattered", comm,
             st.last_step_all_gather_elems, st.last_step_reduce_scatter_elems);
  if (in_place) {
    fmt::print("  {:<34} {:>12}  (world size 1: units used in place, no collectives)\n", "expected", expected);
  } else {
    fmt::print("  {:<34} {:>12}  (3 x {} - 3 x {} persistent)\n", "expected", expected, st.total_elems,
               st.persistent_elems);
  }
  fmt::print("  {:<34} {:>12}\n", "all-reduced (persistent grads)", st.last_step_all_reduce_elems);
  fmt::print("gathered peak: {} elements, param_gathered peak {} bytes\n", st.gathered_peak_elems, gathered.peak_bytes);
}

}  // namespace

void add_bench_engine_command(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* engine =
      app.add_subcommand("engine", "Step time of the host GPT under the ZeRO-3 engine vs the same model without it");
  bench::add_json_flag(*engine, opt->json);
  bench::add_repeats_option(*engine, opt->repeats);
  bench::add_steps_option(*engine, opt->steps);
  add_model_shape_options(*engine, opt->shape, true);
  engine->callback([opt] { run_bench(*opt); });
}

}  // namespace zero3::tools
