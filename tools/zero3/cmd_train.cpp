// `zero3 train --config CONFIG.json [--steps N] [--metrics FILE] [--log-interval N] [--model.* ...]`: trains
// the GPT of the config's "zero3" block (runtime/include/zero3/models/gpt.hpp) through the ZeRO-3 engine on
// the data the block names (runtime/include/zero3/data/), launched with mpirun or as one process. Overrides
// patch the JSON's "zero3" block before it is parsed, so "auto" values follow them. Each rank reads its
// rank-strided share of every global batch (DistributedSampler: deterministic for a seed, resumable at any
// step); every log interval the held-out loss is measured and, for synthetic data, compared with the
// source's entropy rate: a held-out loss below that floor means the model sees what it should not (a future
// token), and the run stops with an error. Host compute (OpenBLAS) on the host device. SIGTERM or SIGUSR1
// stops every rank after the same step with a checkpoint (train/preemption.hpp; exit status 75); warnings
// and errors, a fatal one included, are events in <run dir>/events.jsonl and run zero3.alerts.command.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>

#include "commands.hpp"
#include "train_config.hpp"
#include "zero3/ckpt/save_dir_lock.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/cpus.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/memory_report.hpp"
#include "zero3/train/preemption.hpp"
#include "zero3/train/sinks.hpp"
#include "zero3/train/tensorboard.hpp"
#include "zero3/train/trainer.hpp"

