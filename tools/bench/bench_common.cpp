#include "bench_common.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "zero3/core/cpus.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/models/gpt.hpp"

namespace zero3::tools::bench {

void add_json_flag(CLI::App& cmd, bool& json) {
  cmd.add_flag("--json", json, "Print one JSON object instead of the table");
}

CLI::Option* add_count_option(CLI::App& cmd, const std::string& name, int& value, const std::string& help, int max) {
  return cmd.add_option(name, value, help)->capture_default_str()->check(CLI::Range(1, max));
}

CLI::Option* add_repeats_option(CLI::App& cmd, int& repeats, const std::string& help, int max) {
  return add_count_option(cmd, "--repeats", repeats, help, max);
}

CLI::Option* add_steps_option(CLI::App& cmd, int& steps, const std::string& help, int max) {
  return add_count_option(cmd, "--steps", steps, help, max);
}

comm::World bench_world() {
  const comm::World world = comm::World::from_environment();
  log::set_rank(world.rank, world.size);
  models::set_blas_threads(compute_threads(world.local_size));
  return world;
}

config::Config parse_builtin_config(const std::string& text, int world_size, std::string_view command) {
  config::ParseOptions options;
  options.world_size = world_size;
  options.world_size_source = "the job";
  options.source_name = std::string(command);
  return config::load_config_text_or_throw(text, options);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Spread spread(std::vector<double> samples) {
  if (samples.empty()) throw UsageError("bench::spread: no samples");
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  const double median = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  return {median, samples.front(), samples.back()};
}

std::string median_and_range_ms(const Spread& s) {
  return fmt::format("{:.2f} ms ({:.2f}-{:.2f})", s.median, s.min, s.max);
}

}  // namespace zero3::tools::bench
