#include "zero3/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <utility>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/comm/fault.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/train/accumulation.hpp"
#include "zero3/train/step_guard.hpp"

namespace zero3::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double sum_over_ranks(comm::Bootstrap& b, double v) {
  const comm::ScopedOpAnnotation note("metrics");
  return comm::sum_over_ranks(b, v);
}

// The step of a tag the loop wrote ("global_step<N>"), -1 for another.
std::int64_t step_of_tag(std::string_view tag) {
  constexpr std::string_view kPrefix = "global_step";
  if (!tag.starts_with(kPrefix)) return -1;
  std::int64_t step = -1;
  const auto [end, ec] = std::from_chars(tag.data() + kPrefix.size(), tag.data() + tag.size(), step);
  return ec == std::errc() && end == tag.data() + tag.size() ? step : -1;
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
  guard_ = std::make_unique<StepGuard>(unit_trainer_.engine(), unit_trainer_.bootstrap(), !options_.save_dir.empty());
  const config::Config& config = unit_trainer_.engine().config();
  if (config.zero3.accumulation.policy == config::AccumulationPolicy::memory) {
    if (!unit_trainer_.device_budget_bytes()) {
      throw UsageError("Trainer: zero3.accumulation.policy \"memory\" needs the UnitTrainer's device budget");
    }
    // The configured batch, and the micro-batch the plan started with (the unit trainer's choice) as the ceiling.
    accumulation_ = std::make_unique<MemoryAccumulation>(
        config.zero3.accumulation, unit_trainer_.configured_batch(), config.batch.train_micro_batch_size_per_gpu,
        *unit_trainer_.device_budget_bytes(), unit_trainer_.bootstrap()->rank());
  }
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
  guard_->restore(loaded.trainer_state, loaded.manifest);
  if (accumulation_) accumulation_->restore(unit_trainer_.engine(), loaded.trainer_state, loaded.manifest);
  has_checkpoint_ = options_.resume == "latest" || options_.resume == options_.save_dir;
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
  const config::BatchConfig batch = unit_trainer_.engine().config().batch;  // this step's
  const std::int64_t gas = batch.gradient_accumulation_steps;
  if (accumulation_) accumulation_->begin_step(unit_trainer_.engine());
  double loss_sum = 0.0;
  StepResult r;
  std::int64_t micro_batches = gas;
  inject_faults(step, micro_batches);
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    // The loop's own position tags the collectives (the engine's would follow a rank that ran a micro-batch
    // more, and hide it from the desync guard).
    unit_trainer_.engine().watchdog().progress().set(step, m);
    // An injected extra micro-batch repeats the last one.
    const TokenBatch b =
        data_.micro_batch(guard_->data_step(step), std::min(m, gas - 1), batch.train_micro_batch_size_per_gpu);
    const double loss = unit_trainer_.micro_batch(b.tokens, b.targets, b.batch, b.len);
    loss_sum += loss;
    guard_->on_micro_loss(loss);
    if (m + 1 == micro_batches) {
      guard_->before_boundary(step, loss_sum / static_cast<double>(gas), has_checkpoint_);
      // A stop request rides on the boundary's all-reduce: no collective of its own in the common case.
      if (options_.stop_on_request && stop_requested() != 0) unit_trainer_.engine().mark_stop_request();
      if (accumulation_) accumulation_->before_boundary(unit_trainer_.engine());
    }
    r = unit_trainer_.step();
  }
  guard_->after_boundary(r);
  if (accumulation_) accumulation_->after_boundary(unit_trainer_.engine(), r, step + 1);
  last_result_ = r;
  return loss_sum / static_cast<double>(gas);
}

