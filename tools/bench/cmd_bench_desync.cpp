// `zero3-bench desync-guard`: the step time of the host GPT (bench_trainer.hpp) under the engine with the
// desync guard (zero3.comm.desync_check: one 16-byte all-reduce before every collective) next to the same
// engine without it, timed blocks alternating in one run, and the collectives per step that the guard
// doubles. Meant for `mpirun -np 2`; rank 0 reports. Host device, mpi communicator.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_trainer.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/comm/world.hpp"

namespace zero3::tools {
namespace {

struct DesyncBenchOptions {
  bool json = false;
  int repeats = 5;
  int steps = 5;
  ModelShape shape;
};

config::Config bench_config(const DesyncBenchOptions& o, int world_size, bool guard) {
  nlohmann::json z = nlohmann::json::parse(zero3_block(o.shape));
  z["comm"] = {{"desync_check", guard}};
  const std::string text = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.01}}}},
          "zero_optimization": {{"stage": 3}}, "zero3": {}}})",
      o.shape.micro_batch, z.dump());
  return bench::parse_builtin_config(text, world_size, "zero3-bench desync-guard");
}

void run(const DesyncBenchOptions& o) {
  const comm::World world = bench::bench_world();
  Zero3Trainer plain(bench_config(o, world.size, false), world, o.shape);
  Zero3Trainer guarded(bench_config(o, world.size, true), world, o.shape);
  std::int64_t plain_next = 0;
  std::int64_t guarded_next = 0;
  double plain_loss = plain.step(plain_next++);  // warm-up: trace recording, first touches
  double guarded_loss = guarded.step(guarded_next++);
  std::vector<double> plain_ms;
  std::vector<double> guarded_ms;
  const auto time_plain = [&] {
    plain_ms.push_back(bench::time_steps_ms(o.steps, plain_next, [&](std::int64_t s) { plain_loss = plain.step(s); }));
  };
  const auto time_guarded = [&] {
    guarded_ms.push_back(
        bench::time_steps_ms(o.steps, guarded_next, [&](std::int64_t s) { guarded_loss = guarded.step(s); }));
  };
  for (int r = 0; r < o.repeats; ++r) {  // ABBA: neither side always runs right after the other's block
    if (r % 2 == 0) {
      time_plain();
      time_guarded();
    } else {
      time_guarded();
      time_plain();
    }
  }
  // Collectives of the guarded engine's last step (its communicator is the second one made: lane mpi#2),
  // each of which the guard precedes with its 16-byte all-reduce.
  const nlohmann::json record = nlohmann::json::parse(comm::flight_record_json("bench", world.rank));
  std::int64_t last_step = -1;
  for (const auto& r : record["records"]) {
    if (r["lane"] == "mpi#2") last_step = std::max(last_step, r["step"].get<std::int64_t>());
  }
  int per_step = 0;
  for (const auto& r : record["records"]) per_step += r["lane"] == "mpi#2" && r["step"] == last_step ? 1 : 0;
  const bench::Spread p = bench::spread(plain_ms);
  const bench::Spread g = bench::spread(guarded_ms);
  const std::size_t units = plain.engine().unit_names().size();
  if (world.rank != 0) return;
  if (o.json) {
    fmt::print(
        "{{\"world_size\": {}, \"units\": {}, \"plain_step_ms\": {:.3f}, \"guarded_step_ms\": {:.3f}, "
        "\"guard_ms_per_step\": {:.3f}, \"collectives_per_step\": {}, \"repeats\": {}, \"steps\": {}, "
        "\"plain_loss\": {:.6f}, \"guarded_loss\": {:.6f}}}\n",
        world.size, units, p.median, g.median, g.median - p.median, per_step, o.repeats, o.steps, plain_loss,
        guarded_loss);
    return;
  }
  fmt::print("zero3-bench desync-guard: {}; {} units; world size {}; host device, mpi communicator\n",
             plain.model().describe(), units, world.size);
  fmt::print("step time, median (range) of {} x {} steps (blocks alternate):\n", o.repeats, o.steps);
  fmt::print("| {:<28} | {:>28} | {:>10} |\n", "desync guard", "step time", "loss");
  fmt::print("|{:-<30}|{:->30}|{:->12}|\n", "", "", "");
  fmt::print("| {:<28} | {:>28} | {:>10.6f} |\n", "off", bench::median_and_range_ms(p), plain_loss);
  fmt::print("| {:<28} | {:>28} | {:>10.6f} |\n", "on (zero3.comm.desync_check)", bench::median_and_range_ms(g),
             guarded_loss);
  fmt::print(
      "guard cost: {:+.3f} ms per step ({:+.1f} %) at median, {:+.3f} ms at the fastest block; {} collectives "
      "per step, each preceded by one 16-byte all-reduce; the losses must agree (the guard changes no data)\n",
      g.median - p.median, 100.0 * (g.median / p.median - 1.0), g.min - p.min, per_step);
}

}  // namespace

void add_bench_desync_command(CLI::App& app) {
  auto opt = std::make_shared<DesyncBenchOptions>();
  CLI::App* cmd =
      app.add_subcommand("desync-guard", "Step time of the host GPT with and without the desync guard (mpirun -np 2)");
  bench::add_json_flag(*cmd, opt->json);
  bench::add_repeats_option(*cmd, opt->repeats);
  bench::add_steps_option(*cmd, opt->steps);
  add_model_shape_options(*cmd, opt->shape, true);
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
