// `zero3-bench offload`: the step time of the host GPT (bench_trainer.hpp) under the engine with CPU offload of
// the optimizer (and optionally of the params) next to the same engine without offload, alternating timed
// blocks in one run, plus where the offloaded step's traffic went: bytes each way, the time the
// host<->device copies ran and the share of it hidden behind other work (compute-stream work, the CPU
// optimizer, gradient accumulation), from timestamps taken in stream order (wall_clock_breakdown), and the
// device memory the offload freed. Meant for `mpirun -np 2`; rank 0 reports. Host device.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_trainer.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::tools {
namespace {

struct OffloadBenchOptions {
  bool json = false;
  bool offload_param = false;
  int repeats = 3;
  int steps = 3;
  ModelShape shape;
  std::int64_t sub_group_size = 1'000'000;
};

config::Config bench_config(const OffloadBenchOptions& o, int world_size, bool offload) {
  std::string zero = R"("stage": 3, "stage3_max_reuse_distance": 0)";
  zero += fmt::format(R"(, "sub_group_size": {})", o.sub_group_size);
  if (offload) {
    zero += R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})";
    if (o.offload_param) zero += R"(, "offload_param": {"device": "cpu", "pin_memory": true})";
  }
  const std::string text = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "wall_clock_breakdown": {},
          "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.01}}}},
          "zero_optimization": {{{}}}, "zero3": {}}})",
      o.shape.micro_batch, offload ? "true" : "false", zero, zero3_block(o.shape));
  return bench::parse_builtin_config(text, world_size, "zero3-bench offload");
}

std::uint64_t device_state_bytes(Engine& e) {
  std::uint64_t b = 0;
  for (const MemCategory c :
       {MemCategory::master, MemCategory::optim_state, MemCategory::grad_shard, MemCategory::param_shard}) {
    b += e.memory().get(MemoryKind::device, c).current_bytes;
  }
  return b;
}

void run(const OffloadBenchOptions& o) {
  const comm::World world = bench::bench_world();
  Zero3Trainer on_device(bench_config(o, world.size, false), world, o.shape);
  Zero3Trainer offloaded(bench_config(o, world.size, true), world, o.shape);

  std::int64_t dev_next = 0;
  std::int64_t off_next = 0;
  double dev_loss = on_device.step(dev_next++);
  double off_loss = offloaded.step(off_next++);
  OffloadTimes total;
  int windows = 0;
  std::vector<double> dev_ms;
  std::vector<double> off_ms;
  const auto timed = [&](Zero3Trainer& t, std::int64_t& next, double& loss, bool count) {
    return bench::time_steps_ms(o.steps, next, [&](std::int64_t s) {
      loss = t.step(s);
      if (count) {
        const OffloadTimes s = t.engine().stats().last_step_offload;
        total.d2h_bytes += s.d2h_bytes;
        total.h2d_bytes += s.h2d_bytes;
        total.d2h_ms += s.d2h_ms;
        total.h2d_ms += s.h2d_ms;
        total.copies_hidden_ms += s.copies_hidden_ms;
        total.cpu_ms += s.cpu_ms;
        ++windows;
      }
    });
  };
  for (int r = 0; r < o.repeats; ++r) {
    dev_ms.push_back(timed(on_device, dev_next, dev_loss, false));
    off_ms.push_back(timed(offloaded, off_next, off_loss, true));
  }
  const bench::Spread dev = bench::spread(dev_ms);
  const bench::Spread off = bench::spread(off_ms);
  const double d = dev.median;
  const double f = off.median;
  const double copy_ms = total.d2h_ms + total.h2d_ms;
  const double hidden = copy_ms > 0.0 ? total.copies_hidden_ms / copy_ms : 0.0;
  const std::uint64_t dev_bytes = device_state_bytes(on_device.engine());
  const std::uint64_t off_bytes = device_state_bytes(offloaded.engine());
  const EngineStats st = offloaded.engine().stats();
  if (world.rank != 0) return;
  const double per = windows > 0 ? 1.0 / windows : 0.0;
  if (o.json) {
    fmt::print(
        "{{\"world_size\": {}, \"params\": {}, \"on_device_step_ms\": {:.3f}, \"offload_step_ms\": {:.3f}, "
        "\"offload_over_on_device\": {:.4f}, \"d2h_bytes_per_step\": {}, \"h2d_bytes_per_step\": {}, "
        "\"d2h_ms_per_step\": {:.3f}, \"h2d_ms_per_step\": {:.3f}, \"copies_hidden_share\": {:.4f}, "
        "\"cpu_ms_per_step\": {:.3f}, \"device_state_bytes_on_device\": {}, \"device_state_bytes_offload\": {}, "
        "\"offload_param\": {}, \"repeats\": {}, \"steps\": {}, \"on_device_loss\": {:.6f}, \"offload_loss\": "
        "{:.6f}}}\n",
        world.size, st.total_elems, d, f, f / d, static_cast<double>(total.d2h_bytes) * per,
        static_cast<double>(total.h2d_bytes) * per, total.d2h_ms * per, total.h2d_ms * per, hidden, total.cpu_ms * per,
        dev_bytes, off_bytes, o.offload_param, o.repeats, o.steps, dev_loss, off_loss);
    return;
  }
  fmt::print(
      "zero3-bench offload: {}; {} params; world size {}; AdamW fp32, host device; "
      "offload_optimizer cpu (pinned){}\n",
      offloaded.model().describe(), st.total_elems, world.size, o.offload_param ? " + offload_param cpu" : "");
  fmt::print("step time, median (range) of {} x {} steps (blocks alternate):\n", o.repeats, o.steps);
  fmt::print("  {:<40} {:>26}  (loss {:.6f})\n", "on device", bench::median_and_range_ms(dev), dev_loss);
  fmt::print("  {:<40} {:>26}  (loss {:.6f})\n", "CPU offload", bench::median_and_range_ms(off), off_loss);
  fmt::print("  {:<40} {:>10.3f}\n", "offload / on device", f / d);
  fmt::print("offloaded step, per step (mean of {} steps):\n", windows);
  fmt::print("  {:<40} {:>10.0f} bytes, {:.3f} ms\n", "device -> host (gradients)",
             static_cast<double>(total.d2h_bytes) * per, total.d2h_ms * per);
  fmt::print("  {:<40} {:>10.0f} bytes, {:.3f} ms\n", "host -> device (params)",
             static_cast<double>(total.h2d_bytes) * per, total.h2d_ms * per);
  fmt::print("  {:<40} {:>10.1f} %\n", "copy time hidden behind other work", 100.0 * hidden);
  fmt::print("  {:<40} {:>10.3f} ms\n", "CPU work (accumulate + optimizer)", total.cpu_ms * per);
  fmt::print("device memory of shards, master, moments, accumulators: {} bytes on device, {} bytes with offload\n",
             dev_bytes, off_bytes);
}

}  // namespace

void add_bench_offload_command(CLI::App& app) {
  auto opt = std::make_shared<OffloadBenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "offload", "Step time of the host GPT with and without CPU offload, and how much of the copying is hidden");
  bench::add_json_flag(*cmd, opt->json);
  cmd->add_flag("--offload-param", opt->offload_param, "Offload the param shards too (offload_param cpu)");
  bench::add_repeats_option(*cmd, opt->repeats);
  bench::add_steps_option(*cmd, opt->steps);
  add_model_shape_options(*cmd, opt->shape, true);
  cmd->add_option("--sub-group-size", opt->sub_group_size, "zero_optimization.sub_group_size (elements)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1'000'000'000'000}));
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