// stage3_gather_16bit_weights_on_model_save: DeepSpeed then gathers the full 16-bit weights into one file at
// each model save (what HF's Trainer writes beside its checkpoints). zero3 writes CHECKPOINT/model.safetensors
// in the model dtype from the committed checkpoint, on rank 0, through a temporary file renamed into place.
void Trainer::export_model_weights(const ckpt::SaveReport& r) {
  const config::Config& cfg = unit_trainer_.engine().config();
  if (!cfg.zero.gather_16bit_weights_on_model_save || unit_trainer_.bootstrap()->rank() != 0) return;
  const std::filesystem::path out = r.dir / "model.safetensors";
  try {
    ckpt::export_safetensors(ckpt::CheckpointReader(r.dir), out, cfg.model_dtype());
  } catch (const std::exception& e) {
    events::emit(
        {.level = log::Level::error,
         .kind = "model_export_failed",
         .step = step_of_tag(r.tag),
         .message = fmt::format("checkpoint {} is saved, but writing {} failed: {}", r.tag, out.string(), e.what()),
         .fields = {{"tag", r.tag}, {"path", out.string()}, {"error", e.what()}}});
  }
}

void Trainer::report_saves(const std::vector<ckpt::SaveReport>& reports) {
  for (const ckpt::SaveReport& r : reports) {
    if (r.ok) export_model_weights(r);
    if (!r.ok) {
      ++summary_.failed_saves;
      if (unit_trainer_.bootstrap()->rank() == 0) {  // the report is the same on every rank
        const std::optional<std::string> latest = ckpt::read_latest(options_.save_dir);
        events::emit({.level = log::Level::error,
                      .kind = "checkpoint_save_failed",
                      .step = step_of_tag(r.tag),
                      .message = fmt::format("checkpoint {} failed: {}; the previous checkpoint is intact (latest: {})",
                                             r.tag, r.error, latest.value_or("none")),
                      .fields = {{"tag", r.tag}, {"path", r.dir.string()}, {"error", r.error}}});
      }
    }
    notify([&](TrainObserver& o) { o.on_save(r); });
  }
}

// A failed save leaves `checkpoint` unset and no outcome event: its own event says what failed, and run()
// throws.
void Trainer::finish_preemption(const std::vector<ckpt::SaveReport>& saves, double save_s) {
  Preemption& p = *summary_.preempted;
  if (!options_.save_dir.empty()) {
    const std::string tag = fmt::format("global_step{}", p.step);
    const auto it = std::find_if(saves.begin(), saves.end(), [&](const ckpt::SaveReport& r) { return r.tag == tag; });
    if (it == saves.end() || !it->ok) return;
    p.checkpoint = it->dir;
    p.save_s = save_s;
  }
  emit_preemption_outcome(p, unit_trainer_.bootstrap()->rank());
}

bool Trainer::stop_agreed(std::int64_t done) {
  if (!options_.stop_on_request || done >= options_.steps) return false;  // the last step ends the run anyway
  // Every rank read the same count from the step's all-reduce, so every rank (or none) makes the
  // exchange below, which names the ranks and their reasons.
  if (last_result_.stop_requests == 0) return false;
  const StopAgreement a = agree_on_stop(*unit_trainer_.bootstrap());
  if (!a.stop) return false;
  emit_stop_agreed(a, done, unit_trainer_.bootstrap()->rank());
  summary_.preempted = Preemption{.reason = a.reason, .step = done, .ranks_asked = a.ranks_asked};
  return true;
}

void Trainer::maybe_save(std::int64_t done, bool force) {
  // saved_step_ == done: this state is saved already (the last interval save, when the interval divides the
  // run's steps); saving its tag again would try to replace the checkpoint `latest` names.
  if (options_.save_dir.empty() || saved_step_ == done) return;
  const bool due = options_.save_interval && done % *options_.save_interval == 0;
  if (!(due || force)) return;
  nlohmann::json state = data_.position(done);
  state[StepGuard::kStateKey] = guard_->state();
  if (accumulation_) state[MemoryAccumulation::kStateKey] = accumulation_->state(unit_trainer_.engine());
  Engine& engine = unit_trainer_.engine();
  if (engine.config().memory_breakdown || trace::enabled()) engine.memory().enter_phase("checkpoint staging");
  checkpointer_->save(options_.save_dir, fmt::format("global_step{}", done), done, state);
  saved_step_ = done;
  has_checkpoint_ = true;
}