namespace zero3::tools {
namespace {

using Json = nlohmann::json;

struct TrainOptions {
  TrainConfigOptions job;  // --config, --steps, --heldout-samples, the overrides
  std::optional<std::int64_t> log_interval;
  std::string metrics;
  std::string progress = "auto";  // the progress line: "auto" (stdout is a terminal), "on", "off"
  std::string save_dir;           // checkpoint root
  std::string run_dir;            // events.jsonl; default: save_dir, else ./zero3-run
  std::optional<std::int64_t> save_interval;
  std::string resume;               // a checkpoint directory, a root, or "latest" (of --save-dir)
  std::string save_mode = "async";  // "async" or "sync"
  std::int64_t save_staging_mb = 256;
  std::string memory_json;                 // the measured peaks per rank (rank 0 writes it)
  std::string profile_dir;                 // the trace, the plan and the measured peaks
  std::optional<double> device_memory_gb;  // the device memory per rank the plan must fit in
};

// The observers of a `zero3 train` run: log line, progress line, JSONL, csv_monitor, tensorboard, the floor
// check.
void add_observers(train::Trainer& trainer, const TrainOptions& o, const config::Config& cfg, int rank) {
  // Under mpirun a rank's stdout is a pseudo-terminal even when mpirun's output goes to a file: "auto" can
  // be fooled there, and --progress off turns the line off.
  if (o.progress == "on" || (o.progress == "auto" && isatty(STDOUT_FILENO) == 1)) {
    trainer.add_observer(std::make_shared<train::ProgressLine>(rank));
  }
  trainer.add_observer(std::make_shared<train::LogLine>(rank));
  if (!o.metrics.empty()) trainer.add_observer(std::make_shared<train::JsonlMetrics>(rank, o.metrics));
  trainer.add_observer(std::make_shared<train::CsvMonitor>(rank, cfg.csv_monitor, cfg.fp16.enabled));
  trainer.add_observer(std::make_shared<train::TensorBoardMonitor>(rank, cfg.tensorboard, cfg.fp16.enabled));
  trainer.add_observer(std::make_shared<train::EntropyFloorCheck>());
}

train::TrainerOptions trainer_options(const TrainOptions& o, const config::Config& cfg) {
  train::TrainerOptions t;
  t.steps = cfg.zero3.run->steps;
  t.log_interval = o.log_interval.value_or(cfg.steps_per_print.value_or(cfg.zero3.run->log_interval));
  t.save_dir = o.save_dir;
  t.save_interval = o.save_interval;
  t.resume = o.resume;
  t.checkpoint.async = o.save_mode == "async";
  t.checkpoint.staging_bytes = static_cast<std::size_t>(o.save_staging_mb) << 20;
  return t;
}

// The optimizer steps done, for the event of an error that ends the run.
struct LastStep final : train::TrainObserver {
  std::int64_t step = -1;
  void on_step(const train::StepEvent& e) override { step = e.step; }
};

std::filesystem::path run_dir_of(const TrainOptions& o) {
  if (!o.run_dir.empty()) return o.run_dir;
  return o.save_dir.empty() ? std::filesystem::path("zero3-run") : std::filesystem::path(o.save_dir);
}

void print_preempted(const train::Preemption& p, std::int64_t steps) {
  fmt::print("preempted: stopped on {} after step {} of {}; ", train::stop_reason_name(p.reason), p.step, steps);
  if (p.checkpoint) {
    fmt::print("checkpoint {} ({:.2f} s); continue with --resume latest\n", p.checkpoint->string(), p.save_s);
  } else {
    fmt::print("nothing saved (no --save-dir)\n");
  }
  std::fflush(stdout);
}

// The measured peaks of every rank, in the shape `zero3 mem plan --json` prints (train/memory_report.hpp).
void write_memory_json(const std::string& path, const std::vector<train::RankPeaks>& peaks) {
  std::ofstream out(path);
  out << train::peaks_json(peaks).dump(1) << '\n';
  if (!out)
    throw Error(fmt::format("--memory-json {}: cannot write: {}", path, std::generic_category().message(errno)));
}

// --profile DIR: every rank's trace (DIR/rank<r>.trace.json), merged by rank 0 into DIR/trace.json (one
// process per rank), and DIR/memory.json: the plan and the measured peaks, for `zero3 mem report DIR`.
void write_profile(const std::filesystem::path& dir, const comm::World& world, train::UnitTrainer& t,
                   const std::vector<train::RankPeaks>& peaks) {
  trace::stop();
  const auto part = [&](int r) { return dir / fmt::format("rank{}.trace.json", r); };
  trace::write_json(part(world.rank), world.rank, fmt::format("rank {}", world.rank));
  t.bootstrap()->barrier();
  if (world.rank != 0) return;
  std::vector<std::filesystem::path> parts;
  parts.reserve(static_cast<std::size_t>(world.size));
  for (int r = 0; r < world.size; ++r) parts.push_back(part(r));
  trace::merge_json(parts, dir / "trace.json");
  std::ofstream out(dir / "memory.json");
  out << nlohmann::json{{"plan", train::plan_json(t.memory_plan())}, {"measured", train::peaks_json(peaks)}}.dump(1)
      << '\n';
  if (!out) throw Error(fmt::format("--profile {}: cannot write memory.json", dir.string()));
}

// The job's shape as the ranks see it, printed by rank 0 at start-up: how many ranks, on how many nodes
// (the ranks the launcher made local rank 0), how many share rank 0's node, and where the launcher's world
// came from. A job launched on the wrong hosts or with the wrong --ntasks-per-node shows it here before it
// trains.
void log_job_shape(comm::Bootstrap& bootstrap, const comm::World& world) {
  const std::vector<std::int32_t> local_ranks = comm::all_gather_values<std::int32_t>(bootstrap, world.local_rank);
  const auto nodes = std::count(local_ranks.begin(), local_ranks.end(), 0);
  if (world.rank != 0) return;
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host = {'?'};
  log::info("job: {} rank(s) on {} node(s), {} on this node ({}); world from {}", world.size, nodes, world.local_size,
            host.data(), world.source);
}

void train_job(const TrainOptions& o, const comm::World& world, const std::shared_ptr<LastStep>& last_step) {
  const config::Config cfg = load_train_config(o.job, world.size, world.source);
  // MPI starts here rather than inside the trainer: the save directory is locked for this job before the
  // trainer (or anything else) writes into it, and every rank learns of a refusal together.
  const std::shared_ptr<comm::Bootstrap> bootstrap = comm::make_mpi_bootstrap(world);
  log_job_shape(*bootstrap, world);
  std::optional<ckpt::SaveDirLock> save_dir_lock;
  if (!o.save_dir.empty()) save_dir_lock = ckpt::lock_save_dir(*bootstrap, o.save_dir);
  if (!o.profile_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.profile_dir, ec);
    if (ec)
      throw ConfigError(fmt::format("--profile {}: cannot create the directory: {}", o.profile_dir, ec.message()));
    trace::start();
  }
  const config::AlertSettings& alerts = cfg.zero3.alerts;
  events::configure({.run_dir = run_dir_of(o),
                     .rank = world.rank,
                     .alert_command = alerts.command,
                     .alert_level = alerts.errors_only ? log::Level::error : log::Level::warning});
  const config::ModelSettings& ms = *cfg.zero3.model;
  train::TokenWindows data(cfg, world.rank, world.size,
                           {.context = ms.seq_len,
                            .predictions_per_window = models::predictions_per_window(ms),
                            .heldout_windows = o.job.heldout_samples.value_or(0)});
  // Compute threads: this rank's share of the CPUs it may run on (its CPU mask, which mpirun's or srun's
  // binding narrows), not of the machine.
  models::set_blas_threads(compute_threads(world.local_size));
  train::MemoryCheck check{
      .eval_batch = static_cast<int>((data.heldout_windows() + world.size - 1) / world.size),
      .len = static_cast<int>(ms.seq_len),
      .device_memory_bytes = std::nullopt,
      .checkpoint_staging_bytes = o.save_dir.empty() ? 0 : trainer_options(o, cfg).checkpoint.staging_bytes,
      .model_params = models::train_model_params(ms),
      .model_units = static_cast<std::uint64_t>(ms.layers) + 2};
  if (o.device_memory_gb) check.device_memory_bytes = static_cast<std::uint64_t>(*o.device_memory_gb * (1 << 30));
  train::UnitTrainer unit_trainer(
      cfg, world, bootstrap, [&](Device& device) { return models::make_train_model(ms, device); }, check);
  // After MPI start-up (make_mpi_bootstrap above), which may install handlers of its own; a signal before
  // this point ends the rank as it always did, with no step lost.
  train::clear_stop_request();
  train::StopSignals stop_signals({.rank = world.rank});
  // The engine and MPI shut down after this function returns: a stop signal then must still find the
  // handler (the run is complete; it exits 0 as the docs promise), not the default action.
  stop_signals.keep_until_exit();
  train::Trainer trainer(unit_trainer, data, trainer_options(o, cfg));
  // Rank 0 alone writes the metric files, so a directory it cannot create fails it alone: every rank learns
  // of it here, before the first collective of the loop, and all stop together instead of waiting for it.
  std::string observers_error;
  try {
    add_observers(trainer, o, cfg, world.rank);
  } catch (const ConfigError& e) {
    observers_error = e.what();
  }
  const std::vector<std::uint8_t> failed =
      comm::all_gather_values<std::uint8_t>(*unit_trainer.bootstrap(), observers_error.empty() ? 0 : 1);
  for (std::size_t r = 0; r < failed.size(); ++r) {
    if (failed[r] == 0) continue;
    throw ConfigError(!observers_error.empty() ? observers_error
                                               : fmt::format("rank {} could not open its metric outputs", r));
  }
  trainer.add_observer(last_step);
  if (world.rank == 0) {
    fmt::print("zero3 train: {}: {} params; {} ranks on {}; {}\n", unit_trainer.model().describe(),
               models::train_model_params(ms), world.size, device_kind_name(unit_trainer.engine().device().kind()),
               data.describe());
    if (data.entropy_floor())
      fmt::print("entropy floor (the data's entropy rate): {:.4f} nats/token\n", *data.entropy_floor());
    // The batch in force: zero3.accumulation's memory policy may have started at a smaller micro-batch.
    const config::BatchConfig& batch = unit_trainer.engine().config().batch;
    fmt::print("batch {} = micro {} x accumulation {} x {} ranks; {} steps\n", batch.train_batch_size,
               batch.train_micro_batch_size_per_gpu, batch.gradient_accumulation_steps, world.size,
               cfg.zero3.run->steps);
    std::fflush(stdout);
  }
  const train::TrainSummary s = trainer.run();
  const std::vector<train::RankPeaks> peaks = train::gather_peaks(
      *unit_trainer.bootstrap(), unit_trainer.engine().memory(), unit_trainer.resident_base_bytes());
  const std::string memory = train::peak_memory_table(peaks);
  if (world.rank == 0 && !o.memory_json.empty()) write_memory_json(o.memory_json, peaks);
  if (!o.profile_dir.empty()) write_profile(o.profile_dir, world, unit_trainer, peaks);
  if (s.preempted) {
    if (world.rank == 0) print_preempted(*s.preempted, s.steps);
    throw CLI::RuntimeError(train::kExitPreempted);
  }
  if (world.rank == 0) {
    fmt::print("done: {} steps in {:.1f} s; held-out loss {:.4f}", s.steps, s.wall_s, s.heldout_loss);
    if (s.entropy_floor) {
      fmt::print(", {:+.4f} nats/token above the entropy floor {:.4f}", s.heldout_loss - *s.entropy_floor,
                 *s.entropy_floor);
    }
    fmt::print("\npeak memory per rank by kind and category:\n{}", memory);
    if (cfg.memory_breakdown) {
      fmt::print("where rank 0's peaks were reached (memory_breakdown):\n{}",
                 train::peak_phase_lines(unit_trainer.engine().memory()));
    }
    std::fflush(stdout);
  }
}

// The top level of a run: the run directory is configured before anything can fail, and an error that
// ends the run is an event (its alert command gets a few seconds to finish). The event logs the error,
// so the exit status main() would give it (2 for a ConfigError, else 1) is thrown here as a CLI status.
void run_train(const TrainOptions& o) {
  events::configure({.run_dir = run_dir_of(o)});  // rank 0 until the world is read: start-up errors
  const auto last_step = std::make_shared<LastStep>();
  int rank = 0;
  try {
    const comm::World world = comm::World::from_environment();
    rank = world.rank;
    log::set_rank(world.rank, world.size);
    events::configure({.run_dir = run_dir_of(o), .rank = world.rank});
    train_job(o, world, last_step);
  } catch (const CLI::RuntimeError&) {
    throw;  // the preempted run's exit status
  } catch (const ckpt::SaveDirInUse& e) {
    // Not an event: the run directory may be the other job's save directory, and its events are its own.
    if (rank == 0) log::error("{}", e.what());
    throw CLI::RuntimeError(2);
  } catch (const std::exception& e) {
    const bool config_error = dynamic_cast<const ConfigError*>(&e) != nullptr;
    if (config_error && rank != 0) {
      log::error("{}", e.what());  // the same on every rank: one event (rank 0's) is enough
    } else {
      events::emit({.level = log::Level::error,
                    .kind = "train_failed",
                    .step = last_step->step,
                    .message = e.what(),
                    .fields = {{"error", config_error ? "config" : "runtime"}}});
      events::flush(std::chrono::seconds(5));
    }
    throw CLI::RuntimeError(config_error ? 2 : 1);
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto opt = std::make_shared<TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Train the model of a DeepSpeed config's \"zero3\" block (mpirun -np N)");
  add_train_config_options(*cmd, opt->job);
  cmd->add_option("--log-interval", opt->log_interval, "Steps between log lines (default: steps_per_print)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--metrics", opt->metrics, "Write one JSON object per logged step to this file (rank 0)");
  cmd->add_option("--progress", opt->progress, "Progress line between log lines: auto (stdout is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--save-dir", opt->save_dir, "Checkpoint root: saves DIR/global_step<N> (and at the end)");
  cmd->add_option("--run-dir", opt->run_dir,
                  "Where events.jsonl is written (created at the first event; default: --save-dir, else ./zero3-run)");
  cmd->add_option("--save-interval", opt->save_interval, "Save every N optimizer steps (with --save-dir)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--resume", opt->resume,
                  "Resume from a checkpoint directory, a checkpoint root (its latest), or 'latest' (of --save-dir)");
  cmd->add_option("--save-mode", opt->save_mode, "async: write in the background while training goes on; sync")
      ->check(CLI::IsMember({"async", "sync"}))
      ->capture_default_str();
  cmd->add_option("--save-staging-mb", opt->save_staging_mb, "Host staging memory of an async save, MiB per rank")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--memory-json", opt->memory_json,
                  "Write every rank's measured peak bytes by memory kind and category (the shape of zero3 mem plan "
                  "--json) to this file (rank 0)");
  cmd->add_option("--profile", opt->profile_dir,
                  "Record a timeline: DIR/trace.json (Chrome trace events, opens in Perfetto: a track per stream, "
                  "copies, CPU optimizer, checkpoint writer, the step's phases; memory counters; step markers) and "
                  "DIR/memory.json (plan and measured peaks); zero3 mem report DIR prints and plots them");
  cmd->add_option("--device-memory-gb", opt->device_memory_gb,
                  "Device memory per rank (GiB) the job's memory plan must fit in before anything is allocated; the "
                  "host backend then simulates a device of this size")
      ->check(CLI::PositiveNumber);
  cmd->callback([opt] { run_train(*opt); });
}

}  // namespace zero3::tools
