#include "zero3/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <utility>

#include "zero3/comm/fault.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"

namespace zero3::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double sum_over_ranks(comm::Bootstrap& b, double v) {
  const comm::ScopedOpAnnotation note("metrics");
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

}  // namespace

// The steps since the last log line: their count, summed split, and when the first began.
struct Trainer::Window {
  std::int64_t steps = 0;
  StepSplit split;
  Clock::time_point start = Clock::now();
};

Trainer::Trainer(UnitTrainer& unit_trainer, TrainData& data, TrainerOptions options)
    : unit_trainer_(unit_trainer), data_(data), options_(std::move(options)) {
  if (options_.steps < 1)
    throw ConfigError(fmt::format("zero3.run.steps: {} steps; a run needs at least 1", options_.steps));
  if (options_.log_interval < 0) throw ConfigError("steps_per_print: the log interval must not be negative");
  if (options_.save_interval && *options_.save_interval < 1) {
    throw ConfigError(fmt::format("--save-interval: {}; it must be at least 1", *options_.save_interval));
  }
  if (options_.resume == "latest" && options_.save_dir.empty()) {
    throw ConfigError("--resume latest: the latest checkpoint of --save-dir, which is not given");
  }
  checkpointer_ =
      std::make_unique<ckpt::Checkpointer>(unit_trainer_.engine(), unit_trainer_.bootstrap(), options_.checkpoint);
}

Trainer::~Trainer() = default;

void Trainer::add_observer(std::shared_ptr<TrainObserver> observer) {
  if (!observer) throw UsageError("Trainer::add_observer: null observer");
  observers_.push_back(std::move(observer));
}

template <typename Fn>
void Trainer::notify(const Fn& fn) {
  for (const std::shared_ptr<TrainObserver>& o : observers_) fn(*o);
}

std::int64_t Trainer::resume() {
  if (options_.resume.empty()) return 0;
  const ckpt::LoadResult loaded =
      checkpointer_->load(options_.resume == "latest" ? options_.save_dir : options_.resume);
  data_.check_resume(loaded.trainer_state, loaded.step);
  notify([&](TrainObserver& o) { o.on_resume(loaded); });
  return loaded.step;
}

// The test-only faults of ZERO3_FAULT that live in the training loop (zero3/comm/fault.hpp): a rank that
// stops, one that issues a collective the others do not, one that runs a micro-batch more.
void Trainer::inject_faults(std::int64_t step, std::int64_t& micro_batches) {
  using comm::fault::Kind;
  const int rank = unit_trainer_.bootstrap()->rank();
  if (comm::fault::fire(Kind::stall, rank, step)) ::raise(SIGSTOP);
  if (comm::fault::fire(Kind::extra_collective, rank, step)) {
    Engine& engine = unit_trainer_.engine();
    const std::unique_ptr<Stream> stream = engine.device().create_stream("fault");
    Buffer one = engine.device().allocate(static_cast<std::size_t>(engine.communicator().size()), DType::f32,
                                          MemoryKind::device, MemCategory::workspace);
    const comm::ScopedOpAnnotation note("fault", "extra_collective");
    engine.communicator().all_gather(one.cview().slice(0, 1), one.view(), *stream)->wait();
  }
  if (comm::fault::fire(Kind::extra_micro_batch, rank, step)) ++micro_batches;
}

double Trainer::train_step(std::int64_t step) {
  const std::int64_t gas = unit_trainer_.engine().config().batch.gradient_accumulation_steps;
  double loss_sum = 0.0;
  StepResult r;
  std::int64_t micro_batches = gas;
  inject_faults(step, micro_batches);
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    // The loop's own position tags the collectives (the engine's would follow a rank that ran a micro-batch
    // more, and hide it from the desync guard).
    comm::set_progress(step, m);
    const TokenBatch b = data_.micro_batch(step, std::min(m, gas - 1));  // an injected extra one repeats the last
    loss_sum += unit_trainer_.micro_batch(b.tokens, b.targets, b.batch, b.len);
    r = unit_trainer_.step();
  }
  last_result_ = r;
  return loss_sum / static_cast<double>(gas);
}

