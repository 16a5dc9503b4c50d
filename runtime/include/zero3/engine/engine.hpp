// The ZeRO-3 engine: parameters, gradients and optimizer state partitioned over the ranks of a job.
//
// A trainer declares units (named groups of named params, gathered and released as a whole; usually one
// layer or block) in any order, calls finalize() (collective) to partition and initialize them, and then
// per micro-batch: opens a GatherScope per unit in forward (full params on the device, in the compute
// dtype), opens GatherScope + GradScope per unit in backward (writes full-size grads; closing the
// GradScope reduce-scatters them into this rank's shard), and calls step() once per micro-batch (it acts
// at the gradient-accumulation boundary). Gathers are prefetched from the unit order traced in the first
// step, on a communication stream, and joined to the compute stream with events.
//
// Threading: one host thread drives an Engine. Compute goes on compute_stream(); pointers in scopes are
// valid for work enqueued on compute_stream() while the scope is open. All collective calls (finalize,
// step, gather_tensor) must be made by every rank in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/core/buffer_view.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/device/device.hpp"

namespace zero3 {

// How a param's initial values are made. Every element's value comes from a counter-based RNG keyed by
// (seed, param name, element index), so the model is identical for every world size and each rank
// materializes only the elements it keeps.
struct ParamInit {
  enum class Kind { normal, uniform, constant, custom };
  Kind kind = Kind::constant;
  double a = 0.0;  // normal: mean; uniform: low; constant: value
  double b = 0.0;  // normal: std; uniform: high
  // custom: fill out[i] with the value of flat (row-major) element `first + i` of the param.
  std::function<void(std::uint64_t first, std::span<float> out)> fill;

  static ParamInit normal(double std, double mean = 0.0) { return {Kind::normal, mean, std, {}}; }
  static ParamInit uniform(double low, double high) { return {Kind::uniform, low, high, {}}; }
  static ParamInit zeros() { return {Kind::constant, 0.0, 0.0, {}}; }
  static ParamInit ones() { return {Kind::constant, 1.0, 0.0, {}}; }
  static ParamInit constant(double v) { return {Kind::constant, v, 0.0, {}}; }
  static ParamInit custom(std::function<void(std::uint64_t, std::span<float>)> f) {
    return {Kind::custom, 0.0, 0.0, std::move(f)};
  }
};

struct ParamSpec {
  std::string name;                 // unique in the model, e.g. "layers.3.attn.qkv.weight"
  std::vector<std::int64_t> shape;  // row-major; an empty shape is a scalar, a 0 extent a zero-size param
  ParamInit init = ParamInit::zeros();
  bool trainable = true;     // frozen params: sharded and gathered, but no gradient and no optimizer state
  bool weight_decay = true;  // false for biases and norms
  double lr_scale = 1.0;     // multiplies the scheduled lr for this param

  std::size_t numel() const;
};

struct UnitSpec {
  std::string name;  // unique, e.g. "layers.3"
  std::vector<ParamSpec> params;
};

// What step() did.
struct StepResult {
  bool boundary = false;    // false: a micro-step inside an accumulation window; nothing else below is set
  bool applied = false;     // false at a boundary: skipped for fp16 overflow
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradient (before clipping); NaN/Inf on overflow
  double lr = 0.0;          // the lr this step applied (before per-param lr_scale); 0 when skipped
  double loss_scale = 1.0;  // the scale the step's gradients carried
  double next_loss_scale = 1.0;
  std::int64_t global_step = 0;    // optimizer steps so far, skipped ones included
  std::int64_t skipped_steps = 0;  // of those, skipped for overflow
};

// Host<->device traffic of CPU offload in one accumulation window. Bytes are always counted; times are
// measured only with wall_clock_breakdown (timestamps taken in stream order around each copy, which costs
// a host callback per copy on CUDA).
struct OffloadTimes {
  std::uint64_t d2h_bytes = 0;    // reduced gradients copied to host memory
  std::uint64_t h2d_bytes = 0;    // new params copied to the device after the CPU step, and offloaded param
                                  // shards copied up for their gathers
  double d2h_ms = 0.0;            // time the device-to-host copies ran
  double h2d_ms = 0.0;            // time the host-to-device copies ran
  double copies_hidden_ms = 0.0;  // of d2h_ms + h2d_ms, time during which other work ran (compute-stream
                                  // work of open scopes, the CPU optimizer, the gradient accumulation)
  double cpu_ms = 0.0;            // CPU work: gradient accumulation and the optimizer step
};

// Where the engine's part of the last accumulation window's time went, measured only with
// wall_clock_breakdown. Gather waits come from timestamps taken in stream order around the compute stream's
// wait for each gather (a host callback each on CUDA); at the boundary step() synchronizes the
// communication stream before and after the optimizer so that the two host-side figures are exact (what
// DeepSpeed's wall_clock_breakdown timers do too).
struct StepTimes {
  double gather_wait_ms = 0.0;  // the compute stream stalled until a gather (or an offloaded shard's copy) landed
  double reduce_wait_ms = 0.0;  // step() waiting for the window's reductions (and their copies to host memory)
  double optimizer_ms = 0.0;    // step() after that: norm, clipping, optimizer (CPU under offload), new params
};

// Counters of the engine's work, for tests, benchmarks and reports. Element counts are of params, without
// the layout's padding; the memory tracker (memory()) measures the padded buffers.
struct EngineStats {
  std::uint64_t all_gather_elems = 0;            // params all-gathered (full unit size) since the last boundary
  std::uint64_t reduce_scatter_elems = 0;        // grads reduce-scattered (full unit size) since the last boundary
  std::uint64_t all_reduce_elems = 0;            // grads of persistent units all-reduced (full size) since the boundary
  std::uint64_t last_step_all_gather_elems = 0;  // the same, for the last completed accumulation window
  std::uint64_t last_step_reduce_scatter_elems = 0;
  std::uint64_t last_step_all_reduce_elems = 0;
  std::uint64_t gathered_elems = 0;       // full params currently gathered or in flight (non-persistent units)
  std::uint64_t gathered_peak_elems = 0;  // peak of gathered_elems since finalize() or reset_peaks()
  std::uint64_t persistent_elems = 0;     // elements of persistent units (kept whole on every rank)
  std::uint64_t total_elems = 0;          // elements of all params
  std::uint64_t trace_rebuilds = 0;       // times the gather order changed and the schedule was rebuilt
  // CPU offload traffic of the last completed accumulation window (copies and CPU work complete by its
  // boundary: the previous step's host-to-device copies, this window's gradients).
  OffloadTimes last_step_offload;
  StepTimes last_step_times;  // with wall_clock_breakdown; zeros otherwise
};

// The state the engine keeps per param, for gather_tensor(). exp_avg is Adam's/Lion's first moment;
// exp_avg_sq is Adam's second moment and Adagrad's sum of squared gradients. A frozen param has no master:
// its `master` is its param (compute dtype, widened to fp32).
enum class TensorKind { param, master, exp_avg, exp_avg_sq, grad };
// "param", "master", "exp_avg", "exp_avg_sq", "grad".
std::string_view tensor_kind_name(TensorKind kind);

// A run of elements [first, first + count) of the flattened (row-major) param `param`: the unit of
// exchange between the engine's shards and a checkpoint, whose layout must not depend on the world size.
struct ParamSlice {
  std::string param;
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  bool trainable = true;  // false: frozen, only TensorKind::param exists
};

// The scalars a checkpoint must carry for an exact resume: step counters, the lr schedule's iteration
// (DeepSpeed's last_batch_iteration) and the fp16 loss scaler.
struct TrainingState {
  std::int64_t global_step = 0;    // optimizer steps, skipped ones included
  std::int64_t skipped_steps = 0;  // of those, skipped for overflow
  std::int64_t applied_steps = 0;  // Adam's bias-correction step count
  std::int64_t lr_iteration = 0;
  double loss_scale = 1.0;
  std::int64_t scaler_iteration = 0;
  std::int64_t scaler_last_overflow = -1;
  std::int64_t scaler_hysteresis_left = 1;
};

// Optional pieces a trainer can hand in instead of letting the engine make them from the config.
struct EngineResources {
  std::shared_ptr<Device> device;
  std::shared_ptr<comm::Bootstrap> bootstrap;
  std::shared_ptr<comm::Communicator> communicator;  // on `device`; needs `bootstrap` too
};

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

