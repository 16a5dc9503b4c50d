// `zero3 bench engine`: the step time of the transformer-shaped test model (bench_model.hpp) trained by the
// ZeRO-3 engine, next to the same model trained without it (plain fp32 buffers, the same float forward and
// backward code, the same host optimizer kernels on a host device stream), in one run, plus the engine's
// communication volume per step and its gathered-params peak. Runs as a single process without mpirun (the
// world then has one rank); under mpirun every rank runs both trainers and rank 0 reports.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench_model.hpp"
#include "bench_trainer.hpp"
#include "commands.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::tools {
namespace {

struct BenchOptions {
  bool json = false;
  int repeats = 5;
  int steps = 3;
  ModelShape shape;
};

constexpr std::uint64_t kSeed = 42;
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
          "zero_optimization": {{"stage": 3, "stage3_max_reuse_distance": 0}},
          "zero3": {{"seed": {}, "device": "host"}}}})",
      o.shape.micro_batch, kClip, kLr, kBeta1, kBeta2, kEps, kWeightDecay, kSeed);
  return bench::parse_builtin_config(text, world_size, "zero3 bench engine");
}

// ---- plain: whole fp32 buffers, no sharding, the same model code and optimizer kernels ------------------
class PlainTrainer {
 public:
  PlainTrainer(const comm::World& world, const model::ModelConfig& mc, const std::vector<UnitSpec>& units,
               int micro_batch)
      : world_(world), mc_(mc), units_(units), micro_batch_(micro_batch), net_(mc), device_(make_host_device()) {
    stream_ = device_->create_stream("plain");
    norm_ = device_->allocate(1, DType::f32, MemoryKind::device, MemCategory::workspace);
    for (const UnitSpec& u : units_) {
      for (const ParamSpec& p : u.params) {
        const std::size_t n = model::numel(p);
        Param param;
        param.master = device_->allocate(n, DType::f32, MemoryKind::device, MemCategory::master);
        param.m = device_->allocate(n, DType::f32, MemoryKind::device, MemCategory::optim_state);
        param.v = device_->allocate(n, DType::f32, MemoryKind::device, MemCategory::optim_state);
        param.grad = device_->allocate(n, DType::f32, MemoryKind::device, MemCategory::grad_buffer);
        param.weight_decay = p.weight_decay;
        model::init_param(p, kSeed, {param.master.view().as<float>(), n});
        kernels::fill(*stream_, param.m.view(), 0.0f);
        kernels::fill(*stream_, param.v.view(), 0.0f);
        params_.push_back(std::move(param));
      }
    }
    stream_->synchronize();
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
    auto batch = std::make_shared<const model::Batch<float>>(batch_for(mc_, world_, micro_batch_, s));
    st.launch_host([this, batch] { net_.set_batch(*batch); });
    std::size_t first = 0;
    std::vector<std::size_t> firsts;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      firsts.push_back(first);
      st.launch_host([this, u, first] { net_.forward(u, params_of(u, first)); });
      first += units_[u].params.size();
    }
    st.launch_host([this] { loss_ = static_cast<double>(net_.loss()); });
    for (std::size_t u = units_.size(); u-- > 0;) {
      st.launch_host([this, u, f = firsts[u]] {
        std::vector<float*> grads;
        for (std::size_t k = 0; k < units_[u].params.size(); ++k)
          grads.push_back(params_[f + k].grad.view().as<float>());
        net_.backward(u, params_of(u, f), grads, 1.0f);
      });
    }
    // Global norm, clipping folded into the optimizer's gradient scale, as the engine does.
    kernels::fill(st, norm_.view(), 0.0f);
    for (const Param& p : params_) kernels::sum_squares(st, p.grad.cview(), norm_.view(), true);
    st.synchronize();
    const double norm = std::sqrt(static_cast<double>(*norm_.view().as<float>()));
    const double clip = std::max(1.0, (norm + 1e-6) / kClip);
    ++t_;
    for (Param& p : params_) {
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
    st.synchronize();
    return loss_;
  }

 private:
  struct Param {
    Buffer master, m, v, grad;
    bool weight_decay = true;
  };
  std::vector<const float*> params_of(std::size_t u, std::size_t first) const {
    std::vector<const float*> ptrs;
    for (std::size_t k = 0; k < units_[u].params.size(); ++k)
      ptrs.push_back(params_[first + k].master.view().as<float>());
    return ptrs;
  }

  comm::World world_;
  model::ModelConfig mc_;
  std::vector<UnitSpec> units_;
  int micro_batch_;
  model::Network<float> net_;
  double loss_ = 0.0;
  std::int64_t t_ = 0;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  Buffer norm_;
  std::vector<Param> params_;
};

void run_bench(const BenchOptions& o) {
  const comm::World world = bench::bench_world();
  const model::ModelConfig mc = transformer_config(o.shape);
  const std::vector<UnitSpec> units = model::model_units(mc);
  const config::Config cfg = engine_config(o, world.size);

  Zero3Trainer zero3(cfg, world, mc, units);
  PlainTrainer plain(world, mc, units, o.shape.micro_batch);

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
  // units are never gathered; their gradients are all-reduced (reported separately).
  const std::uint64_t expected = 3 * st.total_elems - 3 * st.persistent_elems;
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
      "zero3 bench engine: transformer d_model {}, d_ff {}, {} blocks, seq {}, micro-batch {}; {} params ({} "
      "persistent); world size {}; AdamW, clip {}, fp32, host device\n",
      mc.d_model, mc.d_ff, mc.layers, mc.seq_len, o.shape.micro_batch, st.total_elems, st.persistent_elems, world.size,
      kClip);
  if (world.size > 1) fmt::print("note: the plain trainer does not communicate; compare the times at world size 1\n");
  fmt::print("step time, median (range) of {} x {} steps:\n", o.repeats, o.steps);
  fmt::print("  {:<34} {:>26}  (loss {:.6f})\n", "plain (no zero3)", bench::median_and_range_ms(p), plain_loss);
  fmt::print("  {:<34} {:>26}  (loss {:.6f})\n", "zero3", bench::median_and_range_ms(z), zero3_loss);
  fmt::print("  {:<34} {:>10.3f}\n", "overhead ratio (zero3 / plain)", z_ms / p_ms);
  fmt::print("communication per step (elements):\n");
  fmt::print("  {:<34} {:>12}  (all-gather {}, reduce-scatter {})\n", "gathered + reduce-scattered", comm,
             st.last_step_all_gather_elems, st.last_step_reduce_scatter_elems);
  fmt::print("  {:<34} {:>12}  (3 x {} - 3 x {} persistent)\n", "expected", expected, st.total_elems,
             st.persistent_elems);
  fmt::print("  {:<34} {:>12}\n", "all-reduced (persistent grads)", st.last_step_all_reduce_elems);
  fmt::print("gathered peak: {} elements, param_gathered peak {} bytes\n", st.gathered_peak_elems, gathered.peak_bytes);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* group = app.add_subcommand("bench", "Benchmarks");
  group->require_subcommand(1);
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* engine = group->add_subcommand(
      "engine", "Step time of the transformer test model under the ZeRO-3 engine vs the same model without it");
  bench::add_json_flag(*engine, opt->json);
  bench::add_repeats_option(*engine, opt->repeats);
  bench::add_steps_option(*engine, opt->steps);
  add_model_shape_options(*engine, opt->shape, true);
  engine->callback([opt] { run_bench(*opt); });
  add_bench_cpu_optimizer_command(*group);
  add_bench_offload_command(*group);
  add_bench_train_command(*group);
  add_bench_checkpoint_command(*group);
}

}  // namespace zero3::tools
