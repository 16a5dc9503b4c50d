// What the engine reports: the result of one Engine::step() and the counters of Engine::stats().
#pragma once

#include <cstdint>

namespace zero3 {

// What step() did.
struct StepResult {
  bool boundary = false;    // false: a micro-step inside an accumulation window; nothing else below is set
  bool applied = false;     // false at a boundary: skipped (fp16 overflow, or one of the two below)
  bool nonfinite = false;   // skipped: Inf/NaN gradients or a rank's non-finite loss (zero3.nonfinite)
  bool discarded = false;   // skipped: a rank discarded the window (Engine::discard_window, requested)
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradient (before clipping); NaN/Inf on overflow
  double lr = 0.0;          // the lr this step applied (schedule x lr factor, before lr_scale); 0 when skipped
  double loss_scale = 1.0;  // the scale the step's gradients carried
  double next_loss_scale = 1.0;
  std::int64_t global_step = 0;    // optimizer steps so far, skipped ones included
  std::int64_t skipped_steps = 0;  // of those, not applied (any reason above)
  int stop_requests = 0;           // ranks that marked this window with Engine::mark_stop_request()
  int memory_high_ranks = 0;       // ranks that marked it with Engine::mark_memory_pressure(high)
  int memory_low_ranks = 0;        // and with low
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

// NVMe offload's disk traffic in one accumulation window, per rank (always measured: byte counts and the
// time threads blocked on the disk, from zero3/offload/aio.hpp's counters). "step": the optimizer update,
// which reads master, moments and accumulators and writes master and moments; "grad": the gradients of the
// window (logs and accumulators written by the gradient worker, logs read back).
struct DiskTimes {
  std::uint64_t step_read_bytes = 0;
  std::uint64_t step_write_bytes = 0;
  std::uint64_t grad_read_bytes = 0;
  std::uint64_t grad_write_bytes = 0;
  double step_ms = 0.0;       // the update, from its first read to its last write on the disk
  double step_wait_ms = 0.0;  // of step_ms, the engine thread blocked on the disk (not hidden by the CPU step)
  double grad_wait_ms = 0.0;  // the gradient worker blocked on the disk
  // NVMe offload of params: read for the window's gathers, and the time gathers blocked on those reads.
  std::uint64_t param_read_bytes = 0;
  double param_wait_ms = 0.0;

  DiskTimes& operator+=(const DiskTimes& o) {
    step_read_bytes += o.step_read_bytes;
    step_write_bytes += o.step_write_bytes;
    grad_read_bytes += o.grad_read_bytes;
    grad_write_bytes += o.grad_write_bytes;
    step_ms += o.step_ms;
    step_wait_ms += o.step_wait_ms;
    grad_wait_ms += o.grad_wait_ms;
    param_read_bytes += o.param_read_bytes;
    param_wait_ms += o.param_wait_ms;
    return *this;
  }
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
  DiskTimes last_step_disk;   // NVMe offload of the optimizer; zeros otherwise
  StepTimes last_step_times;  // with wall_clock_breakdown; zeros otherwise
};

}  // namespace zero3