  // Before finalize(). Duplicate unit or param names, and calls after finalize(), throw UsageError naming them.
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
  GradScope grads(std::string_view unit);
  // Gathers opened while the returned scope lives are made on demand, outside the traced gather order: for
  // a forward-only pass between training steps (held-out loss), which must neither disturb the prefetch
  // schedule nor be prefetched by it. grads() throws meanwhile. Not nestable (UsageError).
  UntracedScope untraced();

  // Multiply the loss by this before backward: loss_scale / gradient_accumulation_steps.
  double loss_multiplier() const;
  double loss_scale() const;

  // Call once per micro-batch, after its backward. At the accumulation boundary: waits for the
  // reductions, checks fp16 gradients for Inf/NaN (all ranks agree; an overflow skips the step with every
  // param and optimizer state untouched), computes the global norm (one all-reduce), clips, runs the
  // optimizer, writes the new low-precision shards, advances the lr schedule and the loss scale.
  StepResult step();

  // Collective: the full tensor of `param` as fp32 on every rank (for tests, reports and export; it
  // materializes the whole param, so not for the training loop). TensorKind::grad is the accumulated
  // gradient of the current window; exp_avg/exp_avg_sq throw for optimizers without them.
  std::vector<float> gather_tensor(std::string_view param, TensorKind kind);

  // ---- Checkpoints (zero3/ckpt). Rank-local, not collective; only at an accumulation boundary (after the
  // window's last step() or before the first micro-batch) with no scope open, else UsageError.
  // The slices this rank holds, in layout order. owned = true: every element of every param exactly once
  // over the ranks (a persistent unit's params on rank 0 only): what a save writes. owned = false:
  // everything this rank keeps (persistent units whole): what a load must fill.
  std::vector<ParamSlice> local_slices(bool owned) const;
  // Bytes of `kind` for `slices`: compute dtype for TensorKind::param, fp32 otherwise.
  std::size_t state_bytes(TensorKind kind, std::span<const ParamSlice> slices) const;
  // Copies this rank's elements of `slices` (each in local_slices(false)) of `kind` (param, master,
  // exp_avg, exp_avg_sq; frozen params: param only) into `out`, back to back, in slice order: compute
  // dtype for param, fp32 for the others. UsageError for a kind the optimizer keeps no state of.
  void read_state(TensorKind kind, std::span<const ParamSlice> slices, std::span<std::byte> out);
  // The reverse: writes them into the rank's shards and optimizer state. Derived copies (persistent
  // units' device copies under offload_param) are refreshed before the call returns.
  void write_state(TensorKind kind, std::span<const ParamSlice> slices, std::span<const std::byte> in);
  // Whether the optimizer keeps `kind` (param and master always; exp_avg: Adam, AdamW, Lion; exp_avg_sq:
  // Adam, AdamW, Adagrad).
  bool keeps_state(TensorKind kind) const;
  TrainingState training_state() const;
  void restore_training_state(const TrainingState& state);

  Stream& compute_stream();
  Device& device();
  comm::Communicator& communicator();
  std::shared_ptr<comm::Bootstrap> bootstrap() const;
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero3
