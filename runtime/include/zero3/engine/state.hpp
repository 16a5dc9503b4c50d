// The engine's state as a checkpoint sees it: which tensors it keeps per param, the slices of them a rank
// holds, and EngineState (Engine::state()), the view that reads and writes them rank-locally by param name
// and element range, so a checkpoint's layout does not depend on the world size (zero3/ckpt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero3 {

class Engine;

// The state the engine keeps per param (Engine::gather_tensor, EngineState). exp_avg is Adam's/Lion's first
// moment; exp_avg_sq is Adam's second moment and Adagrad's sum of squared gradients. A frozen param has no
// master: its `master` is its param (compute dtype, widened to fp32).
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
  std::int64_t skipped_steps = 0;  // of those, not applied (fp16 overflow, non-finite, discarded)
  std::int64_t applied_steps = 0;  // Adam's bias-correction step count (restarted by Engine::reset_moments)
  std::int64_t lr_iteration = 0;
  double loss_scale = 1.0;
  std::int64_t scaler_iteration = 0;
  std::int64_t scaler_last_overflow = -1;
  std::int64_t scaler_hysteresis_left = 1;
};

// A view of one engine's state for checkpoints, from Engine::state(); valid while the engine lives (a view,
// like std::span: const methods may change the engine's state). Rank-local, never collective. Every call
// needs finalize() to have run; read_state, write_state and restore_training_state also need an
// accumulation boundary (after the window's last step() or before the first micro-batch) with no scope open.
// Otherwise UsageError.
class EngineState {
 public:
  // The slices this rank holds, in layout order. owned = true: every element of every param exactly once
  // over the ranks (a persistent unit's params on rank 0 only): what a save writes. owned = false:
  // everything this rank keeps (persistent units whole): what a load must fill.
  std::vector<ParamSlice> local_slices(bool owned) const;
  // Bytes of `kind` for `slices`: compute dtype for TensorKind::param, fp32 otherwise.
  std::size_t state_bytes(TensorKind kind, std::span<const ParamSlice> slices) const;
  // Copies this rank's elements of `slices` (each in local_slices(false)) of `kind` (param, master,
  // exp_avg, exp_avg_sq; frozen params: param only) into `out`, back to back, in slice order: compute
  // dtype for param, fp32 for the others (16-bit master weights and moments widened exactly). UsageError for
  // a kind the optimizer keeps no state of.
  void read_state(TensorKind kind, std::span<const ParamSlice> slices, std::span<std::byte> out) const;
  // The reverse: writes them into the rank's shards and optimizer state (rounded to nearest even where the
  // optimizer stores 16 bits). Derived copies (persistent units' device copies under offload_param) are
  // refreshed before the call returns.
  void write_state(TensorKind kind, std::span<const ParamSlice> slices, std::span<const std::byte> in) const;
  // Whether the optimizer keeps `kind` (param and master always; exp_avg: Adam, AdamW, Lion; exp_avg_sq:
  // Adam, AdamW, Adagrad).
  bool keeps_state(TensorKind kind) const;
  TrainingState training_state() const;
  void restore_training_state(const TrainingState& state) const;

 private:
  friend class Engine;
  explicit EngineState(Engine* engine) : engine_(engine) {}
  Engine* engine_;
};

}  // namespace zero3
