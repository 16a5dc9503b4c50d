// The optimizer step at an accumulation boundary, in DeepSpeed's ZeRO-3 order (DS_CONFIG §4.4, §5.4):
// fp16 overflow check and global norm (one all-reduce, one small host read), loss-scale update and an early
// return on overflow with every param and state untouched, then unscale and clip folded into the optimizer
// kernels, the lr schedule advanced. The update itself is behind ShardOptimizer: the device implementation
// here runs the fused kernels on the rank's shards; the CPU-offload one (offload/) will keep master and
// state in pinned host memory. Engine thread only; device work goes on the stream given.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "deferred_free.hpp"
#include "layout.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/optim/loss_scaler.hpp"
#include "zero3/optim/lr_schedule.hpp"

namespace zero3::engine {

struct OptimizerStepArgs {
  double lr = 0.0;                // the scheduled lr; each param's lr_scale multiplies it
  std::array<double, 2> betas{};  // the optimizer's, or the schedule's (OneCycle)
  float grad_scale = 1.0f;        // 1 / (loss_scale * clip coefficient)
  std::int64_t step = 1;          // 1-based count of applied steps, for bias correction
};

// The update of this rank's trainable shards: flat fp32 master and state buffers in the layout's state
// order (layout.state_count elements), stepped per StateSegment so lr_scale and weight decay apply per param.
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  // The fp32 master weights.
  virtual BufferView master() = 0;
  // exp_avg (Adam/AdamW/Lion m), exp_avg_sq (Adam/AdamW v; Adagrad's sum of squared gradients); nullopt
  // when this optimizer keeps no such state.
  virtual std::optional<BufferView> state(TensorKind kind) = 0;
  // Non-blocking: enqueues the update from `grads` (fp32 accumulators) on `stream`, writing the new
  // compute-dtype weights into `params` (layout.state_count elements).
  virtual void step(Stream& stream, const OptimizerStepArgs& args, ConstBufferView grads, BufferView params) = 0;
};

// Master and state in device memory (zero-filled on `stream`), updated by the device's fused kernels.
std::unique_ptr<ShardOptimizer> make_device_optimizer(const config::OptimizerConfig& optimizer, Device& device,
                                                      Stream& stream, std::size_t count,
                                                      std::vector<StateSegment> segments);

struct StepOutcome {
  bool applied = false;
  double grad_norm = 0.0;  // unscaled, before clipping
  double lr = 0.0;
  double loss_scale = 1.0;  // the scale this step's gradients carried
  double next_loss_scale = 1.0;
};

class OptimizerStep {
 public:
  struct Context {
    const Layout& layout;
    const config::Config& config;
    Device& device;
    comm::Communicator& comm;
    Stream& stream;  // where the reductions went: the step follows them in stream order
    EventPool& events;
  };
  OptimizerStep(const Context& context, std::unique_ptr<ShardOptimizer> optimizer, BufferView accumulators,
                BufferView params);

  // Collective. Blocks once, to read the overflow flag and the squared norm. Zeroes the accumulators
  // (after use) in either case. Throws Error when an overflow happens at the minimum loss scale.
  StepOutcome run();

  double loss_scale() const { return scaler_.scale(); }
  std::int64_t applied_steps() const { return applied_steps_; }
  ShardOptimizer& optimizer() { return *optimizer_; }

 private:
  const Layout& layout_;
  const config::Config& config_;
  Device& device_;
  comm::Communicator& comm_;
  Stream& stream_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  BufferView accumulators_;
  BufferView params_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  optim::LossScaler scaler_;
  std::int64_t applied_steps_ = 0;
  Buffer scalars_;       // device: [overflow flag, sum of squares]
  Buffer host_scalars_;  // host copy of scalars_
  std::unique_ptr<Event> scalars_ready_;
};

}  // namespace zero3::engine
