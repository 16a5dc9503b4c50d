// `zero3 config check FILE [--world-size N] [--quiet] [--strict]`: validates a DeepSpeed JSON config the way zero3 will
// run it. Exit 0: valid and runnable (the resolved config goes to stdout); 1: valid but asks for features
// zero3 does not implement (still printed); 2: invalid (error lines on stderr, nothing on stdout). --strict lints.
// `zero3 config keys [--block B] [--markdown]`: the table of every key zero3 knows.
// `zero3 config lr-schedule FILE --steps N [--json] [--world-size N]`: the lr each optimizer step 1..N applies
// with no skipped step, as DeepSpeed's scheduler gives it. Exit 0: printed; 1: the config's optimizer or
// scheduler is not implemented by zero3 (nothing printed); 2: invalid, with the same output as `check`.
#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "zero3/config/key_table.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/config/schema.hpp"
#include "zero3/optim/lr_schedule.hpp"

namespace zero3::tools {
namespace {

struct CheckArgs {
  std::string file;
  int world_size = 0;  // 0: not given
  bool quiet = false;
  bool strict = false;
};

struct LrScheduleArgs {
  std::string file;
  std::int64_t steps = 0;
  int world_size = 0;  // 0: not given
  bool json = false;
};

struct KeysArgs {
  std::string block;
  bool markdown = false;
};

constexpr int kExitValid = 0;
constexpr int kExitNotImplemented = 1;
constexpr int kExitInvalid = 2;

// --world-size, else the launcher's environment (Open MPI, then torchrun-style WORLD_SIZE), else 1.
bool choose_world_size(int world_size, config::ParseOptions& opts) {
  if (world_size > 0) {
    opts.world_size = world_size;
    opts.world_size_source = "--world-size";
    return true;
  }
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"}) {
    const char* value = std::getenv(var);  // NOLINT(concurrency-mt-unsafe): read before any thread starts
    if (value == nullptr || *value == '\0') continue;
    const std::string_view text(value);
    int n = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size() || n < 1) {
      std::cerr << fmt::format("error: {}: world size from the environment is not a positive integer: \"{}\"\n", var,
                               text);
      return false;
    }
    opts.world_size = n;
    opts.world_size_source = var;
    return true;
  }
  opts.world_size_source = "default (no --world-size, OMPI_COMM_WORLD_SIZE or WORLD_SIZE)";
  return true;
}

// Parses `file` as `check` does and prints its errors and (unless quiet) warnings on stderr. Returns
// kExitInvalid, after the summary line, when the config is invalid; otherwise kExitValid.
int parse_reporting(const std::string& file, int world_size, bool quiet, config::ParseResult& result,
                    bool strict = false) {
  config::ParseOptions opts;
  opts.strict = strict;
  if (!choose_world_size(world_size, opts)) return kExitInvalid;
  result = config::parse_config_file(file, opts);
  for (const auto& e : result.errors) std::cerr << config::format_diagnostic("error", e) << '\n';
  if (!quiet) {
    for (const auto& w : result.warnings) std::cerr << config::format_diagnostic("warning", w) << '\n';
  }
  if (!result.ok()) {
    std::cerr << fmt::format("{}: invalid ({} error{})\n", file, result.errors.size(),
                             result.errors.size() == 1 ? "" : "s");
    return kExitInvalid;
  }
  return kExitValid;
}

int run_check(const CheckArgs& args) {
  config::ParseResult result;
  if (parse_reporting(args.file, args.world_size, args.quiet, result, args.strict) != kExitValid) return kExitInvalid;
  if (!args.quiet) {
    for (const auto& r : result.resolved) std::cerr << config::format_resolution(r) << '\n';
  }
  for (const auto& n : result.not_implemented) std::cerr << config::format_diagnostic("not implemented", n) << '\n';
  std::cout << config::to_json(*result.config) << '\n';
  const auto& batch = result.config->batch;
  const bool by_default = batch.world_size_source.rfind("default", 0) == 0;
  const std::string world =
      fmt::format("world size {} ({}{})", batch.world_size, by_default ? "" : "from ", batch.world_size_source);
  if (!result.not_implemented.empty()) {
    std::cerr << fmt::format("{}: valid, but not runnable by zero3 at {}: {} feature{} not implemented\n", args.file,
                             world, result.not_implemented.size(), result.not_implemented.size() == 1 ? "" : "s");
    return kExitNotImplemented;
  }
  std::cerr << fmt::format("{}: valid and runnable at {}\n", args.file, world);
  return kExitValid;
}

