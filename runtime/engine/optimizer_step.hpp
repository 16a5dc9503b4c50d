// The optimizer step at an accumulation boundary, in DeepSpeed's ZeRO-3 order (deepspeed/runtime/zero/stage3.py:
// step, _overflow_check_and_loss_scale_update, unscale_and_clip_grads):
// fp16 overflow check and global norm (one all-reduce, one small host read), loss-scale update and an early
// return on overflow with every param and state untouched; for every dtype, an early return likewise when
// the norm is not finite or a rank marked its loss non-finite (zero3.nonfinite, nonfinite_guard.hpp), or
// when a rank discarded the window; then unscale and clip folded into the optimizer kernels, the lr
// schedule advanced. The update itself is behind ShardOptimizer: the device implementation
// here runs the fused kernels on the rank's shards; the CPU-offload one (offload_optimizer.hpp) keeps
// master, state and accumulators in host memory. Engine thread only; device work goes on the stream given.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "deferred_free.hpp"
#include "layout.hpp"
#include "nonfinite_guard.hpp"
#include "state_pieces.hpp"
#include "wiring.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/state.hpp"
#include "zero3/kernels/kernels.hpp"
#include "zero3/optim/loss_scaler.hpp"
#include "zero3/optim/lr_schedule.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::engine {

struct OptimizerStepArgs {
  double lr = 0.0;                // the scheduled lr; each param's lr_scale multiplies it
  std::array<double, 2> betas{};  // the optimizer's, or the schedule's (OneCycle)
  float grad_scale = 1.0f;        // 1 / (loss_scale * clip coefficient)
  std::int64_t step = 1;          // 1-based count of applied steps, for bias correction
};

// How the master weights and the moments are stored (config::Config::master_dtype, optimizer_state_dtype): a
// pair kernels::optimizer_storage_supported allows. The gradient accumulators are always fp32.
struct StateStorage {
  DType master = DType::f32;
  DType state = DType::f32;
  static StateStorage of(const config::Config& config) {
    return {.master = config.master_dtype(), .state = config.optimizer_state_dtype()};
  }
  // Bytes per element of the master, the `states` moments and the fp32 accumulator together.
  std::size_t bytes_per_elem(int states) const {
    return size_of(master) + static_cast<std::size_t>(states) * size_of(state) + sizeof(float);
  }
};

// This rank's optimizer state and gradient accumulators, and the update: the master, the moments (each in
// the StateStorage's dtype) and the fp32 gradient accumulators, in the layout's state order, stepped per
// StateSegment so lr_scale and weight decay apply per param. copy_out and copy_in speak fp32 whatever the
// storage: they widen exactly and narrow by rounding to nearest even. Engine thread only; stream work goes on
// the stream passed.
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  // Where a tensor lives: master, exp_avg (Adam/AdamW/Lion m), exp_avg_sq (Adam/AdamW v; Adagrad's sum of
  // squared gradients), grad (the accumulators). Empty for a state this optimizer keeps no such state.
  // Optimizers whose state is not in memory (NVMe offload) return an empty set for every kind: read and
  // write through keeps(), copy_out() and copy_in(), which work for every optimizer.
  virtual const StatePieces& pieces(TensorKind kind) const = 0;
  // Whether this optimizer keeps `kind` (master and grad: always).
  virtual bool keeps(TensorKind kind) const { return !pieces(kind).empty(); }
  // After prepare_read(): elements [offset, offset + dst.count) of `kind` into dst (any memory kind, fp32),
  // enqueued on `stream`; an optimizer whose state is in files reads them and returns when dst is written.
  virtual void copy_out(Device& device, TensorKind kind, std::size_t offset, BufferView dst, Stream& stream) {
    copy_from_pieces(device, pieces(kind), offset, dst, stream);
  }
  // After prepare_read(): src (fp32, any memory kind) into elements [offset, offset + src.count) of `kind`,
  // enqueued on `stream` (in files: written when the call returns).
  virtual void copy_in(Device& device, TensorKind kind, std::size_t offset, ConstBufferView src, Stream& stream) {
    copy_into_pieces(device, pieces(kind), offset, src, stream);
  }
  // Zeroes exp_avg and exp_avg_sq (device memory: enqueued on `stream`; host memory or files: blocks).
  virtual void zero_moments(Stream& stream);
  // Whether step() may fail on one rank alone (file I/O): then the ranks agree on its outcome after each step,
  // so that a failure stops every rank with the failing rank's error.
  virtual bool step_may_fail_locally() const { return false; }
  // Whether the micro-batch whose gradients arrive next ends the accumulation window (its gradients are
  // the window's last, so statistics taken as they arrive are final).
  virtual void set_final_micro_step(bool final) { (void) final; }
  // Before the host reads pieces(kind) (after synchronizing `stream`): gradients still on their way to
  // host memory have landed and accumulators no gradient reached this window read as 0.
  virtual void prepare_read() {}
  // Non-blocking: adds `reduced` (this rank's reduced gradient piece, comm dtype, device memory) into
  // accumulator elements [offset, offset + reduced.count), in stream order after the work on `stream`;
  // `reduced` may be overwritten by work enqueued on `stream` after this call.
  virtual void accumulate(std::size_t offset, ConstBufferView reduced, Stream& stream) = 0;
  // Accumulator elements [offset, offset + count) as device memory a gradient may be written into
  // directly (world size 1: the reduction of one rank is the gradient itself), or an empty view where the
  // accumulators are elsewhere (host memory). Zero between clear_grads() and the first write.
  virtual BufferView device_accumulator(std::size_t offset, std::size_t count) {
    (void)offset;
    (void)count;
    return {};
  }
  // At the boundary: enqueues on `stream` the addition of this rank's [non-finite flag, sum of squares] of
  // the accumulators into `scalars` (device memory, fp32 x 2). The flag is counted only when
  // `check_overflow`; the persistent range [sharded_count, state_count) only when `include_persistent`.
  // May block the host until gradients still on their way to host memory have arrived.
  virtual void grad_stats(Stream& stream, BufferView scalars, bool check_overflow, bool include_persistent) = 0;
  // The update from the accumulators, writing the new compute-dtype weights into `params` (state_count
  // elements, in the param shards' memory). Device work is enqueued on `stream`; CPU work blocks the host,
  // with the copies of its results enqueued on `stream` as they are ready.
  virtual void step(Stream& stream, const OptimizerStepArgs& args, BufferView params) = 0;
  // The window's gradients are consumed (after a step or a skipped one): the next window starts from 0.
  virtual void clear_grads(Stream& stream) = 0;
};

