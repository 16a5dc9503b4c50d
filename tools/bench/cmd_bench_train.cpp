// `zero3-bench train [--config F] [--world-sizes 1,2] [--json]`: tokens/s and the step-time split of a
// `zero3 train` job (configs/gpt-small.json by default) at each world size, without and with CPU offload of
// the optimizer, side by side. Each cell is a real `zero3 train` run of the `zero3` program beside this one
// (or --zero3), started as a child process (under mpirun for more than one rank) with wall_clock_breakdown
// on; its --metrics lines give the figures. The first `--steps` steps of a run are its warm-up (trace
// recording, first touches of memory, OpenBLAS's thread start); the next `--steps` are measured. Run it as
// one process, not under mpirun: it launches the ranks itself.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "zero3/core/error.hpp"

namespace zero3::tools {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

struct TrainBenchOptions {
  std::string config = "configs/gpt-small.json";
  std::vector<int> world_sizes{1, 2};
  int steps = 3;
  bool json = false;
  std::string mpirun = "mpirun";
  std::string zero3;   // the zero3 program; "" is the one in this program's directory
  std::string device;  // "" keeps the config's zero3.device
  bool keep = false;   // keep the runs' configs, metrics and logs
};

struct Cell {
  int world_size = 1;
  bool offload = false;
  double tokens_per_s = 0.0;
  Json time_ms;
  double loss = 0.0;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail(const std::string& text, std::size_t lines) {
  std::size_t at = text.size();
  for (std::size_t n = 0; n <= lines && at != std::string::npos && at > 0; ++n) at = text.rfind('\n', at - 1);
  return at == std::string::npos ? text : text.substr(at + 1);
}

// Runs argv with stdout and stderr into `log`; returns the exit status (128 + signal when killed).
int run_process(const std::vector<std::string>& argv, const fs::path& log) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("zero3-bench train: fork: {}", std::generic_category().message(errno)));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::generic_category().message(errno).c_str());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      throw Error(fmt::format("zero3-bench train: waitpid: {}", std::generic_category().message(errno)));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Cell run_cell(const TrainBenchOptions& o, const Json& base, const fs::path& dir, int world_size, bool offload) {
  Json cfg = base;
  cfg["wall_clock_breakdown"] = true;
  Json& zero = cfg["zero_optimization"];
  zero.erase("offload_optimizer");
  zero.erase("offload_param");
  if (offload) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (!o.device.empty()) cfg["zero3"]["device"] = o.device;
  const std::string name = fmt::format("ws{}-{}", world_size, offload ? "offload" : "ondevice");
  const fs::path config = dir / (name + ".json");
  const fs::path metrics = dir / (name + ".jsonl");
  const fs::path log = dir / (name + ".log");
  std::ofstream(config) << cfg.dump(2) << '\n';

  std::vector<std::string> argv;
  if (world_size > 1) {
    argv = {o.mpirun,
            "-np",
            std::to_string(world_size),
            "--oversubscribe",
            "--bind-to",
            "none",
            "--mca",
            "mpi_yield_when_idle",
            "1"};
    if (geteuid() == 0) argv.emplace_back("--allow-run-as-root");
  }
  for (const std::string& a :
       {o.zero3, std::string("train"), std::string("--config"), config.string(), std::string("--steps"),
        std::to_string(2 * o.steps), std::string("--log-interval"), std::to_string(o.steps),
        std::string("--heldout-samples"), std::string("1"), std::string("--progress"), std::string("off"),
        std::string("--metrics"), metrics.string()}) {
    argv.push_back(a);
  }
  const int rc = run_process(argv, log);
  if (rc != 0) {
    throw Error(fmt::format("zero3-bench train: the {} run exited with status {} ({}); its log ({}) ends:\n{}", name,
                            rc, fmt::join(argv, " "), log.string(), tail(read_text(log), 15)));
  }
  std::vector<Json> lines;
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(Json::parse(line));
  }
  if (lines.size() < 2 || !lines.back().contains("time_ms")) {
    throw Error(fmt::format("zero3-bench train: the {} run wrote {} metrics line(s) to {}, expected 2 with time_ms",
                            name, lines.size(), metrics.string()));
  }
  const Json& m = lines.back();  // the measured half of the run
  return {world_size, offload, m.at("tokens_per_s").get<double>(), m.at("time_ms"), m.at("loss").get<double>()};
}

