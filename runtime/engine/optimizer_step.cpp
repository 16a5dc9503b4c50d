#include "optimizer_step.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::engine {

namespace {

using config::OptimizerType;

class DeviceShardOptimizer final : public ShardOptimizer {
 public:
  DeviceShardOptimizer(const config::OptimizerConfig& config, StateStorage storage, Device& device, Stream& stream,
                       std::size_t count, std::size_t sharded_count, std::vector<StateSegment> segments)
      : config_(config), sharded_count_(std::min(sharded_count, count)), segments_(std::move(segments)) {
    ZERO3_CHECK(kernels::optimizer_storage_supported(storage.master, storage.state),
                "device optimizer: unsupported master/state dtypes");
    master_ = device.allocate(count, storage.master, MemoryKind::device, MemCategory::master);
    acc_ = device.allocate(count, DType::f32, MemoryKind::device, MemCategory::grad_shard);
    const bool has_m = config.type != OptimizerType::adagrad;
    const bool has_v = config.type != OptimizerType::lion;  // Adagrad's sum of squares sits here
    if (has_m) exp_avg_ = device.allocate(count, storage.state, MemoryKind::device, MemCategory::optim_state);
    if (has_v) exp_avg_sq_ = device.allocate(count, storage.state, MemoryKind::device, MemCategory::optim_state);
    for (Buffer* b : {&acc_, &exp_avg_, &exp_avg_sq_}) {
      if (!b->empty()) kernels::fill(stream, b->view(), 0.0f);
    }
    const auto one = [](const Buffer& b) { return b.empty() ? StatePieces{} : StatePieces{{0, b.view()}}; };
    tensors_.master = one(master_);
    tensors_.grad = one(acc_);
    tensors_.exp_avg = one(exp_avg_);
    tensors_.exp_avg_sq = one(exp_avg_sq_);
  }

  const StatePieces& pieces(TensorKind kind) const override { return tensors_.get(kind); }

  void accumulate(std::size_t offset, ConstBufferView reduced, Stream& stream) override {
    if (reduced.count == 0) return;
    stream.device().kernels().accumulate(stream, acc_.view().slice(offset, reduced.count), reduced, 1.0f);
  }

  BufferView device_accumulator(std::size_t offset, std::size_t count) override {
    return acc_.view().slice(offset, count);
  }

  void grad_stats(Stream& stream, BufferView scalars, bool check_overflow, bool include_persistent) override {
    const BufferView flag = scalars.slice(0, 1);
    const BufferView sum_sq = scalars.slice(1, 1);
    const BufferView acc = acc_.view();
    if (acc.count == 0) return;
    if (check_overflow) kernels::nonfinite_check(stream, acc, flag);
    kernels::sum_squares(stream, acc.slice(0, sharded_count_), sum_sq, /*accumulate=*/true);
    if (include_persistent && acc.count > sharded_count_) {
      kernels::sum_squares(stream, acc.slice(sharded_count_, acc.count - sharded_count_), sum_sq, /*accumulate=*/true);
    }
  }

  void clear_grads(Stream& stream) override {
    if (!acc_.empty()) kernels::fill(stream, acc_.view(), 0.0f);
  }

  void step(Stream& stream, const OptimizerStepArgs& args, BufferView params) override {
    const kernels::KernelBackend& k = stream.device().kernels();
    const ConstBufferView grads = acc_.cview();
    for (const StateSegment& seg : segments_) {
      const auto lr = static_cast<float>(args.lr * seg.lr_scale);
      const auto wd = static_cast<float>(seg.weight_decay ? config_.weight_decay : 0.0);
      const BufferView master = master_.view().slice(seg.offset, seg.count);
      const ConstBufferView grad = grads.slice(seg.offset, seg.count);
      const BufferView param = params.slice(seg.offset, seg.count);
      switch (config_.type) {
        case OptimizerType::adam:
        case OptimizerType::adamw:
          k.adam_step(stream, adam_args(config_, args, lr, wd), master, exp_avg_.view().slice(seg.offset, seg.count),
                      exp_avg_sq_.view().slice(seg.offset, seg.count), grad, param);
          break;
        case OptimizerType::lion:
          k.lion_step(stream, lion_args(args, lr, wd), master, exp_avg_.view().slice(seg.offset, seg.count), grad,
                      param);
          break;
        case OptimizerType::adagrad:
          k.adagrad_step(stream, adagrad_args(config_, args, lr, wd), master,
                         exp_avg_sq_.view().slice(seg.offset, seg.count), grad, param);
          break;
      }
    }
  }

 private:
  config::OptimizerConfig config_;
  std::size_t sharded_count_ = 0;
  std::vector<StateSegment> segments_;
  Buffer master_;
  Buffer acc_;
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
  StateTensors tensors_;
};

}  // namespace

