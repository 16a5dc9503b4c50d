// What `zero3 train` drives: a next-token model computed one engine unit at a time over the full params
// the engine gathered, writing each unit's gradients into the engine's gradient buffers. Implementations:
// the GPT on the host (OpenBLAS) and on CUDA (cuBLAS + kernels), the MLP on the host. The trainer owns the
// order of calls (every unit's forward, loss(), every unit's backward in reverse); the model owns its
// activations and scratch, never params or grads.
//
// Streams: params and grads are valid for work enqueued on `stream` (the engine's compute stream) while
// their scopes are open. A host model synchronizes `stream` before it touches them and computes on the
// calling thread; a device model enqueues its work on `stream` and returns without waiting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/core/recompute.hpp"
#include "zero3/device/device.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::models {

enum class Pass : std::uint8_t { train, eval };

class UnitModel {
 public:
  virtual ~UnitModel() = default;

  // The engine units in forward order (declare them all to the engine before finalize()).
  virtual const std::vector<UnitSpec>& units() const = 0;
  // Human-readable one-line description ("GPT 2 layers, hidden 64, ...").
  virtual std::string describe() const = 0;

  // The micro-batch: `batch` windows, each `len` input tokens and `len` targets, row-major [batch, len],
  // on the host; ids in [0, vocab). The model copies what it needs. batch == 0 is allowed for an eval pass
  // (a rank with no held-out samples still opens every unit's scope; the model then computes nothing).
  // Throws UsageError naming the first bad id or size.
  virtual void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                         int len, Pass pass) = 0;

  // `params[k]` is the k-th param of unit `unit` in units() order: full size, the engine's compute dtype
  // (f32, bf16 or f16), in the memory the engine's device computes on.
  virtual void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) = 0;
  // Mean loss (nats per predicted token) of the last completed forward of the head; waits for it.
  virtual double loss(Stream& stream) = 0;
  // Backward of `unit` after every forward of a train pass, in reverse unit order. The loss gradient is
  // multiplied by `seed_scale` (Engine::loss_multiplier()). `grads[k]` is the zero-filled gradient buffer
  // of the k-th param (same dtype and memory as the params); the model writes (or adds into) it.
  virtual void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                             float seed_scale, Stream& stream) = 0;

  // Activation checkpointing (zero3/core/recompute.hpp): whether the model can run `mode`, and the switch,
  // made between passes. A mode changes what is kept from forward to backward, never the results: a model
  // that offers full or selective recomputation gives bitwise the gradients of Recompute::none. The default
  // offers none but Recompute::none.
  virtual bool can_recompute(Recompute mode) const { return mode == Recompute::none; }
  virtual void set_recompute(Recompute mode) {
    if (mode != Recompute::none) {
      throw UsageError(describe() + " cannot recompute its activations (activation checkpointing \"" +
                       std::string(to_string(mode)) + "\")");
    }
  }

  // DeepSpeed's activation_checkpointing.cpu_checkpointing, with Recompute::full: the unit inputs the model
  // keeps move to host memory after the forward that last reads them and come back for the backward that
  // reads them; gradients stay bitwise those without. Whether the model offers it, and the switch (between
  // passes, after set_recompute(Recompute::full); UsageError otherwise). The default offers nothing.
  virtual bool can_offload_kept_inputs() const { return false; }
  virtual void set_offload_kept_inputs(bool on) {
    if (on) throw UsageError(describe() + " cannot keep its checkpointed inputs in host memory (cpu_checkpointing)");
  }
  // What the offload holds in host memory now, and the copy time since the last call that the compute
  // waited for (milliseconds, exposed; 0 when copies ran behind compute).
  struct KeptInputsOffload {
    std::size_t host_bytes = 0;
    double exposed_copy_ms = 0.0;
  };
  virtual KeptInputsOffload take_kept_inputs_offload() { return {}; }

  // Bytes of activations and scratch the model holds now, and where they live (for the memory report's
  // activations category). Called on the calling thread while work enqueued on the stream may still run:
  // it must read only what the calling thread sets (sizes fixed by set_batch, not by enqueued work).
  virtual std::size_t activation_bytes() const = 0;
  virtual MemoryKind activation_memory() const = 0;

  // What activation_bytes() reports once the passes of a job have run: train passes of `shape.micro_batch`
  // sequences and held-out passes of `shape.eval_batch` (0: none), `shape.len` tokens each, with the
  // engine's params in `shape.params` dtype. For the memory plan (zero3/engine/memory_plan.hpp), before
  // anything is computed; 0 (the default) for a model that cannot say.
  struct ActivationShape {
    int micro_batch = 0;
    int eval_batch = 0;
    int len = 0;
    DType params = DType::f32;
    Recompute recompute = Recompute::none;
    bool offload_kept_inputs = false;  // cpu_checkpointing: planned_offloaded_bytes() holds the kept inputs
  };
  virtual std::size_t planned_activation_bytes(const ActivationShape& shape) const {
    (void)shape;
    return 0;
  }
  // With shape.offload_kept_inputs: the bytes of kept inputs in host memory at the end of a train forward.
  virtual std::size_t planned_offloaded_bytes(const ActivationShape& shape) const {
    (void)shape;
    return 0;
  }
};

}  // namespace zero3::models
