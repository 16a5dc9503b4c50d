// What the benchmarks of `zero3-bench` share: their common command-line options (--json, --repeats,
// --steps and the positive counts), the job's world, their built-in DeepSpeed configs, and the summary of
// repeated timings (median and range, or the best).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"

namespace zero3::tools::bench {

// ---- command line ------------------------------------------------------------------------------------

// --json: one JSON object (or document) on stdout instead of the table.
void add_json_flag(CLI::App& cmd, bool& json);
// A count option in [1, max], its default shown in --help.
CLI::Option* add_count_option(CLI::App& cmd, const std::string& name, int& value, const std::string& help,
                              int max = 1'000'000);
// --repeats and --steps with the wording the benchmarks share; `help` replaces it where given.
CLI::Option* add_repeats_option(CLI::App& cmd, int& repeats,
                                const std::string& help = "Timed blocks per trainer; the median is reported",
                                int max = 1'000'000);
CLI::Option* add_steps_option(CLI::App& cmd, int& steps, const std::string& help = "Optimizer steps per timed block",
                              int max = 1'000'000);

// ---- the job -----------------------------------------------------------------------------------------

// The job's world (comm::World::from_environment: one rank without mpirun), with the log's rank prefix set
// and OpenBLAS's threads (the host models' matrix products) this rank's share of the node's cores, as
// `zero3 train` sets them.
comm::World bench_world();

// A benchmark's built-in DeepSpeed config, parsed for the job's world size (ConfigError listing the problems
// when it is not runnable: a bug in the benchmark, not user input).
config::Config parse_builtin_config(const std::string& text, int world_size, std::string_view command);

// ---- timings -----------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);
double ms_since(Clock::time_point t0);

// Repeated measurements of one quantity.
struct Spread {
  double median = 0.0;
  double min = 0.0;  // the best, for times
  double max = 0.0;
};
// UsageError for no samples.
Spread spread(std::vector<double> samples);
// "12.34 ms (11.90-13.02)": the median and the range, for a table.
std::string median_and_range_ms(const Spread& s);

// Calls step(next++) `steps` times; returns the mean milliseconds per call.
template <typename Fn>
double time_steps_ms(int steps, std::int64_t& next, Fn&& step) {
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step(next++);
  return ms_since(t0) / steps;
}

}  // namespace zero3::tools::bench
