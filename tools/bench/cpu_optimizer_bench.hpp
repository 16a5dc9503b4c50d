// The reference kernels of `zero3-bench cpu-optimizer`, next to which zero3's fused CPU optimizer step
// (zero3/offload/cpu_optimizer.hpp) is timed: the memory bound (the fused step's loads and stores with trivial
// arithmetic) and the single-stream passes of the unfused sequence DeepSpeed runs for a 16-bit ZeRO-Offload
// step (grad norm, unscale + clip, optimizer, cast to 16 bits). Each function is single-threaded over its
// range and uses the SIMD path it is given, so the caller runs all of them on the same pool and tiles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/offload/cpu_optimizer.hpp"

namespace zero3::tools {

enum class BenchOptimizer { adamw, adam, lion, adagrad };
std::string_view bench_optimizer_name(BenchOptimizer o);

// Whether the optimizer keeps a second fp32 state stream (Adam's exp_avg_sq, Adagrad's sum of squares;
// Lion keeps only exp_avg, Adagrad only its sum, held in exp_avg_sq as in StepSpan).
bool uses_exp_avg(BenchOptimizer o);
bool uses_exp_avg_sq(BenchOptimizer o);

// DRAM traffic per parameter, counted from the loads and stores of the code (no write-allocate reads).
struct BytesPerParam {
  std::size_t loaded = 0;
  std::size_t stored = 0;
  std::size_t total() const { return loaded + stored; }
};
// The fused step with fp32 grad and bf16 param out, e.g. AdamW: load grad, master, m, v (16 B);
// store master, m, v, bf16 param (14 B).
BytesPerParam fused_bytes(BenchOptimizer o);
// The storage of a fused step's streams, for the 16-bit optimizer-state variants
// (bf16.bf16_master_weights_and_grads, bf16.bf16_optimizer_states, fp16.fp16_master_weights_and_grads):
// with a 16-bit master the gradient accumulator is 16-bit too, as DeepSpeed keeps "master weights and
// grads" in that dtype.
struct StepStorage {
  std::string_view name;  // the --states spelling
  DType master, state, grad, param;
};
// f32 (the default step: fp32 grad, master and states, bf16 param), bf16-master (bf16 grad and master, fp32
// states), bf16-master-states (all bf16), fp16-master (fp16 grad, master and param, fp32 states).
const std::vector<StepStorage>& step_storages();
// The fused step's loads (grad, master, states) and stores (master, states, param) for that storage.
BytesPerParam fused_bytes(BenchOptimizer o, const StepStorage& s);
// The four unfused passes together: norm (load grad), unscale + clip (load and store grad), the optimizer
// alone (the fused step's streams less the bf16 param) and the cast (load master, store bf16 param).
BytesPerParam unfused_bytes(BenchOptimizer o);

// The memory bound over span[0, count): the same loads and stores as the fused step for the given
// optimizer (grad f32, param bf16), with trivial arithmetic: every stored fp32 value is x + zero * grad
// and the bf16 param is the new master's upper half. `zero` is 0 at run time, so the data stay as they
// were (repeats see the same values) but the compiler cannot drop the work.
void bound_range(offload::SimdPath path, BenchOptimizer o, const offload::StepSpan& span, float zero);

// STREAM's triad, a[i] = b[i] + s * c[i] over fp32 arrays: the machine's streaming bandwidth as STREAM
// measures it, on buffers allocated, placed and tiled as the step's are. STREAM counts 12 bytes per
// element (two loads, one store; the write-allocate read of `a` is not counted).
void triad_range(offload::SimdPath path, float* a, const float* b, const float* c, float s, std::size_t count);
inline constexpr std::size_t kTriadBytesPerElem = 12;

// Unfused pass (a): the sum of x[i]^2, in fp32 lanes, returned as double.
double sum_squares_range(offload::SimdPath path, const float* x, std::size_t count);
// Unfused pass (b): x[i] *= alpha.
void scale_range(offload::SimdPath path, float* x, float alpha, std::size_t count);
// Unfused pass (d): dst[i] = bf16(src[i]), rounded to nearest even, NaN kept a NaN.
void cast_bf16_range(offload::SimdPath path, const float* src, std::uint16_t* dst, std::size_t count);

}  // namespace zero3::tools
