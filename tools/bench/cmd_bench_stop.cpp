// `zero3-bench stop-agreement [--steps N] [--repeats R] [--json]`: what a per-step stop agreement through the
// bootstrap (train::agree_on_stop: a 4-byte all-gather, train/preemption.hpp) would cost, next to a bootstrap
// barrier, in microseconds per call. Meant for `mpirun -np N`; rank 0 reports the median over the timed
// blocks and the range. The loop pays it only after a stop request (the request itself rides on the step's
// all-reduce, Engine::mark_stop_request).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/train/preemption.hpp"

namespace zero3::tools {
namespace {

struct StopBenchOptions {
  bool json = false;
  int steps = 2000;  // calls per timed block
  int repeats = 5;
};

template <typename Fn>
bench::Spread time_us_per_call(comm::Bootstrap& b, const StopBenchOptions& o, Fn&& call) {
  for (int i = 0; i < o.steps / 10 + 1; ++i) call();  // warm-up
  std::vector<double> us;
  for (int r = 0; r < o.repeats; ++r) {
    b.barrier();
    const bench::Clock::time_point t0 = bench::Clock::now();
    for (int i = 0; i < o.steps; ++i) call();
    us.push_back(bench::ms_since(t0) * 1e3 / o.steps);
  }
  return bench::spread(us);
}

void run(const StopBenchOptions& o) {
  const comm::World world = bench::bench_world();
  const std::shared_ptr<comm::Bootstrap> bootstrap = comm::make_mpi_bootstrap(world);
  train::clear_stop_request();
  int stops = 0;
  const bench::Spread agree =
      time_us_per_call(*bootstrap, o, [&] { stops += train::agree_on_stop(*bootstrap).stop ? 1 : 0; });
  const bench::Spread barrier = time_us_per_call(*bootstrap, o, [&] { bootstrap->barrier(); });
  if (stops != 0) throw Error("zero3-bench stop-agreement: a stop was agreed though none was requested");
  if (world.rank != 0) return;
  if (o.json) {
    fmt::print(R"({{"world_size": {}, "calls": {}, "agree_us": {:.3f}, "agree_us_min": {:.3f}, )"
               R"("agree_us_max": {:.3f}, "barrier_us": {:.3f}}})"
               "\n",
               world.size, o.steps, agree.median, agree.min, agree.max, barrier.median);
    return;
  }
  fmt::print("stop agreement at {} ranks, {} calls x {} blocks:\n", world.size, o.steps, o.repeats);
  fmt::print("  agree_on_stop (4-byte all-gather)  {:8.2f} us per step ({:.2f}-{:.2f})\n", agree.median, agree.min,
             agree.max);
  fmt::print("  bootstrap barrier, for reference   {:8.2f} us ({:.2f}-{:.2f})\n", barrier.median, barrier.min,
             barrier.max);
}

}  // namespace

void add_bench_stop_command(CLI::App& app) {
  auto opt = std::make_shared<StopBenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "stop-agreement", "Per-step cost of the ranks' agreement on a stop request (preemption), in microseconds");
  bench::add_json_flag(*cmd, opt->json);
  bench::add_steps_option(*cmd, opt->steps, "Calls per timed block", 10'000'000);
  bench::add_repeats_option(*cmd, opt->repeats, "Timed blocks; the median is reported", 1000);
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
