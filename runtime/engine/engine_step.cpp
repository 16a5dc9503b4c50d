// Engine::Impl::step(): the micro-step count of the accumulation window, and at its boundary the
// optimizer step with the window's timings and collective counts.
#include <fmt/format.h>

#include <chrono>
#include <utility>

#include "engine_impl.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"

namespace zero3 {

StepResult Engine::Impl::step() {
  check_call("step", true);
  if (!scopes.empty()) {
    std::string open;
    for (const OpenScope& s : scopes) open += (open.empty() ? "" : ", ") + describe_scope(s);
    throw UsageError(fmt::format("step() with scopes still open ({}); close them first", open));
  }
  if (!backward_since_step) {
    throw UsageError(fmt::format(
        "step() with no gradient scope closed since the last step() (or finalize()): call step() once per "
        "micro-batch, after its backward (engine.grads(unit) for the units it trains, closed); this step() would {}",
        config.batch.gradient_accumulation_steps == 1
            ? "move the weights on zero gradients"
            : fmt::format("shift the accumulation window (gradient_accumulation_steps {}, micro-step {} of it)",
                          config.batch.gradient_accumulation_steps, micro_steps + 1)));
  }
  backward_since_step = false;
  StepResult r;
  r.loss_scale = optimizer_step->loss_scale();
  r.next_loss_scale = r.loss_scale;
  const std::int64_t gas = config.batch.gradient_accumulation_steps;
  if (++micro_steps < gas) {
    optimizer_step->optimizer().set_final_micro_step(micro_steps + 1 == gas);
  } else {
    micro_steps = 0;
    step_boundary(r);
    watchdog->progress().mark_first_step_done();
  }
  watchdog->progress().set(global_step, micro_steps);
  r.global_step = global_step;
  r.skipped_steps = skipped_steps;
  coordinator->reclaim();
  reducer->reclaim();
  return r;
}

void Engine::Impl::step_boundary(StepResult& r) {
  r.boundary = true;
  if (config.memory_breakdown || trace::enabled()) device->memory().enter_phase("reductions");
  // The step may update persistent params that compute work enqueued so far still reads.
  const auto started = std::chrono::steady_clock::now();
  compute->record(*compute_done);
  comm_stream->wait(*compute_done);
  coordinator->end_window();
  const bool timed = timeline->enabled();
  if (timed) comm_stream->synchronize();  // the reductions (wall_clock_breakdown only)
  const auto reduced = std::chrono::steady_clock::now();
  engine::WindowMarks marks = std::exchange(this->marks, {});
  marks.step = global_step + 1;
  if (config.memory_breakdown || trace::enabled()) device->memory().enter_phase("optimizer step");
  engine::StepOutcome out;
  try {
    out = optimizer_step->run(marks);
  } catch (const NonFiniteError&) {
    // The run ends, but the engine stays usable (state reads, a checkpoint): the step counts as skipped.
    reducer->accumulators_cleared();
    ++global_step;
    ++skipped_steps;
    comm_stream->record(*step_done);
    compute->wait(*step_done);
    throw;
  }
  reducer->accumulators_cleared();  // every outcome of run() zeroed them
  if (timed) comm_stream->synchronize();
  const engine::Timeline::Summary times = timeline->summarize();
  stats.last_step_offload = times.offload;
  stats.last_step_disk = times.disk;
  if (timed) {
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    stats.last_step_times.gather_wait_ms = times.gather_wait_ms;
    stats.last_step_times.reduce_wait_ms = ms(reduced - started);
    stats.last_step_times.optimizer_ms = ms(std::chrono::steady_clock::now() - reduced);
  }
  optimizer_step->optimizer().set_final_micro_step(config.batch.gradient_accumulation_steps == 1);
  if (out.applied) coordinator->refresh_persistent();
  ++global_step;
  if (!out.applied) ++skipped_steps;
  r.applied = out.applied;
  r.nonfinite = out.nonfinite;
  r.discarded = out.discarded;
  r.stop_requests = out.stop_requests;
  r.memory_high_ranks = out.memory_high_ranks;
  r.memory_low_ranks = out.memory_low_ranks;
  r.grad_norm = out.grad_norm;
  r.lr = out.lr;
  r.loss_scale = out.loss_scale;
  r.next_loss_scale = out.next_loss_scale;

  stats.last_step_all_gather_elems = std::exchange(stats.all_gather_elems, 0);
  stats.last_step_reduce_scatter_elems = std::exchange(stats.reduce_scatter_elems, 0);
  stats.last_step_all_reduce_elems = std::exchange(stats.all_reduce_elems, 0);
  // Compute work after this (the next forward) reads the persistent params the step wrote.
  comm_stream->record(*step_done);
  compute->wait(*step_done);
}

}  // namespace zero3
