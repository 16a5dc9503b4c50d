// The ZeRO-3 engine: parameters, gradients and optimizer state partitioned over the ranks of a job.
//
// A trainer declares units (named groups of named params, gathered and released as a whole; usually one
// layer or block) in any order, calls finalize() (collective) to partition and initialize them, and then
// per micro-batch: opens a GatherScope per unit in forward (full params on the device, in the compute
// dtype), opens GatherScope + GradScope per unit in backward (writes full-size grads; closing the
// GradScope reduce-scatters them into this rank's shard), and calls step() once per micro-batch, after its
// backward (it acts at the gradient-accumulation boundary). Gathers are prefetched from the unit order
// traced in the first step, on a communication stream, and joined to the compute stream with events.
//
//   zero3::Engine engine(config, world);  // a parsed zero3::config::Config, zero3::comm::World
//   engine.add_unit({"fc", {{"fc.weight", {out, in}, zero3::ParamInit::normal({.std = 0.02})}}});
//   engine.finalize();                    // collective: partitions and initializes the shards
//   for (;;) {                            // one micro-batch
//     {                                   // forward
//       auto g = engine.gather("fc");
//       forward(g.param("fc.weight"), engine.compute_stream());  // enqueued on the compute stream
//     }
//     {                                   // backward, loss multiplied by engine.loss_multiplier()
//       auto g = engine.gather("fc");
//       auto gr = engine.grads("fc");     // zero-filled full-size grads, compute dtype
//       backward(g.param("fc.weight"), gr.grad("fc.weight"), engine.compute_stream());
//     }                                   // gr closes first: its reduce-scatter is enqueued
//     zero3::StepResult r = engine.step();
//   }
//
// Threading: one host thread drives an Engine. Pointers in scopes are valid for work enqueued on
// compute_stream() while the scope is open, not for the host thread: gather() returns before the gather
// has landed. Host compute (the host backend, fp32) goes on the compute stream with Stream::launch_host:
//
//   auto g = engine.gather("fc");
//   const zero3::BufferView w = g.param("fc.weight");
//   engine.compute_stream().launch_host([w, &loss] {  // runs once the gather has landed
//     const float* x = w.as<const float>();
//     for (std::size_t i = 0; i < w.count; ++i) loss += 0.5 * x[i] * x[i];
//   });
//   auto gr = engine.grads("fc");
//   const zero3::BufferView dw = gr.grad("fc.weight");
//   engine.compute_stream().launch_host([w, dw, m = engine.loss_multiplier()] {  // after the zero fill
//     for (std::size_t i = 0; i < dw.count; ++i) dw.as<float>()[i] = static_cast<float>(m) * w.as<const float>()[i];
//   });
//   // closing gr and g orders the reduction and the release after both functions
//
// (`loss` is ready after compute_stream().synchronize().) All collective calls (finalize, step,
// gather_tensor) must be made by every rank in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/core/buffer_view.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/resources.hpp"
#include "zero3/engine/state.hpp"
#include "zero3/engine/stats.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3 {

namespace comm {
class Watchdog;
}

class Engine {
 public:
  class GatherScope;
  class GradScope;
  class UntracedScope;

