// `zero3 train --config CONFIG.json [--steps N] [--metrics FILE] [--log-interval N] [--model.* ...]`: trains
// the GPT of the config's "zero3" block (runtime/include/zero3/models/gpt.hpp) through the ZeRO-3 engine on
// the data the block names (runtime/include/zero3/data/), launched with mpirun or as one process. Overrides
// patch the JSON's "zero3" block before it is parsed, so "auto" values follow them. Each rank reads its
// rank-strided share of every global batch (DistributedSampler: deterministic for a seed, resumable at any
// step); every log interval the held-out loss is measured and, for synthetic data, compared with the
// source's entropy rate: a held-out loss below that floor means the model sees what it should not (a future
// token), and the run stops with an error. Host compute (OpenBLAS) on the host device.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "train_model.hpp"
#include "unit_trainer.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/data/sampler.hpp"
#include "zero3/data/token_source.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/models/gpt.hpp"

namespace zero3::tools {
namespace {

using Json = nlohmann::json;

// Predicted tokens in a held-out measurement by default: its standard error is then ~0.02 nats, well
// inside the 0.05 margin of the entropy-floor check.
constexpr std::int64_t kHeldoutTokens = 4096;

struct TrainOptions {
  std::string config;
  std::optional<std::int64_t> steps;
  std::optional<std::int64_t> log_interval;
  std::string metrics;
  // "--model.layers 4" and the like: key path under "zero3" -> JSON value text.
  std::map<std::string, std::string> overrides;
  std::string progress = "auto";  // the progress line: "auto" (stdout is a terminal), "on", "off"
  std::string save_dir;           // checkpoint root
  std::optional<std::int64_t> save_interval;
  std::string resume;               // a checkpoint directory, a root, or "latest" (of --save-dir)
  std::string save_mode = "async";  // "async" or "sync"
  std::int64_t save_staging_mb = 256;
  // Held-out windows per measurement; default: enough for 4096 predicted tokens (128 GPT windows of 32).
  std::optional<std::int64_t> heldout_samples;
};

// The config file with the overrides written into its "zero3" block.
std::string patched_config(const TrainOptions& o) {
  std::ifstream in(o.config);
  if (!in)
    throw ConfigError(fmt::format("{}: cannot read the config: {}", o.config, std::generic_category().message(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (o.overrides.empty() && !o.steps) return text.str();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", o.config, e.what()));
  }
  if (!j.is_object()) throw ConfigError(fmt::format("{}: the config must be a JSON object", o.config));
  Json& z = j["zero3"];
  for (const auto& [path, value] : o.overrides) {
    Json* at = &z;
    std::string_view rest = path;
    for (std::size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      at = &(*at)[std::string(rest.substr(0, dot))];
      rest.remove_prefix(dot + 1);
    }
    Json v;
    try {
      v = Json::parse(value);
    } catch (const Json::exception&) {
      v = value;  // a bare string, e.g. --data.source tokens:/data/x.bin
    }
    (*at)[std::string(rest)] = v;
  }
  if (o.steps) z["run"]["steps"] = *o.steps;
  return j.dump();
}

// DeepSpeed's csv_monitor layout: <output_path>/<job_name>/<event name with '/' -> '_'>.csv, each with a
// "step,<last part of the name>" header and one "step,value" row per event; the step is the count of
// training samples so far (DeepSpeed's global_samples). Rank 0 only.
class CsvMonitor {
 public:
  explicit CsvMonitor(const config::MonitorConfig& c) : enabled_(c.enabled) {
    if (!enabled_) return;
    const std::filesystem::path base =
        c.output_path.empty() ? std::filesystem::current_path() : std::filesystem::path(c.output_path);
    dir_ = base / c.job_name;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec)
      throw ConfigError(fmt::format("csv_monitor.output_path: cannot create {}: {}", dir_.string(), ec.message()));
  }
  void write(const std::string& name, double value, std::int64_t samples) {
    if (!enabled_) return;
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '_');
    std::replace(file.begin(), file.end(), ' ', '_');
    const std::filesystem::path path = dir_ / (file + ".csv");
    const bool fresh = !started_.contains(file);
    std::ofstream out(path, fresh ? std::ios::trunc : std::ios::app);
    if (!out) throw Error(fmt::format("csv_monitor: cannot write {}", path.string()));
    if (fresh) out << "step," << name.substr(name.rfind('/') + 1) << '\n';
    out << samples << ',' << fmt::format("{}", value) << '\n';
    started_.insert(file);
  }

 private:
  bool enabled_;
  std::filesystem::path dir_;
  std::set<std::string> started_;
};

double sum_over_ranks(comm::Bootstrap& b, double v) {
  std::vector<std::byte> mine(sizeof v);
  std::memcpy(mine.data(), &v, sizeof v);
  const std::vector<std::byte> all = b.all_gather(mine);
  double sum = 0.0;
  for (std::size_t off = 0; off < all.size(); off += sizeof v) {
    double x = 0.0;
    std::memcpy(&x, all.data() + off, sizeof x);
    sum += x;
  }
  return sum;
}

// Peak bytes per (memory kind, category) and per kind's total on every rank, as a table on rank 0 (one
// column per rank, MiB). Collective.
std::string peak_memory_table(comm::Bootstrap& b, const MemoryTracker& m) {
  std::vector<std::uint64_t> mine;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c)
      mine.push_back(m.get(static_cast<MemoryKind>(k), static_cast<MemCategory>(c)).peak_bytes);
    mine.push_back(m.total(static_cast<MemoryKind>(k)).peak_bytes);
  }
  std::vector<std::byte> bytes(mine.size() * sizeof(std::uint64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const std::vector<std::byte> all = b.all_gather(bytes);
  const std::size_t ranks = all.size() / bytes.size();
  const auto at = [&](std::size_t rank, std::size_t i) {
    std::uint64_t v = 0;
    std::memcpy(&v, all.data() + rank * bytes.size() + i * sizeof v, sizeof v);
    return v;
  };
  std::string out = fmt::format("{:<34}", "peak MiB");
  for (std::size_t r = 0; r < ranks; ++r) out += fmt::format(" {:>10}", fmt::format("rank {}", r));
  out += '\n';
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c <= kNumMemCategories; ++c) {
      const std::size_t i = k * (kNumMemCategories + 1) + c;
      bool any = false;
      for (std::size_t r = 0; r < ranks; ++r) any = any || at(r, i) != 0;
      if (!any) continue;
      const std::string name = c == kNumMemCategories
                                   ? fmt::format("{} total", memory_kind_name(static_cast<MemoryKind>(k)))
                                   : fmt::format("{} {}", memory_kind_name(static_cast<MemoryKind>(k)),
                                                 mem_category_name(static_cast<MemCategory>(c)));
      out += fmt::format("  {:<32}", name);
      for (std::size_t r = 0; r < ranks; ++r)
        out += fmt::format(" {:>10.2f}", static_cast<double>(at(r, i)) / (1 << 20));
      out += '\n';
    }
  }
  return out;
}