// The kernel argument structs for one segment: `lr` and `weight_decay` already per param.
kernels::AdamArgs adam_args(const config::OptimizerConfig& config, const OptimizerStepArgs& args, float lr,
                            float weight_decay);
kernels::LionArgs lion_args(const OptimizerStepArgs& args, float lr, float weight_decay);
kernels::AdagradArgs adagrad_args(const config::OptimizerConfig& config, const OptimizerStepArgs& args, float lr,
                                  float weight_decay);

// Master, state and accumulators in device memory (zero-filled on `stream`), updated by the device's
// fused kernels. `sharded_count`: the first elements that belong to sharded units (the rest are persistent).
std::unique_ptr<ShardOptimizer> make_device_optimizer(const config::OptimizerConfig& optimizer, StateStorage storage,
                                                      Device& device, Stream& stream, std::size_t count,
                                                      std::size_t sharded_count, std::vector<StateSegment> segments);

// The step's all-reduced scalars: [overflow flag, sum of squares, non-finite loss marks, discard marks, stop
// marks, memory-high marks, memory-low marks].
inline constexpr std::size_t kStepScalars = 7;

// What the ranks marked the window with before its boundary (Engine::discard_window); the step's
// all-reduce makes a mark of any rank count on every rank.
struct WindowMarks {
  bool nonfinite_loss = false;
  bool discard = false;
  bool stop = false;         // this rank asks every rank to stop after this boundary (Engine::mark_stop_request)
  bool memory_high = false;  // Engine::mark_memory_pressure
  bool memory_low = false;
  std::int64_t step = 0;  // the global step number this boundary is (1-based), for reports
};

struct StepOutcome {
  bool applied = false;
  bool nonfinite = false;  // not applied: non-finite gradients or loss (zero3.nonfinite)
  bool discarded = false;  // not applied: a rank discarded the window
  double grad_norm = 0.0;  // unscaled, before clipping
  double lr = 0.0;
  double loss_scale = 1.0;  // the scale this step's gradients carried
  double next_loss_scale = 1.0;
  int stop_requests = 0;  // ranks whose window carried a stop mark (equal on every rank)
  int memory_high_ranks = 0;
  int memory_low_ranks = 0;
};

class OptimizerStep {
 public:
  // Runs on wiring.comm_stream, where the reductions went: the step follows them in stream order.
  // `bootstrap`: the job's, for the agreement on a non-finite step's report.
  OptimizerStep(const Wiring& wiring, std::unique_ptr<ShardOptimizer> optimizer, BufferView params,
                comm::Bootstrap& bootstrap);

  // Collective. Blocks once, to read the overflow flag, the squared norm and the window marks (one
  // all-reduce of 7 floats). Zeroes the accumulators (after use) in every case. Throws Error when an
  // overflow happens at the minimum loss scale, NonFiniteError when zero3.nonfinite ends the run.
  StepOutcome run(const WindowMarks& marks);

  // Zeroes the moments (exp_avg, exp_avg_sq, on the device and in host memory) and restarts Adam's bias
  // correction, as a fresh optimizer would start. Enqueued on the comm stream (host memory: blocks).
  void reset_moments();
  // Multiplies the schedule's lr of the following steps (1: the schedule's own).
  void set_lr_factor(double factor) { lr_factor_ = factor; }
  double lr_factor() const { return lr_factor_; }

  double loss_scale() const { return scaler_.scale(); }
  std::int64_t applied_steps() const { return applied_steps_; }
  // Checkpoint support: the counters, the schedule's iteration and the loss scaler.
  void fill_state(TrainingState& state) const;
  void restore_state(const TrainingState& state);
  ShardOptimizer& optimizer() { return *optimizer_; }

 private:
  // optimizer_->step(); where it may fail on one rank, every rank throws that rank's error (IoError).
  void step_everywhere(const OptimizerStepArgs& args, std::int64_t step);

  const Layout& layout_;
  const config::Config& config_;
  Device& device_;
  comm::Communicator& comm_;
  Stream& stream_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  BufferView params_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  optim::LossScaler scaler_;
  comm::Bootstrap& bootstrap_;
  NonfiniteGuard nonfinite_;
  std::int64_t applied_steps_ = 0;
  double lr_factor_ = 1.0;
  // device: [overflow flag, sum of squares, ranks with a non-finite loss, ranks that discarded the window,
  // ranks that asked to stop]
  Buffer scalars_;
  Buffer host_scalars_;  // host copy of scalars_
  Buffer host_marks_;    // this rank's marks, copied into scalars_ before the statistics are added

  // run()'s early return for a step that is not applied.
  StepOutcome skip(StepOutcome out, const WindowMarks& marks, float loss_ranks);
};

}  // namespace zero3::engine