  // Validates that `config` is runnable by this engine (stage 3, an optimizer, ...; ConfigError naming the
  // key otherwise), makes the device (zero3.device), the MPI bootstrap and the communicator for `world`
  // unless given in `resources`, and the compute and communication streams. Collective.
  Engine(const config::Config& config, const comm::World& world, EngineResources resources = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Before finalize(). Duplicate unit or param names, invalid shapes or inits (a negative or non-finite
  // normal std, uniform low > high, ...), and calls after finalize(), throw UsageError naming them.
  void add_unit(UnitSpec unit);
  // Collective. Partitions every unit (flat layout padded to world size x alignment; persistent units
  // whole on every rank), allocates and initializes this rank's shards, and checks that all ranks agree
  // (unit layout, config hash, persistent params): a disagreement throws Error naming the first differing
  // unit or param and the ranks.
  void finalize();

  // Full params of `unit` on the device, in the compute dtype, for the scope's life: compute_stream() waits
  // (on an event) for the gather before any work enqueued after this call. Scopes nest: close them in the
  // reverse order of opening (UsageError otherwise, naming both units).
  GatherScope gather(std::string_view unit);
  // In backward, with the unit's GatherScope open: zero-filled full-size gradient buffers (compute dtype)
  // of the unit's trainable params. Closing the scope reduce-scatters them (bucketed, on the communication
  // stream, after the work enqueued on compute_stream() so far) into this rank's gradient accumulator.
  // A unit without trainable params gives a scope with no buffers (it still counts as a backward for step()).
  GradScope grads(std::string_view unit);
  // Gathers opened while the returned scope lives are made on demand, outside the traced gather order: for
  // a forward-only pass between training steps (held-out loss), which must neither disturb the prefetch
  // schedule nor be prefetched by it. grads() throws meanwhile. Not nestable (UsageError).
  UntracedScope untraced();

  // Multiply the loss by this before backward: loss_scale / gradient_accumulation_steps.
  double loss_multiplier() const;
  double loss_scale() const;

  // Call once per micro-batch, after its backward: UsageError when no GradScope was closed since the last
  // step() (or finalize()), e.g. step() twice in a row, which would shift the accumulation window. At the
  // accumulation boundary: waits for the reductions, checks fp16 gradients for Inf/NaN (all ranks agree; an
  // overflow skips the step with every param and optimizer state untouched), computes the global norm (one
  // all-reduce), clips, runs the optimizer, writes the new low-precision shards, advances the lr schedule
  // and the loss scale. A non-finite norm (an Inf/NaN gradient element, any dtype) or a window marked by
  // discard_window() skips the step likewise; non-finite steps follow zero3.nonfinite (a warning event
  // naming the step, the ranks and the first non-finite param; NonFiniteError under "abort" or after
  // max_consecutive skips in a row, with the engine still consistent).
  StepResult step();

  // Why a window is not to be applied (discard_window).
  enum class DiscardReason {
    nonfinite_loss,  // this rank's loss was Inf/NaN: zero3.nonfinite handles the step as it does Inf/NaN
                     // gradients (skip with a warning event, or NonFiniteError), even when every gradient is finite
    requested,       // dropped on purpose (a loss-spike policy): skipped, no warning, not counted as non-finite
  };
  // Marks the accumulation window in progress (call before its boundary step()): that step() applies
  // nothing, leaving every param and optimizer state bitwise untouched (StepResult::nonfinite or
  // ::discarded), and clears the window's gradients. Rank-local and cheap: the marks travel in the step's
  // all-reduce, so one rank's mark holds on every rank.
  void discard_window(DiscardReason reason);
  // Marks the window in progress (before its boundary step()): this rank asks every rank to stop after
  // that boundary (a preemption). Free: the mark travels in the step's all-reduce, so every rank reads the
  // same StepResult::stop_requests, and no collective of its own can fall out of step with the others.
  void mark_stop_request();
  // Marks the window in progress (before its boundary step()) with this rank's device memory pressure, for
  // a policy that sizes the micro-batch by memory (zero3.accumulation): free, the mark travels in the step's
  // all-reduce, and every rank reads the same StepResult::memory_high_ranks and ::memory_low_ranks.
  enum class MemoryPressure { high, low };
  void mark_memory_pressure(MemoryPressure pressure);
  // Before finalize() or at an accumulation boundary with no scope open (UsageError otherwise): the
  // micro-batch and accumulation of the following windows, whose product with the world size must stay the
  // configured train_batch_size (ConfigError otherwise). config().batch reads the new values; the loss
  // multiplier follows. Every rank calls it with the same values.
  void set_accumulation(std::int64_t micro_batch, std::int64_t gradient_accumulation_steps);
  // At an accumulation boundary with no scope open (UsageError otherwise): zeroes the optimizer's moments
  // (exp_avg and exp_avg_sq, on the device and in offloaded host memory) and restarts Adam's bias
  // correction, as a freshly made optimizer would have them. Master weights, params and the lr schedule
  // are untouched. Every rank calls it (each resets its own shard).
  void reset_moments();
  // Multiplies the lr of the following steps (after the schedule, before each param's lr_scale); 1 by
  // default. StepResult::lr reports the product. Not part of a checkpoint (a caller that ramps it keeps
  // its own state). Finite and >= 0, else UsageError.
  void set_lr_factor(double factor);
  double lr_factor() const;

  // Collective: the full tensor of `param` as fp32 on every rank (for tests, reports and export; it
  // materializes the whole param, so not for the training loop). TensorKind::grad is the accumulated
  // gradient of the current window; exp_avg/exp_avg_sq throw for optimizers without them.
  std::vector<float> gather_tensor(std::string_view param, TensorKind kind);

  // This rank's params and optimizer state by param name and element range, for checkpoints (zero3/ckpt).
  EngineState state();

  Stream& compute_stream();
  Device& device();
  comm::Communicator& communicator();
  // The bootstrap the engine was made with (EngineResources::bootstrap) or made itself.
  std::shared_ptr<comm::Bootstrap> bootstrap() const;
  // The watchdog over this process's collectives (zero3/comm/watchdog.hpp). The engine keeps its
  // progress at every step(); a training loop that tags collectives with its own position sets it there.
  comm::Watchdog& watchdog();
  const config::Config& config() const;
  EngineStats stats() const;
  void reset_peaks();
  MemoryTracker& memory();
  std::int64_t global_step() const;
  std::int64_t skipped_steps() const;
  // Names of the units in declaration order, and of the params of one unit.
  std::vector<std::string> unit_names() const;
  std::vector<ParamSpec> unit_params(std::string_view unit) const;

  class GatherScope {
   public:
    GatherScope(GatherScope&& other) noexcept;
    GatherScope& operator=(GatherScope&&) = delete;
    GatherScope(const GatherScope&) = delete;
    ~GatherScope();  // close(); an error there is kept and thrown by the engine's next call
    // The full param (device memory, compute dtype). UsageError for a name not in this unit or a closed scope.
    BufferView param(std::string_view name) const;
    const std::string& unit() const;
    // Ends the scope now (the unit may stay gathered for reuse; see max_reuse_distance).
    void close();

   private:
    friend class Engine;
    GatherScope(Engine* engine, std::size_t unit_index, std::uint64_t token);
    Engine* engine_;
    std::size_t unit_index_;
    std::uint64_t token_;
  };

  class GradScope {
   public:
    GradScope(GradScope&& other) noexcept;
    GradScope& operator=(GradScope&&) = delete;
    GradScope(const GradScope&) = delete;
    ~GradScope();  // close(); an error there is kept and thrown by the engine's next call
    // The full-size gradient buffer of a trainable param (device memory, compute dtype, zero-filled).
    BufferView grad(std::string_view name) const;
    const std::string& unit() const;
    // Reduce-scatters now.
    void close();

   private:
    friend class Engine;
    GradScope(Engine* engine, std::size_t unit_index, std::uint64_t token);
    Engine* engine_;
    std::size_t unit_index_;
    std::uint64_t token_;
  };

  class UntracedScope {
   public:
    UntracedScope(UntracedScope&& other) noexcept;
    UntracedScope& operator=(UntracedScope&&) = delete;
    UntracedScope(const UntracedScope&) = delete;
    ~UntracedScope();  // close()
    // Gathers are traced again from here on.
    void close();

   private:
    friend class Engine;
    explicit UntracedScope(Engine* engine) : engine_(engine) {}
    Engine* engine_;
  };

 private:
  friend class EngineState;
  struct Impl;  // runtime/engine/engine_impl.hpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero3