// The zero3 program the runs start: --zero3, else `zero3` in the directory of this program (both are built
// into the build tree's bin/). UsageError when it is not an executable file.
std::string zero3_program(const std::string& option) {
  const fs::path path = option.empty() ? fs::read_symlink("/proc/self/exe").parent_path() / "zero3" : fs::path(option);
  if (!fs::is_regular_file(path) || access(path.c_str(), X_OK) != 0) {
    throw UsageError(fmt::format(
        "zero3-bench train: {} is not an executable zero3 program (build the zero3 target, or pass --zero3)",
        path.string()));
  }
  return path.string();
}

void run(TrainBenchOptions o) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read before any thread starts
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_RANK") != nullptr) {
    throw UsageError("zero3-bench train: run it as one process (not under mpirun): it starts the ranks itself");
  }
  o.zero3 = zero3_program(o.zero3);
  std::ifstream in(o.config);
  if (!in)
    throw ConfigError(fmt::format("--config {}: cannot read: {}", o.config, std::generic_category().message(errno)));
  Json base;
  try {
    base = Json::parse(in);
  } catch (const Json::exception& e) {
    throw ConfigError(fmt::format("--config {}: not valid JSON: {}", o.config, e.what()));
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("zero3-bench-train-{}", getpid());
  fs::create_directories(dir);
  std::vector<Cell> cells;
  try {
    for (const int ws : o.world_sizes) {
      for (const bool offload : {false, true}) {
        if (!o.json) {
          fmt::print(stderr, "zero3-bench train: world size {}, {} ...\n", ws, offload ? "offload" : "on device");
        }
        cells.push_back(run_cell(o, base, dir, ws, offload));
      }
    }
  } catch (...) {
    if (!o.keep) fs::remove_all(dir);
    throw;
  }
  if (!o.keep) fs::remove_all(dir);

  const double reference = cells.front().tokens_per_s;
  const auto t = [](const Cell& c, const char* k) { return c.time_ms.value(k, 0.0); };
  if (o.json) {
    Json out = {{"benchmark", "train"}, {"config", o.config}, {"measured_steps", o.steps}};
    for (const Cell& c : cells) {
      out["results"].push_back({{"world_size", c.world_size},
                                {"offload_optimizer", c.offload},
                                {"tokens_per_s", c.tokens_per_s},
                                {"vs_first", c.tokens_per_s / reference},
                                {"train_loss", c.loss},
                                {"time_ms", c.time_ms}});
    }
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("zero3-bench train: {} ({} measured steps after {} warm-up steps per run; ms per step, rank 0)\n",
             o.config, o.steps, o.steps);
  fmt::print(
      "| ranks | optimizer | tokens/s | vs first | step ms | forward | backward | step() | optimizer | gather wait | "
      "reduce wait | copies exposed |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Cell& c : cells) {
    fmt::print(
        "| {} | {} | {:.0f} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n",
        c.world_size, c.offload ? "CPU offload" : "on device", c.tokens_per_s, c.tokens_per_s / reference,
        t(c, "total"), t(c, "forward"), t(c, "backward"), t(c, "step"), t(c, "optimizer"), t(c, "gather_wait"),
        t(c, "reduce_wait"), t(c, "copies_exposed"));
  }
}

}  // namespace

void add_bench_train_command(CLI::App& app) {
  auto opt = std::make_shared<TrainBenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "train", "tokens/s and step-time split of a zero3 train job at each world size, with and without CPU offload");
  cmd->add_option("--config", opt->config, "The job (a zero3 train config)")->capture_default_str();
  cmd->add_option("--world-sizes", opt->world_sizes, "Ranks of each run (local, through --mpirun above 1)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench::add_steps_option(*cmd, opt->steps, "Warm-up steps, then as many measured steps, per run", 100000);
  cmd->add_option("--device", opt->device, "Override zero3.device (host, cuda, auto)");
  cmd->add_option("--mpirun", opt->mpirun, "Open MPI launcher for runs of more than one rank")->capture_default_str();
  cmd->add_option("--zero3", opt->zero3, "The zero3 program that runs the jobs (default: the one beside zero3-bench)");
  bench::add_json_flag(*cmd, opt->json);
  cmd->add_flag("--keep", opt->keep, "Keep the runs' configs, metrics and logs (in the temporary directory)");
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