int run_lr_schedule(const LrScheduleArgs& args) {
  config::ParseResult result;
  if (parse_reporting(args.file, args.world_size, /*quiet=*/false, result) != kExitValid) return kExitInvalid;
  // Other unimplemented features do not change the lr; an unimplemented optimizer or scheduler leaves
  // nothing to compute it from (the Config then has no optimizer, or no scheduler although the file has one).
  bool computable = true;
  for (const auto& n : result.not_implemented) {
    if (n.path == "optimizer" || n.path == "optimizer.type" || n.path == "scheduler.type") {
      std::cerr << config::format_diagnostic("not implemented", n) << '\n';
      computable = false;
    }
  }
  if (!computable) {
    std::cerr << fmt::format("{}: zero3 cannot compute this learning-rate schedule\n", args.file);
    return kExitNotImplemented;
  }
  config::resolve_run_length(*result.config, args.steps);  // "auto" total_num_steps: the previewed run's length
  const std::vector<double> lrs = optim::preview_lr(*result.config, args.steps);
  // fmt's default for a double is the shortest text that reads back to the same value (as Python prints).
  std::string out = args.json ? "{\"lr\": [" : "";
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    if (args.json) {
      out += fmt::format("{}{}", i == 0 ? "" : ", ", lrs[i]);
    } else {
      out += fmt::format("{} {}\n", i + 1, lrs[i]);
    }
  }
  if (args.json) out += "]}\n";
  std::cout << out;
  return kExitValid;
}

void run_keys(const KeysArgs& args) {
  if (args.markdown) {
    std::cout << config::key_table_markdown(args.block);
    return;
  }
  std::string_view last_block = "\x01";
  for (const auto& k : config::known_keys()) {
    if (!args.block.empty() && k.block != args.block) continue;
    if (k.block != last_block) {
      std::cout << fmt::format("\n[{}]  {}\n", k.block.empty() ? "top level" : k.block,
                               config::block_rule_line(k.block));
    }
    std::string line = fmt::format("  {:<42} {:<28} {}", k.key, config::to_string(k.support), k.note);
    line.erase(line.find_last_not_of(' ') + 1);
    std::cout << line << '\n';
    last_block = k.block;
  }
}

}  // namespace

void add_config_command(CLI::App& app) {
  CLI::App* config =
      app.add_subcommand("config", "Check DeepSpeed JSON configs, list the keys zero3 knows, preview the lr schedule");
  config->require_subcommand(1);

  auto check_args = std::make_shared<CheckArgs>();
  CLI::App* check = config->add_subcommand(
      "check", "Validate a config; exit 0 valid, 1 valid but not implemented by zero3, 2 invalid");
  check->add_option("file", check_args->file, "DeepSpeed JSON config")->required();
  check
      ->add_option("--world-size", check_args->world_size,
                   "Data-parallel ranks for the batch rule (default: OMPI_COMM_WORLD_SIZE, WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  check->add_flag("-q,--quiet", check_args->quiet, "Print only errors and not-implemented features on stderr");
  check->add_flag("--strict", check_args->strict,
                  "Lint: keys DeepSpeed would ignore, hjson syntax and converted values are errors (as zero3.strict)");
  check->callback([check_args] {
    const int code = run_check(*check_args);
    if (code != kExitValid) throw CLI::RuntimeError(code);
  });

  auto lr_args = std::make_shared<LrScheduleArgs>();
  CLI::App* lr = config->add_subcommand(
      "lr-schedule",
      "Print the lr each optimizer step 1..N applies (no skipped steps), as DeepSpeed's scheduler sets it");
  lr->add_option("file", lr_args->file, "DeepSpeed JSON config")->required();
  lr->add_option("--steps", lr_args->steps, "Optimizer steps to print")->required()->check(CLI::PositiveNumber);
  lr->add_flag("--json", lr_args->json, "Print {\"lr\": [lr_1, ..., lr_N]} instead of \"step lr\" lines");
  lr->add_option("--world-size", lr_args->world_size, "Data-parallel ranks for the batch rule, as for check")
      ->check(CLI::PositiveNumber);
  lr->callback([lr_args] {
    const int code = run_lr_schedule(*lr_args);
    if (code != kExitValid) throw CLI::RuntimeError(code);
  });

  auto keys_args = std::make_shared<KeysArgs>();
  CLI::App* keys = config->add_subcommand("keys", "Print every key zero3 knows and what it does with it");
  keys->add_option("--block", keys_args->block, "Only this block, e.g. zero_optimization.offload_optimizer");
  keys->add_flag("--markdown", keys_args->markdown,
                 "Markdown tables (configs/README.md holds them: tools/gen-config-keys.sh)");
  keys->callback([keys_args] { run_keys(*keys_args); });
}

}  // namespace zero3::tools
