// The CPU side of optimizer offload: fused optimizer steps and gradient accumulation over host memory,
// vectorized with AVX-512, AVX2 or scalar code chosen at run time, and a thread pool that runs them over
// cache-sized tiles. The per-element arithmetic is kernels/math/optim_math.hpp's, in the same order and without
// FMA contraction, and 16-bit master weights and states are rounded by zero3/core/dtype.hpp's round to nearest
// even (kernels/kernels.hpp's rule), so every path gives the same bits as the scalar path and as the host
// device's kernels (where two different NaNs meet in one operation, which one comes out is unspecified: the
// result is a NaN).
// The range functions are single-threaded and reentrant; CpuThreadPool may be used from one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::offload {

enum class SimdPath { scalar, avx2, avx512 };
std::string_view simd_path_name(SimdPath path);
// Compiled in and supported by this CPU (cpuid and OS state, checked at run time). scalar always is.
bool simd_path_supported(SimdPath path);
// The widest supported path, unless the environment variable ZERO3_CPU_SIMD (scalar, avx2, avx512) asks
// for a narrower one (asking for an unsupported one is an Error naming the variable and the CPU).
SimdPath best_simd_path();

// The views of one fused step over n elements. master holds n elements of master_dtype and each state
// pointer n elements of state_dtype, a pair that kernels::optimizer_storage_supported allows (fp32 master and
// state; bf16 master with fp32 or bf16 state; fp16 master with fp32 state), stored and rounded by that
// header's rule: widened to fp32, updated in fp32 exactly as with fp32 storage, rounded to nearest even
// back to the storage dtype. grad is n elements of grad_dtype (f32, bf16 or f16); param (may be null)
// receives the new weights, as stored in master, converted to param_dtype. exp_avg / exp_avg_sq are
// ignored by the optimizers that keep no such state (Adagrad keeps its sum of squared gradients in
// exp_avg_sq; Lion only exp_avg). A float* converts to the void* fields, so fp32 callers set them as before.
struct StepSpan {
  void* master = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  void* param = nullptr;
  DType param_dtype = DType::bf16;
  std::size_t count = 0;
  // Write param with non-temporal stores, which go to memory without reading each line first (a plain
  // store to a line not in cache reads it: 2 bytes more per element for a bf16 copy) and leave the caches
  // to the streams that are read. For copies larger than the caches, whose next reader (a copy to the
  // device, the next gather) finds them in memory anyway: set it when the whole step's copy is at least
  // kStreamParamMinBytes. The values written are the same either way.
  bool stream_param = false;
  // The storage of master and of the states (bf16.bf16_master_weights_and_grads, bf16.bf16_optimizer_states,
  // fp16.fp16_master_weights_and_grads). Last, so that positional initializers of the fields above still
  // compile.
  DType master_dtype = DType::f32;
  DType state_dtype = DType::f32;
};

// The size of a step's 16-bit copy from which StepSpan::stream_param pays: more than a core's L2 and a
// good part of a shared L3.
inline constexpr std::size_t kStreamParamMinBytes = std::size_t{8} << 20;

// One pass per element: read the gradient, scale it by args.grad_scale (unscale and clip), update the
// master weight and the state, write the low-precision weight. Single-threaded over the span.
void adam_range(SimdPath path, const kernels::AdamArgs& args, const StepSpan& span);
void lion_range(SimdPath path, const kernels::LionArgs& args, const StepSpan& span);
void adagrad_range(SimdPath path, const kernels::AdagradArgs& args, const StepSpan& span);

// Statistics of gradient values: sum of their squares (double, accumulated in a fixed order for a given
// count, so the same on every run and every path; docs/offload.md gives the order) and whether any is Inf or
// NaN (then sum_sq is Inf or NaN too).
struct GradStats {
  double sum_sq = 0.0;
  bool nonfinite = false;
  GradStats& operator+=(const GradStats& o) {
    sum_sq += o.sum_sq;
    nonfinite = nonfinite || o.nonfinite;
    return *this;
  }
};

// acc[i] = acc[i] + alpha * src[i] (kernels' accumulate_elem), src of src_dtype; with want_stats, also the
// statistics of the new acc values, taken in the same pass. Single-threaded.
GradStats accumulate_range(SimdPath path, float* acc, const void* src, DType src_dtype, float alpha, std::size_t count,
                           bool want_stats);
// The statistics of acc[0, count) alone.
GradStats grad_stats_range(SimdPath path, const float* acc, std::size_t count);

// A fixed set of worker threads (a oneTBB arena) that runs tiled loops; optionally each worker is bound to
// a CPU set (NUMA-local optimizer threads). Tile boundaries depend only on the count and tile size, so
// results that are reduced per tile (GradStats) are independent of the thread count.
class CpuThreadPool {
 public:
  // threads <= 0: every core of `cpus` (or of the process's CPU set when cpus is empty).
  // cpus: OS processor indices the workers are bound to; empty leaves them unbound.
  explicit CpuThreadPool(int threads, std::vector<int> cpus = {});
  ~CpuThreadPool();
  CpuThreadPool(const CpuThreadPool&) = delete;
  CpuThreadPool& operator=(const CpuThreadPool&) = delete;

  int threads() const;
  const std::vector<int>& cpus() const;
  // Blocks until fn(begin, end) has run over every tile [k * tile, min((k + 1) * tile, count)).
  void for_tiles(std::size_t count, std::size_t tile, const std::function<void(std::size_t, std::size_t)>& fn);
  // for_tiles with a GradStats per tile, summed in tile order (deterministic).
  GradStats reduce_tiles(std::size_t count, std::size_t tile,
                         const std::function<GradStats(std::size_t, std::size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Elements per tile of the fused step: its five streams (grad, master, two moments, param) fit in L2.
inline constexpr std::size_t kCpuStepTileElems = std::size_t{1} << 14;

}  // namespace zero3::offload