void Trainer::report_saves(const std::vector<ckpt::SaveReport>& reports) {
  for (const ckpt::SaveReport& r : reports) {
    if (!r.ok) ++summary_.failed_saves;
    notify([&](TrainObserver& o) { o.on_save(r); });
  }
}

void Trainer::maybe_save(std::int64_t done, bool force) {
  if (options_.save_dir.empty()) return;
  const bool due = options_.save_interval && done % *options_.save_interval == 0;
  if (!(due || (force && saved_step_ != done))) return;
  checkpointer_->save(options_.save_dir, fmt::format("global_step{}", done), done, data_.position(done));
  saved_step_ = done;
}

double Trainer::heldout_loss() {
  const TokenBatch b = data_.heldout();
  const double mean = unit_trainer_.eval(b.tokens, b.targets, b.batch, b.len);
  return sum_over_ranks(*unit_trainer_.bootstrap(), mean * b.batch) / static_cast<double>(data_.heldout_windows());
}

void Trainer::log_interval(std::int64_t done, const StepResult& r, double loss, Window& window) {
  Engine& engine = unit_trainer_.engine();
  const int world = engine.config().batch.world_size;
  LogEvent e;
  e.step = done;
  e.steps = options_.steps;
  e.result = r;
  // Throughput of the steps alone: the held-out pass below is not training time.
  const double predicted =
      static_cast<double>(window.steps * engine.config().batch.train_batch_size * data_.predictions_per_window());
  e.tokens_per_s = predicted / seconds_since(window.start);
  e.timed = unit_trainer_.timed();
  e.split = window.split.scaled(1.0 / static_cast<double>(window.steps));
  e.train_loss = sum_over_ranks(*unit_trainer_.bootstrap(), loss) / world;
  e.heldout_loss = heldout_loss();
  e.entropy_floor = data_.entropy_floor();
  summary_.heldout_loss = e.heldout_loss;
  notify([&](TrainObserver& o) { o.on_log(e); });
  window = Window{};
}

TrainSummary Trainer::run() {
  const Clock::time_point start = Clock::now();
  summary_ = {};
  summary_.steps = options_.steps;
  summary_.entropy_floor = data_.entropy_floor();
  try {
    summary_.start_step = resume();
    const std::int64_t global_batch = unit_trainer_.engine().config().batch.train_batch_size;
    Window window;
    for (std::int64_t step = summary_.start_step; step < options_.steps; ++step) {
      const double loss = train_step(step);
      const std::int64_t done = step + 1;
      window.steps += 1;
      window.split += unit_trainer_.last_split();
      StepEvent e{done, options_.steps, done * global_batch, loss, last_result_, seconds_since(start), 0.0};
      e.tokens_per_s =
          static_cast<double>((done - summary_.start_step) * global_batch * data_.predictions_per_window()) /
          e.elapsed_s;
      notify([&](TrainObserver& o) { o.on_step(e); });
      report_saves(checkpointer_->poll());  // an async save whose writes finished: commit it
      maybe_save(done, false);
      const bool last = done == options_.steps;
      if (last || (options_.log_interval > 0 && done % options_.log_interval == 0)) {
        log_interval(done, last_result_, loss, window);
      }
    }
    // The run ends with a checkpoint of its final state (also when a resumed run had nothing left to do).
    maybe_save(std::max(options_.steps, summary_.start_step), true);
    report_saves(checkpointer_->wait());
  } catch (const std::exception& e) {
    const std::exception_ptr error = std::current_exception();
    notify([&](TrainObserver& o) { o.on_error(error); });
    comm::handle_fatal_error(e.what());  // armed by the program: reports and brings the whole job down
    throw;
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    notify([&](TrainObserver& o) { o.on_error(error); });
    throw;
  }
  summary_.wall_s = seconds_since(start);
  if (summary_.failed_saves > 0) {
    throw CheckpointError(
        fmt::format("{} checkpoint save(s) failed (see above); training itself completed", summary_.failed_saves));
  }
  return summary_;
}

}  // namespace zero3::train