Json split_json(const StepSplit& s) {
  return {{"forward", s.forward_ms},
          {"backward", s.backward_ms},
          {"step", s.step_ms},
          {"gather_wait", s.gather_wait_ms},
          {"reduce_wait", s.reduce_wait_ms},
          {"optimizer", s.optimizer_ms},
          {"copies_exposed", s.copies_exposed_ms},
          {"total", s.total_ms()}};
}

void run_train(const TrainOptions& o) {
  const comm::World world = comm::World::from_environment();
  log::set_rank(world.rank, world.size);
  config::ParseOptions po;
  po.world_size = world.size;
  po.world_size_source = world.source;
  po.source_name = o.config;
  const config::Config cfg = config::load_config_text_or_throw(patched_config(o), po);
  if (!cfg.zero3.model) {
    throw ConfigError(fmt::format("{}: zero3.model: zero3 train needs a model block (\"gpt\" or \"mlp\")", o.config));
  }
  if (!cfg.zero3.run) throw ConfigError(fmt::format("{}: zero3.run.steps (or --steps) is required", o.config));
  const config::ModelSettings& ms = *cfg.zero3.model;
  validate_train_model(ms);

  data::TokenSourceOptions so;
  so.source = cfg.zero3.data.source;
  so.vocab_size = ms.vocab_size;
  so.markov_order = cfg.zero3.data.markov_order;
  so.seed = cfg.zero3.seed;
  so.heldout_fraction = cfg.zero3.data.heldout_fraction;
  const std::unique_ptr<data::TokenSource> source = data::make_token_source(so);
  const std::int64_t context = ms.seq_len;
  const std::int64_t global_batch = cfg.batch.train_batch_size;
  const std::int64_t micro = cfg.batch.train_micro_batch_size_per_gpu;
  const std::int64_t gas = cfg.batch.gradient_accumulation_steps;
  const std::int64_t train_samples = source->num_samples(data::Split::train, context);
  if (train_samples < global_batch) {
    throw ConfigError(fmt::format(
        "zero3.model.seq_len: a context of {} tokens leaves {} training window(s) of {} tokens in {}, fewer than "
        "one global batch ({}); use more data, a shorter context or a smaller batch",
        context, train_samples, context + 1, source->describe(), global_batch));
  }
  data::SamplerOptions sop;
  sop.num_samples = train_samples;
  sop.global_batch = global_batch;
  sop.world_size = world.size;
  sop.rank = world.rank;
  sop.seed = cfg.zero3.seed;
  const data::DistributedSampler sampler(sop);
  const std::int64_t heldout_total = std::min<std::int64_t>(
      o.heldout_samples.value_or((kHeldoutTokens + predictions_per_window(ms) - 1) / predictions_per_window(ms)),
      source->num_samples(data::Split::heldout, context));
  if (heldout_total < 1) {
    throw ConfigError(fmt::format("zero3.model.seq_len: a context of {} tokens leaves no held-out sample in {}",
                                  context, source->describe()));
  }
  // OpenBLAS threads: this rank's share of the node's cores (OpenBLAS would take them all in every rank).
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  models::set_blas_threads(std::max(1, cores / std::max(1, world.local_size)));

  const std::shared_ptr<comm::Bootstrap> bootstrap = comm::make_mpi_bootstrap(world);
  UnitTrainer trainer(cfg, world, bootstrap, [&](Device& device) { return make_train_model(ms, device); });
  ckpt::CheckpointerOptions co;
  co.async = o.save_mode == "async";
  co.staging_bytes = static_cast<std::size_t>(o.save_staging_mb) << 20;
  ckpt::Checkpointer checkpointer(trainer.engine(), bootstrap, co);
  std::int64_t start_step = 0;
  if (!o.resume.empty()) {
    if (o.resume == "latest" && o.save_dir.empty()) {
      throw ConfigError("--resume latest: the latest checkpoint of --save-dir, which is not given");
    }
    const ckpt::LoadResult loaded = checkpointer.load(o.resume == "latest" ? o.save_dir : o.resume);
    start_step = loaded.step;
    const Json& ts = loaded.trainer_state;
    if (ts.value("global_batch", global_batch) != global_batch || ts.value("seed", cfg.zero3.seed) != cfg.zero3.seed) {
      log::warn(
          "resume: the checkpoint was trained with seed {} and global batch {}, this job has seed {} and batch {}: "
          "the data stream after step {} differs from the original run's",
          ts.value("seed", cfg.zero3.seed), ts.value("global_batch", global_batch), cfg.zero3.seed, global_batch,
          start_step);
    }
    if (world.rank == 0) {
      fmt::print("resumed from checkpoint '{}' (step {}, saved by {} rank(s), {:.1f} MB read by rank 0)\n", loaded.tag,
                 loaded.step, loaded.saved_world_size, static_cast<double>(loaded.bytes_read) / 1e6);
    }
  }
  const auto trainer_state = [&](std::int64_t done) {
    return Json{{"step", done},
                {"seed", cfg.zero3.seed},
                {"global_batch", global_batch},
                {"samples_consumed", done * global_batch},
                {"data", source->describe()}};
  };
  int failed_saves = 0;
  std::int64_t saved_step = -1;
  const auto report_one = [&](const ckpt::SaveReport* rep) {
    if (rep->ok) {
      if (world.rank == 0) {
        fmt::print("checkpoint {}: {:.1f} MB in {:.2f} s (training blocked {:.3f} s) -> {}\n", rep->tag,
                   static_cast<double>(rep->bytes) / 1e6, rep->total_s, rep->snapshot_s, rep->dir.string());
      }
      return;
    }
    ++failed_saves;
    if (world.rank != 0) return;
    const std::optional<std::string> latest = ckpt::read_latest(o.save_dir);
    log::error("checkpoint {} failed: {}; the previous checkpoint is intact (latest: {})", rep->tag, rep->error,
               latest.value_or("none"));
  };
  const auto report_save = [&](const std::vector<ckpt::SaveReport>& reports) {
    for (const ckpt::SaveReport& r : reports) report_one(&r);
  };
  const std::optional<double> floor = source->entropy_floor();
  const std::int64_t steps = cfg.zero3.run->steps;
  const std::int64_t interval = o.log_interval.value_or(cfg.steps_per_print.value_or(cfg.zero3.run->log_interval));
  const std::int64_t predicted_per_step = global_batch * predictions_per_window(ms);
  std::ofstream metrics;
  if (!o.metrics.empty() && world.rank == 0) {
    metrics.open(o.metrics);
    if (!metrics)
      throw ConfigError(
          fmt::format("--metrics {}: cannot write: {}", o.metrics, std::generic_category().message(errno)));
  }
  if (world.rank == 0) {
    fmt::print("zero3 train: {}: {} params; {} ranks on {}; {}\n", trainer.model().describe(), train_model_params(ms),
               world.size, device_kind_name(trainer.engine().device().kind()), source->describe());
    if (floor) fmt::print("entropy floor (the data's entropy rate): {:.4f} nats/token\n", *floor);
    fmt::print("batch {} = micro {} x accumulation {} x {} ranks; {} steps\n", global_batch, micro, gas, world.size,
               steps);
    std::fflush(stdout);
  }

  const auto window = [&](data::Split split, std::int64_t index, std::vector<std::int32_t>& tok,
                          std::vector<std::int32_t>& tgt) {
    std::vector<data::TokenId> w(static_cast<std::size_t>(context + 1));
    source->tokens(split, index, context, w);
    tok.insert(tok.end(), w.begin(), w.end() - 1);
    tgt.insert(tgt.end(), w.begin() + 1, w.end());
  };
  const int len = static_cast<int>(context);
  const auto heldout_loss = [&] {
    std::vector<std::int32_t> tok;
    std::vector<std::int32_t> tgt;
    int n = 0;
    for (std::int64_t i = world.rank; i < heldout_total; i += world.size, ++n)
      window(data::Split::heldout, i, tok, tgt);
    const double mean = trainer.eval(tok, tgt, n, len);
    return sum_over_ranks(*bootstrap, mean * n) / static_cast<double>(heldout_total);
  };

  CsvMonitor csv(world.rank == 0 ? cfg.csv_monitor : config::MonitorConfig{});
  // A progress line between the log lines. Under mpirun a rank's stdout is a pseudo-terminal even when
  // mpirun's own output goes to a file, so "auto" can be fooled there: the line is redrawn at most twice a
  // second, and --progress off turns it off.
  const bool tty = world.rank == 0 && (o.progress == "on" || (o.progress == "auto" && isatty(STDOUT_FILENO) == 1));
  auto t_drawn = std::chrono::steady_clock::time_point{};
  const auto t_start = std::chrono::steady_clock::now();
  auto t_last = t_start;
  std::int64_t steps_since = 0;
  StepSplit split_since;
  double last_heldout = 0.0;
  for (std::int64_t step = start_step; step < steps; ++step) {
    double loss_sum = 0.0;
    StepResult r;
    for (std::int64_t m = 0; m < gas; ++m) {
      std::vector<std::int32_t> tok;
      std::vector<std::int32_t> tgt;
      for (const std::int64_t i : sampler.micro_batch(step, m, micro)) window(data::Split::train, i, tok, tgt);
      loss_sum += trainer.micro_batch(tok, tgt, static_cast<int>(micro), len);
      r = trainer.step();
    }
    ++steps_since;
    split_since += trainer.last_split();
    const std::int64_t samples = (step + 1) * global_batch;
    csv.write("Train/Samples/train_loss", loss_sum / static_cast<double>(gas), samples);
    csv.write("Train/Samples/lr", r.lr, samples);
    if (cfg.fp16.enabled) csv.write("Train/Samples/loss_scale", r.loss_scale, samples);
    const bool last = step + 1 == steps;
    report_save(checkpointer.poll());  // an async save whose writes finished: commit it
    if (!o.save_dir.empty() && o.save_interval && (step + 1) % *o.save_interval == 0) {
      checkpointer.save(o.save_dir, fmt::format("global_step{}", step + 1), step + 1, trainer_state(step + 1));
      saved_step = step + 1;
    }
    if (tty && std::chrono::steady_clock::now() - t_drawn > std::chrono::milliseconds(500)) {
      t_drawn = std::chrono::steady_clock::now();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(steps - step - 1);
      fmt::print("\r  step {}/{}  loss {:.4f}  {:.0f} tokens/s  ETA {:.0f} s   ", step + 1, steps,
                 loss_sum / static_cast<double>(gas), static_cast<double>((step + 1) * predicted_per_step) / elapsed,
                 eta);
      std::fflush(stdout);
    }
    if ((step + 1) % interval != 0 && !last) continue;
    if (tty) fmt::print("\r{:80}\r", "");
    // Throughput of the steps alone: the held-out pass below is not training time.
    const auto now = std::chrono::steady_clock::now();
    const double tps =
        static_cast<double>(steps_since * predicted_per_step) / std::chrono::duration<double>(now - t_last).count();
    const StepSplit split = split_since.scaled(1.0 / static_cast<double>(steps_since));
    const double train_loss = sum_over_ranks(*bootstrap, loss_sum / static_cast<double>(gas)) / world.size;
    last_heldout = heldout_loss();
    if (world.rank == 0) {
      fmt::print(
          "step {:>6}/{}  loss {:.4f}  heldout {:.4f}{}  lr {:.3e}  scale {:g}  grad norm {:.3f}  skipped {}  "
          "{:.0f} tokens/s\n",
          step + 1, steps, train_loss, last_heldout, floor ? fmt::format(" (floor {:.4f})", *floor) : std::string(),
          r.lr, r.loss_scale, r.grad_norm, r.skipped_steps, tps);
      if (trainer.timed()) {
        fmt::print(
            "  time/step {:.2f} ms = forward {:.2f} + backward {:.2f} + step {:.2f} (optimizer {:.2f}); waiting for "
            "gathers {:.2f}, reductions {:.2f}, offload copies {:.2f}\n",
            split.total_ms(), split.forward_ms, split.backward_ms, split.step_ms, split.optimizer_ms,
            split.gather_wait_ms, split.reduce_wait_ms, split.copies_exposed_ms);
      }
      std::fflush(stdout);
      if (metrics.is_open()) {
        Json line = {{"step", step + 1},
                     {"loss", train_loss},
                     {"heldout_loss", last_heldout},
                     {"lr", r.lr},
                     {"grad_norm", r.grad_norm},
                     {"loss_scale", r.loss_scale},
                     {"skipped_steps", r.skipped_steps},
                     {"tokens_per_s", tps}};
        if (floor) line["entropy_floor"] = *floor;
        if (trainer.timed()) line["time_ms"] = split_json(split);
        metrics << line.dump() << '\n' << std::flush;
      }
    }
    // Below the floor by more than the sampling noise of the held-out estimate: the model sees the future.
    if (floor && last_heldout < *floor - 0.05) {
      throw Error(fmt::format(
          "step {}: held-out loss {:.4f} is below the data's entropy floor {:.4f} nats/token; no model can do that "
          "on unseen data, so the model sees what it should not (a future token?)",
          step + 1, last_heldout, *floor));
    }
    steps_since = 0;
    split_since = {};
    t_last = std::chrono::steady_clock::now();
  }
  // The run ends with a checkpoint of its final state (also when a resumed run had nothing left to do).
  if (!o.save_dir.empty() && saved_step != std::max(steps, start_step)) {
    const std::int64_t final_step = std::max(steps, start_step);
    checkpointer.save(o.save_dir, fmt::format("global_step{}", final_step), final_step, trainer_state(final_step));
  }
  report_save(checkpointer.wait());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  const std::string memory = peak_memory_table(*bootstrap, trainer.engine().memory());
  if (world.rank == 0) {
    fmt::print("done: {} steps in {:.1f} s; held-out loss {:.4f}", steps, wall, last_heldout);
    if (floor) fmt::print(", {:+.4f} nats/token above the entropy floor {:.4f}", last_heldout - *floor, *floor);
    fmt::print("\npeak memory per rank by kind and category:\n{}", memory);
    std::fflush(stdout);
  }
  if (failed_saves > 0) {
    throw CheckpointError(
        fmt::format("{} checkpoint save(s) failed (see above); training itself completed", failed_saves));
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto opt = std::make_shared<TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Train the model of a DeepSpeed config's \"zero3\" block (mpirun -np N)");
  cmd->add_option("--config", opt->config, "DeepSpeed JSON config with a \"zero3\" block (model, data, run)")
      ->required();
  cmd->add_option("--steps", opt->steps, "Optimizer steps of the run (zero3.run.steps)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--log-interval", opt->log_interval, "Steps between log lines (default: steps_per_print)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--metrics", opt->metrics, "Write one JSON object per logged step to this file (rank 0)");
  cmd->add_option("--progress", opt->progress, "Progress line between log lines: auto (stdout is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--save-dir", opt->save_dir, "Checkpoint root: saves DIR/global_step<N> (and at the end)");
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
  cmd->add_option("--heldout-samples", opt->heldout_samples,
                  "Held-out windows measured at each log line (default: 4096 predicted tokens' worth)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  for (const char* key : {"model.type", "model.layers", "model.hidden_size", "model.heads", "model.vocab_size",
                          "model.seq_len", "data.source", "data.markov_order", "seed", "device"}) {
    cmd->add_option_function<std::string>(
        fmt::format("--{}", key), [opt, k = std::string(key)](const std::string& v) { opt->overrides[k] = v; },
        fmt::format("Override zero3.{}", key));
  }
  cmd->callback([opt] { run_train(*opt); });
}

}  // namespace zero3::tools