std::int64_t Trainer::roll_back(std::int64_t step) {
  report_saves(checkpointer_->wait());  // the save in flight may be the one to load
  const ckpt::LoadResult loaded = checkpointer_->load(options_.save_dir);
  const std::int64_t resumed = guard_->rolled_back(loaded, step);
  notify([&](TrainObserver& o) { o.on_resume(loaded); });
  return resumed;
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
  if (engine.config().memory_breakdown) e.memory_phases = engine.memory().take_phase_stats();
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      e.memory_peaks[k][c] = engine.memory().get(static_cast<MemoryKind>(k), static_cast<MemCategory>(c));
    }
  }
  e.entropy_floor = data_.entropy_floor();
  e.entropy_floor_se = data_.entropy_floor_se();
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
      trace::instant("steps", fmt::format("step {}", done));
      StepEvent e{done, options_.steps, done * global_batch, loss, last_result_, seconds_since(start), 0.0};
      e.tokens_per_s =
          static_cast<double>((done - summary_.start_step) * global_batch * data_.predictions_per_window()) /
          e.elapsed_s;
      notify([&](TrainObserver& o) { o.on_step(e); });
      if (guard_->rollback_due()) {  // a loss spike: on from the last checkpoint, past the spike's batches
        step = roll_back(step) - 1;
        window = Window{};
        continue;
      }
      report_saves(checkpointer_->poll());  // an async save whose writes finished: commit it
      const bool stop = stop_agreed(done);  // saved below, synchronously
      if (!stop) maybe_save(done, false);
      // The stop step is logged too: the metrics of the state the checkpoint holds, where a resumed run's
      // records begin after it.
      const bool last = done == options_.steps;
      if (stop || last || (options_.log_interval > 0 && done % options_.log_interval == 0)) {
        log_interval(done, last_result_, loss, window);
      }
      if (stop) break;
    }
    // The run ends with a checkpoint of its final state (also when a resumed run had nothing left to do).
    const Clock::time_point save_start = Clock::now();
    maybe_save(summary_.preempted ? summary_.preempted->step : std::max(options_.steps, summary_.start_step), true);
    const std::vector<ckpt::SaveReport> last_saves = checkpointer_->wait();
    report_saves(last_saves);
    if (summary_.preempted) finish_preemption(last_saves, seconds_since(save_start));
    if (!std::isfinite(summary_.heldout_loss)) {
      throw NonFiniteError(fmt::format(
          "the held-out loss after {} steps is {}: the model has diverged (see the non-finite and spike warnings "
          "above; zero3.nonfinite, gradient_clipping, a lower lr)",
          options_.steps, summary_.heldout_loss));
    }
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
  if (summary_.preempted && !options_.save_dir.empty() && !summary_.preempted->checkpoint) {
    // The run stopped early and its state is lost: saying that training completed would be false.
    const Preemption& p = *summary_.preempted;
    throw CheckpointError(fmt::format(
        "stopped on {} after step {} of {}, but its checkpoint could not be saved (see above): the steps since "
        "the last checkpoint are lost; {}",
        stop_reason_name(p.reason), p.step, options_.steps,
        std::filesystem::exists(std::filesystem::path(options_.save_dir) / "latest")
            ? "resuming continues from the previous checkpoint, which `latest` still names"
            : "there is no earlier checkpoint to resume from"));
  }
  if (summary_.failed_saves > 0) {
    throw CheckpointError(
        fmt::format("{} checkpoint save(s) failed (see above); training itself completed", summary_.failed_saves));
  }
  return summary_;
}

}  // namespace zero3::train