kernels::AdamArgs adam_args(const config::OptimizerConfig& config, const OptimizerStepArgs& args, float lr,
                            float weight_decay) {
  kernels::AdamArgs a;
  a.lr = lr;
  a.beta1 = static_cast<float>(args.betas[0]);
  a.beta2 = static_cast<float>(args.betas[1]);
  a.eps = static_cast<float>(config.eps);
  a.weight_decay = weight_decay;
  a.adamw = config.decoupled_weight_decay;
  a.bias_correction = config.bias_correction;
  a.step = args.step;
  a.grad_scale = args.grad_scale;
  return a;
}

kernels::LionArgs lion_args(const OptimizerStepArgs& args, float lr, float weight_decay) {
  kernels::LionArgs a;
  a.lr = lr;
  a.beta1 = static_cast<float>(args.betas[0]);
  a.beta2 = static_cast<float>(args.betas[1]);
  a.weight_decay = weight_decay;
  a.grad_scale = args.grad_scale;
  return a;
}

kernels::AdagradArgs adagrad_args(const config::OptimizerConfig& config, const OptimizerStepArgs& args, float lr,
                                  float weight_decay) {
  kernels::AdagradArgs a;
  a.lr = lr;
  a.eps = static_cast<float>(config.eps);
  a.weight_decay = weight_decay;
  a.grad_scale = args.grad_scale;
  return a;
}

std::unique_ptr<ShardOptimizer> make_device_optimizer(const config::OptimizerConfig& optimizer, StateStorage storage,
                                                      Device& device, Stream& stream, std::size_t count,
                                                      std::size_t sharded_count, std::vector<StateSegment> segments) {
  return std::make_unique<DeviceShardOptimizer>(optimizer, storage, device, stream, count, sharded_count,
                                                std::move(segments));
}

OptimizerStep::OptimizerStep(const Wiring& wiring, std::unique_ptr<ShardOptimizer> optimizer, BufferView params,
                             comm::Bootstrap& bootstrap)
    : layout_(wiring.layout),
      config_(wiring.config),
      device_(wiring.device),
      comm_(wiring.communicator),
      stream_(wiring.comm_stream),
      optimizer_(std::move(optimizer)),
      params_(params),
      schedule_(optim::LrSchedule::create(wiring.config.scheduler ? &*wiring.config.scheduler : nullptr,
                                          *wiring.config.optimizer)),
      scaler_(optim::LossScaler::from_config(wiring.config)),
      bootstrap_(bootstrap),
      nonfinite_(wiring.config.zero3.nonfinite, wiring.communicator.rank()) {
  scalars_ = device_.allocate(kStepScalars, DType::f32, MemoryKind::device, MemCategory::workspace);
  const MemoryKind host_kind = device_.caps().host_staging;
  host_scalars_ = device_.allocate(kStepScalars, DType::f32, host_kind, MemCategory::staging);
  host_marks_ = device_.allocate(kStepScalars, DType::f32, host_kind, MemCategory::staging);
}

StepOutcome OptimizerStep::run(const WindowMarks& marks) {
  const trace::Label label("optimizer step");
  // The previous run() synchronized its stream after the scalars' copies, so none still reads host_marks_.
  float* m = host_marks_.view().as<float>();
  m[0] = 0.0f;
  m[1] = 0.0f;
  m[2] = marks.nonfinite_loss ? 1.0f : 0.0f;
  m[3] = marks.discard ? 1.0f : 0.0f;
  m[4] = marks.stop ? 1.0f : 0.0f;
  m[5] = marks.memory_high ? 1.0f : 0.0f;
  m[6] = marks.memory_low ? 1.0f : 0.0f;
  device_.copy_async(scalars_.view(), host_marks_.cview(), stream_);
  // Sharded accumulators are disjoint across ranks; persistent ones are identical on every rank (the
  // all-reduce gives bitwise equal results), so rank 0 alone adds them to count them once.
  optimizer_->grad_stats(stream_, scalars_.view().slice(0, 2), scaler_.checks_overflow(), comm_.rank() == 0);
  // One all-reduce for all of them: the flags add up to the number of ranks that saw or marked something.
  {
    const comm::ScopedOpAnnotation note("step", "grad_stats");
    comm_.all_reduce(scalars_.view(), comm::ReduceOp::sum, stream_);
  }
  device_.copy_async(host_scalars_.view(), scalars_.cview(), stream_);
  // The stream, not an event: it waits for the same work (the scalars are its last), and it also throws
  // when a collective of this step failed, so no rank steps on a failed reduction's values while the
  // failure handler is bringing the job down.
  stream_.synchronize();
  const float* h = host_scalars_.view().as<float>();
  const float overflow_flag = h[0];
  const double total_sq = h[1];

  StepOutcome out;
  out.stop_requests = static_cast<int>(h[4]);
  out.memory_high_ranks = static_cast<int>(h[5]);
  out.memory_low_ranks = static_cast<int>(h[6]);
  out.loss_scale = scaler_.scale();
  out.next_loss_scale = out.loss_scale;
  const double norm = std::sqrt(total_sq);  // of the scaled gradients
  out.grad_norm = norm / out.loss_scale;
  if (overflow_flag != 0.0f) {  // fp16: the loss scaler's overflow
    optimizer_->clear_grads(stream_);
    scaler_.update(true);
    out.next_loss_scale = scaler_.scale();
    return out;
  }
  // Any Inf/NaN element makes the squared norm Inf/NaN (the sum is taken in fp64 and adds only squares),
  // so this check reads nothing the norm did not; a finite-element norm past fp32's range is caught too.
  if (!std::isfinite(total_sq) || h[2] != 0.0f || h[3] != 0.0f) return skip(out, marks, h[2]);

  // DeepSpeed's unscale_and_clip_grads: c = max(1, (N / scale + 1e-6) / clip); gradients times 1 / (c * scale).
  double coefficient = 1.0;
  if (config_.gradient_clipping > 0.0) {
    coefficient = std::max(1.0, (out.grad_norm + 1e-6) / config_.gradient_clipping);
  }
  const optim::LrValues lr = schedule_->current();
  OptimizerStepArgs args;
  args.lr = lr.lr * lr_factor_;
  args.betas = lr.betas.value_or(config_.optimizer->betas);
  args.grad_scale = static_cast<float>(1.0 / (coefficient * out.loss_scale));
  args.step = applied_steps_ + 1;
  step_everywhere(args, marks.step);
  optimizer_->clear_grads(stream_);

  schedule_->advance();
  scaler_.update(false);
  ++applied_steps_;
  nonfinite_.applied();
  out.applied = true;
  out.lr = args.lr;
  out.next_loss_scale = scaler_.scale();
  return out;
}

StepOutcome OptimizerStep::skip(StepOutcome out, const WindowMarks& marks, float loss_ranks) {
  const bool nonfinite = !std::isfinite(out.grad_norm) || loss_ranks != 0.0f;
  if (!nonfinite) {  // discarded by a rank: nothing is wrong with the numbers
    optimizer_->clear_grads(stream_);
    out.discarded = true;
    return out;
  }
  // The rare path: where the Inf/NaN is, from every rank's shard, before the accumulators are cleared.
  const NonfiniteReport report = locate_nonfinite(layout_, *optimizer_, device_, stream_, bootstrap_,
                                                  marks.nonfinite_loss, marks.step, out.grad_norm);
  optimizer_->clear_grads(stream_);
  out.nonfinite = true;
  nonfinite_.skipped(report);  // throws when the policy ends the run
  return out;
}

void ShardOptimizer::zero_moments(Stream& stream) {
  bool synchronized = false;
  for (const TensorKind kind : {TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    for (const StatePiece& piece : pieces(kind)) {
      if (piece.view.count == 0) continue;
      if (piece.view.kind == MemoryKind::device) {
        kernels::fill(stream, piece.view, 0.0f);
        continue;
      }
      if (!synchronized) {  // host memory (offload): no queued work may still read or write it
        stream.synchronize();
        prepare_read();
        synchronized = true;
      }
      std::memset(piece.view.data, 0, piece.view.size_bytes());
    }
  }
}

void OptimizerStep::step_everywhere(const OptimizerStepArgs& args, std::int64_t step) {
  // Params on NVMe: none in memory (the optimizer writes them to their file).
  const BufferView params = params_.data == nullptr ? BufferView{} : params_.slice(0, layout_.state_count);
  if (!optimizer_->step_may_fail_locally()) {
    optimizer_->step(stream_, args, params);
    return;
  }
  std::string failure;
  try {
    optimizer_->step(stream_, args, params);
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "unknown error";
  }
  // One all-gather of the (empty) messages' lengths when every rank succeeded.
  const std::vector<std::string> all = comm::all_gather_strings(bootstrap_, failure);
  const auto failed = std::find_if(all.begin(), all.end(), [](const std::string& m) { return !m.empty(); });
  if (failed == all.end()) return;
  const auto rank = static_cast<int>(failed - all.begin());
  throw IoError(fmt::format(
      "step {}: rank {} could not update its offloaded optimizer state: {}{}", step, rank, *failed,
      rank == bootstrap_.rank() ? ""
                                : "; that rank's update is incomplete, so every rank stops at this step (resume "
                                  "from the last checkpoint)"));
}

void OptimizerStep::reset_moments() {
  optimizer_->zero_moments(stream_);
  applied_steps_ = 0;  // bias correction restarts, so the first steps after the reset are not overscaled
}

void OptimizerStep::fill_state(TrainingState& state) const {
  state.applied_steps = applied_steps_;
  state.lr_iteration = schedule_->iteration();
  const optim::LossScaler::State& s = scaler_.state();
  state.loss_scale = s.scale;
  state.scaler_iteration = s.iteration;
  state.scaler_last_overflow = s.last_overflow;
  state.scaler_hysteresis_left = s.hysteresis_left;
}

void OptimizerStep::restore_state(const TrainingState& state) {
  applied_steps_ = state.applied_steps;
  schedule_->set_iteration(state.lr_iteration);
  optim::LossScaler::State s;
  s.scale = state.loss_scale;
  s.iteration = state.scaler_iteration;
  s.last_overflow = state.scaler_last_overflow;
  s.hysteresis_left = state.scaler_hysteresis_left;
  scaler_.restore(s);
}

}  // namespace zero3::engine
