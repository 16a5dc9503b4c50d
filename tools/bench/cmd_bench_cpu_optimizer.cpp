// `zero3-bench cpu-optimizer`: zero3's fused CPU optimizer step (zero3/offload/cpu_optimizer.hpp) timed side by
// side with STREAM's triad on the same buffers (the machine's streaming bandwidth), with its memory bound (the
// step's loads and stores, trivial arithmetic) and with the unfused pass sequence DeepSpeed runs for a 16-bit
// ZeRO-Offload step (grad norm, unscale + clip, optimizer, cast), all on one thread pool, one tiling and one SIMD
// path, repeats interleaved; optionally next to torch.optim.AdamW figures from tools/python/torch_adamw.py --json.
// With --states naming 16-bit variants (bf16 master, bf16 master and states, fp16 master), their fused steps are
// timed as well, interleaved with the fp32 one on buffers of their own, and reported beside it in bytes per param
// and Gparam/s. One size's buffers at a time.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "cpu_optimizer_bench.hpp"
#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"
#include "zero3/offload/cpu_optimizer.hpp"
#include "zero3/offload/pinned_budget.hpp"

namespace zero3::tools {
namespace {

using offload::SimdPath;
using offload::StepSpan;

struct CpuBenchOptions {
  std::vector<std::string> params;
  int threads = 0;
  std::string optimizer = "adamw";
  int repeats = 0;  // 0: per size, about kAutoRepeatBudgetS of rounds, kMinAutoRepeats..kMaxAutoRepeats
  bool json = false;
  std::string torch_json;
  std::vector<std::string> states = {"f32"};
};

constexpr double kGradClip = 1.0;  // DeepSpeed's gradient_clipping; the bench's gradients stay below it
constexpr std::size_t kMaxParams = std::size_t{1} << 40;
// On a shared machine the bandwidth a path sees swings by 2x from one repeat to the next; the best of
// many short repeats is stable where the best of five is not, and a large size needs fewer.
constexpr double kAutoRepeatBudgetS = 2.0;
constexpr int kMinAutoRepeats = 5;
constexpr int kMaxAutoRepeats = 50;

// "100003", "10M", "1.5B", "1e9": K = 1e3, M = 1e6, B or G = 1e9.
std::optional<std::size_t> parse_count(const std::string& text) {
  if (text.empty()) return std::nullopt;
  double mult = 1.0;
  std::string num = text;
  switch (num.back()) {
    case 'k':
    case 'K':
      mult = 1e3;
      break;
    case 'm':
    case 'M':
      mult = 1e6;
      break;
    case 'b':
    case 'B':
    case 'g':
    case 'G':
      mult = 1e9;
      break;
    default:
      break;
  }
  if (mult != 1.0) num.pop_back();
  if (num.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v)) return std::nullopt;
  const double count = v * mult;
  if (count < 1.0 || count > static_cast<double>(kMaxParams) || count != std::floor(count)) return std::nullopt;
  return static_cast<std::size_t>(count);
}

std::string count_label(std::size_t n) {
  if (n >= 1'000'000'000 && n % 1'000'000'000 == 0) return fmt::format("{}B", n / 1'000'000'000);
  if (n >= 1'000'000 && n % 1'000'000 == 0) return fmt::format("{}M", n / 1'000'000);
  if (n >= 1'000 && n % 1'000 == 0) return fmt::format("{}K", n / 1'000);
  return std::to_string(n);
}

BenchOptimizer parse_optimizer(const std::string& name) {
  for (BenchOptimizer o : {BenchOptimizer::adamw, BenchOptimizer::adam, BenchOptimizer::lion, BenchOptimizer::adagrad})
    if (bench_optimizer_name(o) == name) return o;
  throw ConfigError(fmt::format("--optimizer {}: not one of adamw, adam, lion, adagrad", name));
}

// The --states names, f32 first whether named or not (the variants are reported beside it); each once.
std::vector<StepStorage> parse_storages(const std::vector<std::string>& names) {
  std::vector<StepStorage> out = {step_storages().front()};
  for (const std::string& name : names) {
    const auto& all = step_storages();
    const auto it = std::find_if(all.begin(), all.end(), [&](const StepStorage& s) { return s.name == name; });
    if (it == all.end()) throw ConfigError(fmt::format("--states {}: unknown", name));  // the option's check
    if (std::none_of(out.begin(), out.end(), [&](const StepStorage& s) { return s.name == name; })) out.push_back(*it);
  }
  return out;
}

// ---- memory -------------------------------------------------------------------------------------------

// Leave room for the rest of the machine: a size runs only if it fits in the available memory less this.
std::uint64_t memory_margin(std::uint64_t available) {
  return std::max<std::uint64_t>(std::uint64_t{1} << 30, available / 10);
}

// The host device whose allocator the engine's offloaded state comes from (pageable here: pinning is
// mlock, which changes no bandwidth): large buffers 2 MiB-aligned, advised for huge pages, and staggered
// so that the step's streams do not share DRAM banks (runtime/device/device_host.cpp).
Device& host_device() {
  static const std::unique_ptr<Device> device = make_host_device();
  return *device;
}

// One host array from that allocator; released when destroyed, so one size's buffers are gone before the
// next is allocated.
class HostArray {
 public:
  HostArray() = default;
  HostArray(std::size_t size_bytes, const char* name) {
    try {
      // Every size here is whole 16-bit elements (n x 4 or n x 2 bytes).
      buffer_ =
          host_device().allocate(size_bytes / 2, DType::bf16, MemoryKind::pageable_host, MemCategory::optim_state);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(
          fmt::format("zero3-bench cpu-optimizer: cannot allocate {} bytes for {}: {}", size_bytes, name, e.what()));
    }
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(buffer_.data());
  }

 private:
  Buffer buffer_;
};

// The buffers of one size: fp32 grad, master and the optimizer's states, bf16 param.
struct StepBuffers {
  StepBuffers(BenchOptimizer o, std::size_t n)
      : grad(n * 4, "grad"),
        master(n * 4, "master"),
        exp_avg(uses_exp_avg(o) ? HostArray(n * 4, "exp_avg") : HostArray()),
        exp_avg_sq(uses_exp_avg_sq(o) ? HostArray(n * 4, "exp_avg_sq") : HostArray()),
        param(n * 2, "param"),
        count(n) {}

  StepSpan span(std::size_t begin, std::size_t end) const {
    StepSpan s;
    s.master = master.as<float>() + begin;
    s.exp_avg = exp_avg.as<float>() ? exp_avg.as<float>() + begin : nullptr;
    s.exp_avg_sq = exp_avg_sq.as<float>() ? exp_avg_sq.as<float>() + begin : nullptr;
    s.grad = grad.as<float>() + begin;
    s.grad_dtype = DType::f32;
    s.param = param.as<std::uint16_t>() + begin;
    s.param_dtype = DType::bf16;
    s.count = end - begin;
    s.stream_param = count * 2 >= offload::kStreamParamMinBytes;  // as the engine sets it for its steps
    return s;
  }

  HostArray grad, master, exp_avg, exp_avg_sq, param;
  std::size_t count;
};

std::uint64_t step_buffer_bytes(BenchOptimizer o, std::size_t n) {
  return std::uint64_t{n} * (4 + 4 + 4 * (uses_exp_avg(o) ? 1 : 0) + 4 * (uses_exp_avg_sq(o) ? 1 : 0) + 2);
}

// A value in [-1, 1) from an element index (splitmix64's finalizer): no RNG state, so tiles fill in parallel.
float unit_hash(std::uint64_t i, std::uint64_t stream) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ull + stream * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(std::uint64_t{1} << 23) - 1.0);
}

// First touch on the pool's workers. Gradients of 1e-5 keep the global norm below kGradClip up to ~1e10
// params, so the unscale + clip factor is exactly 1 and repeats see the same gradients (no drift to
// denormals); states are small and finite.
void fill_buffers(offload::CpuThreadPool& pool, const StepBuffers& b) {
  pool.for_tiles(b.count, offload::kCpuStepTileElems, [&](std::size_t begin, std::size_t end) {
    float* grad = b.grad.as<float>() + begin;
    float* master = b.master.as<float>() + begin;
    float* exp_avg = b.exp_avg.as<float>() ? b.exp_avg.as<float>() + begin : nullptr;
    float* exp_avg_sq = b.exp_avg_sq.as<float>() ? b.exp_avg_sq.as<float>() + begin : nullptr;
    std::uint16_t* param = b.param.as<std::uint16_t>() + begin;
    for (std::size_t i = 0; i < end - begin; ++i) {
      const std::uint64_t k = begin + i;
      grad[i] = 1e-5f * unit_hash(k, 1);
      master[i] = 0.05f * unit_hash(k, 2);
      if (exp_avg) exp_avg[i] = 1e-6f * unit_hash(k, 3);
      if (exp_avg_sq) exp_avg_sq[i] = 1e-10f * (1.0f + unit_hash(k, 4));
      param[i] = 0;
    }
  });
}

// The buffers of one storage variant at one size: grad, master, the optimizer's states and the param copy,
// each in the variant's dtype.
struct StorageBuffers {
  StorageBuffers(BenchOptimizer o, const StepStorage& st, std::size_t n)
      : storage(st),
        grad(n * size_of(st.grad), "grad"),
        master(n * size_of(st.master), "master"),
        exp_avg(uses_exp_avg(o) ? HostArray(n * size_of(st.state), "exp_avg") : HostArray()),
        exp_avg_sq(uses_exp_avg_sq(o) ? HostArray(n * size_of(st.state), "exp_avg_sq") : HostArray()),
        param(n * size_of(st.param), "param"),
        count(n) {}

  StepSpan span(std::size_t begin, std::size_t end) const {
    auto at = [&](const HostArray& a, DType t) -> void* {
      return a.as<char>() ? a.as<char>() + begin * size_of(t) : nullptr;
    };
    StepSpan s;
    s.master = at(master, storage.master);
    s.exp_avg = at(exp_avg, storage.state);
    s.exp_avg_sq = at(exp_avg_sq, storage.state);
    s.master_dtype = storage.master;
    s.state_dtype = storage.state;
    s.grad = at(grad, storage.grad);
    s.grad_dtype = storage.grad;
    s.param = at(param, storage.param);
    s.param_dtype = storage.param;
    s.count = end - begin;
    s.stream_param = count * size_of(storage.param) >= offload::kStreamParamMinBytes;
    return s;
  }

  StepStorage storage;
  HostArray grad, master, exp_avg, exp_avg_sq, param;
  std::size_t count;
};

// fill_buffers' values, rounded to the variant's dtypes.
void fill_storage_buffers(offload::CpuThreadPool& pool, const StorageBuffers& b) {
  pool.for_tiles(b.count, offload::kCpuStepTileElems, [&](std::size_t begin, std::size_t end) {
    const StepSpan s = b.span(begin, end);
    void* grad = b.grad.as<char>() + begin * size_of(s.grad_dtype);
    for (std::size_t i = 0; i < s.count; ++i) {
      const std::uint64_t k = begin + i;
      store_from_float(grad, s.grad_dtype, i, 1e-5f * unit_hash(k, 1));
      store_from_float(s.master, s.master_dtype, i, 0.05f * unit_hash(k, 2));
      if (s.exp_avg) store_from_float(s.exp_avg, s.state_dtype, i, 1e-6f * unit_hash(k, 3));
      if (s.exp_avg_sq) store_from_float(s.exp_avg_sq, s.state_dtype, i, 1e-10f * (1.0f + unit_hash(k, 4)));
      store_from_float(s.param, s.param_dtype, i, 0.0f);
    }
  });
}

// ---- the three paths ----------------------------------------------------------------------------------

// The optimizer's hyperparameters as DeepSpeed's defaults for each (AdamW: decoupled decay 0.01; Adam: L2).
struct StepArgs {
  kernels::AdamArgs adam;
  kernels::LionArgs lion;
  kernels::AdagradArgs adagrad;
};

StepArgs step_args(BenchOptimizer o) {
  StepArgs a;
  a.adam.lr = 1e-3f;
  a.adam.weight_decay = 0.01f;
  a.adam.adamw = o == BenchOptimizer::adamw;
  a.lion.lr = 1e-4f;
  a.lion.weight_decay = 0.01f;
  a.adagrad.lr = 1e-2f;
  a.adagrad.weight_decay = 0.0f;
  return a;
}

void optimizer_range(SimdPath path, BenchOptimizer o, StepArgs args, std::int64_t step, float grad_scale,
                     const StepSpan& span) {
  switch (o) {
    case BenchOptimizer::adamw:
    case BenchOptimizer::adam:
      args.adam.step = step;
      args.adam.grad_scale = grad_scale;
      return offload::adam_range(path, args.adam, span);
    case BenchOptimizer::lion:
      args.lion.grad_scale = grad_scale;
      return offload::lion_range(path, args.lion, span);
    case BenchOptimizer::adagrad:
      args.adagrad.grad_scale = grad_scale;
      return offload::adagrad_range(path, args.adagrad, span);
  }
}

// The unfused sequence's pass times, seconds.
struct UnfusedTimes {
  double norm = 0, unscale = 0, optimizer = 0, cast = 0;
  double total() const { return norm + unscale + optimizer + cast; }
};

using bench::Clock;
using bench::seconds_since;

class PathRunner {
 public:
  PathRunner(offload::CpuThreadPool& pool, SimdPath path, BenchOptimizer o, const StepBuffers& b)
      : pool_(pool), path_(path), o_(o), b_(b), args_(step_args(o)) {}

  double bound() {
    // Read at run time, so the compiler must keep the multiply and adds: it is always 0.
    const float zero = zero_;
    const auto t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile,
                    [&](std::size_t begin, std::size_t end) { bound_range(path_, o_, b_.span(begin, end), zero); });
    return seconds_since(t0);
  }

  // STREAM's triad over three of the step's own arrays: exp_avg (master for Adagrad, which has none) =
  // grad + zero * master (or sum). The first triad leaves the gradients in that array, finite values the
  // steps run on as well as on any.
  double triad() {
    const float zero = zero_;
    float* a = uses_exp_avg(o_) ? b_.exp_avg.as<float>() : b_.master.as<float>();
    const float* c = uses_exp_avg(o_) ? b_.master.as<float>() : b_.exp_avg_sq.as<float>();
    const float* g = b_.grad.as<float>();
    const auto t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      triad_range(path_, a + begin, g + begin, c + begin, zero, end - begin);
    });
    return seconds_since(t0);
  }

  // zero3's step: one pass. Its grad_scale comes from the norm zero3 takes while accumulating gradients
  // (offload::accumulate_range with want_stats), a pass that exists anyway, so no norm pass here.
  double fused(float grad_scale) {
    const std::int64_t step = ++fused_steps_;
    const auto t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      optimizer_range(path_, o_, args_, step, grad_scale, b_.span(begin, end));
    });
    return seconds_since(t0);
  }

  // DeepSpeed's ZeRO-Offload order: global norm, grads *= 1/clip_coef (always run, as stage3's
  // unscale_and_clip_grads does), the CPU optimizer over master and states, then the 16-bit copy.
  UnfusedTimes unfused() {
    UnfusedTimes t;
    const float* grad = b_.grad.as<float>();
    auto t0 = Clock::now();
    const offload::GradStats stats = pool_.reduce_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      return offload::GradStats{sum_squares_range(path_, grad + begin, end - begin), false};
    });
    t.norm = seconds_since(t0);
    const float scale = grad_scale_for(stats.sum_sq);

    t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      scale_range(path_, b_.grad.as<float>() + begin, scale, end - begin);
    });
    t.unscale = seconds_since(t0);

    const std::int64_t step = ++unfused_steps_;
    t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      StepSpan s = b_.span(begin, end);
      s.param = nullptr;  // the optimizer pass writes no 16-bit copy: the cast pass does
      optimizer_range(path_, o_, args_, step, 1.0f, s);
    });
    t.optimizer = seconds_since(t0);

    t0 = Clock::now();
    pool_.for_tiles(b_.count, kTile, [&](std::size_t begin, std::size_t end) {
      cast_bf16_range(path_, b_.master.as<float>() + begin, b_.param.as<std::uint16_t>() + begin, end - begin);
    });
    t.cast = seconds_since(t0);
    return t;
  }

  // 1 / DeepSpeed's clip coefficient: max(1, (norm + 1e-6) / clip).
  static float grad_scale_for(double sum_sq) {
    const double norm = std::sqrt(sum_sq);
    return static_cast<float>(1.0 / std::max(1.0, (norm + 1e-6) / kGradClip));
  }

 private:
  static constexpr std::size_t kTile = offload::kCpuStepTileElems;
  offload::CpuThreadPool& pool_;
  SimdPath path_;
  BenchOptimizer o_;
  const StepBuffers& b_;
  StepArgs args_;
  std::int64_t fused_steps_ = 0;
  std::int64_t unfused_steps_ = 0;
  static inline volatile float zero_ = 0.0f;
};

// One storage variant's fused step at one size: best time of the repeats.
struct StorageResult {
  StepStorage storage;
  double fused_s = std::numeric_limits<double>::infinity();
  std::optional<double> torch_gparams;
  std::string torch_variant;
};

std::uint64_t storage_buffer_bytes(BenchOptimizer o, const std::vector<StepStorage>& storages, std::size_t n) {
  std::uint64_t bytes = 0;
  for (const StepStorage& st : storages) {
    const BytesPerParam b = fused_bytes(o, st);
    bytes += std::uint64_t{n} * (b.loaded + size_of(st.param));  // every stream loaded, plus the param copy
  }
  return bytes;
}

// The fused step of every storage variant (f32 first) on buffers of its own, all allocated together so that
// the repeats interleave, the order rotating as run_size's does. Its f32 row is the baseline the variants are
// compared with: timed in the same rounds, unlike run_size's.
std::vector<StorageResult> run_storages(offload::CpuThreadPool& pool, SimdPath path, BenchOptimizer o, std::size_t n,
                                        const std::vector<StepStorage>& storages, int repeats, float grad_scale) {
  std::vector<std::unique_ptr<StorageBuffers>> buffers;
  std::vector<std::int64_t> steps(storages.size(), 0);
  std::vector<StorageResult> results;
  for (const StepStorage& st : storages) {
    buffers.push_back(std::make_unique<StorageBuffers>(o, st, n));
    fill_storage_buffers(pool, *buffers.back());
    results.push_back({st, std::numeric_limits<double>::infinity(), std::nullopt, ""});
  }
  const StepArgs args = step_args(o);
  auto fused = [&](std::size_t k) {
    const std::int64_t step = ++steps[k];
    const auto t0 = Clock::now();
    pool.for_tiles(n, offload::kCpuStepTileElems, [&](std::size_t begin, std::size_t end) {
      optimizer_range(path, o, args, step, grad_scale, buffers[k]->span(begin, end));
    });
    return seconds_since(t0);
  };
  for (std::size_t k = 0; k < storages.size(); ++k) fused(k);  // untimed: page faults, frequency ramp
  for (int rep = 0; rep < repeats; ++rep) {
    for (std::size_t j = 0; j < storages.size(); ++j) {
      const std::size_t k = (static_cast<std::size_t>(rep) + j) % storages.size();
      results[k].fused_s = std::min(results[k].fused_s, fused(k));
    }
  }
  return results;
}

// ---- one size -----------------------------------------------------------------------------------------

struct SizeResult {
  std::size_t params = 0;
  int repeats = 0;
  double bound_s = 0, fused_s = 0, triad_s = 0;
  UnfusedTimes unfused;  // the repeat with the best total
  std::optional<double> torch_gparams;
  std::string torch_variant;
  std::vector<StorageResult> storages;  // with --states naming 16-bit variants: f32 first, then those
  std::string storages_skipped;         // why they were not run at this size, if they were not
};

SizeResult run_size(offload::CpuThreadPool& pool, SimdPath path, BenchOptimizer o, std::size_t n, int repeats) {
  StepBuffers buffers(o, n);  // freed when this size is done
  fill_buffers(pool, buffers);
  PathRunner runner(pool, path, o, buffers);

  // The clip factor both sequences apply, from the norm as it stands (exactly 1 for the bench's grads).
  const float* grad = buffers.grad.as<float>();
  const offload::GradStats stats =
      pool.reduce_tiles(n, offload::kCpuStepTileElems, [&](std::size_t begin, std::size_t end) {
        return offload::GradStats{sum_squares_range(path, grad + begin, end - begin), false};
      });
  const float grad_scale = PathRunner::grad_scale_for(stats.sum_sq);

  // One untimed round (page faults, frequency ramp), then interleaved repeats, the order rotating so
  // that no path always runs right after another with a warm cache.
  const auto warm0 = Clock::now();
  runner.triad();
  runner.bound();
  runner.fused(grad_scale);
  runner.unfused();
  const double round_s = seconds_since(warm0);
  if (repeats == 0) {
    repeats = static_cast<int>(std::clamp(std::ceil(kAutoRepeatBudgetS / std::max(round_s, 1e-6)),
                                          double{kMinAutoRepeats}, double{kMaxAutoRepeats}));
  }
  SizeResult r;
  r.params = n;
  r.repeats = repeats;
  r.bound_s = r.fused_s = r.triad_s = std::numeric_limits<double>::infinity();
  r.unfused.norm = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < repeats; ++rep) {
    for (int k = 0; k < 4; ++k) {
      switch ((rep + k) % 4) {
        case 0:
          r.bound_s = std::min(r.bound_s, runner.bound());
          break;
        case 1:
          r.fused_s = std::min(r.fused_s, runner.fused(grad_scale));
          break;
        case 2:
          r.triad_s = std::min(r.triad_s, runner.triad());
          break;
        default: {
          const UnfusedTimes t = runner.unfused();
          if (t.total() < r.unfused.total()) r.unfused = t;
        }
      }
    }
  }
  return r;
}

// ---- torch figures ------------------------------------------------------------------------------------

struct TorchFigure {
  double gparams_per_s = 0;
  std::string variant;
  int threads = 0;
};

// The fastest variant per parameter dtype ("fp32" when the entry names none) and size, from
// tools/python/torch_adamw.py --json.
using TorchFigures = std::map<std::pair<std::string, std::size_t>, TorchFigure>;

TorchFigures read_torch_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("--torch-json {}: cannot open the file", path));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--torch-json {}: not JSON: {}", path, e.what()));
  }
  if (!doc.is_object() || !doc.contains("results") || !doc["results"].is_array())
    throw ConfigError(fmt::format("--torch-json {}: expected an object with a \"results\" array", path));
  TorchFigures best;
  for (std::size_t i = 0; i < doc["results"].size(); ++i) {
    const nlohmann::json& e = doc["results"][i];
    if (!e.is_object() || !e.contains("params") || !e["params"].is_number_unsigned() ||
        !e.contains("torch_gparams_per_s") || !e["torch_gparams_per_s"].is_number())
      throw ConfigError(fmt::format(
          "--torch-json {}: results[{}] needs \"params\" (a count) and \"torch_gparams_per_s\" (a number)", path, i));
    TorchFigure f;
    f.gparams_per_s = e["torch_gparams_per_s"].get<double>();
    f.variant = e.value("variant", std::string("torch"));
    f.threads = e.value("threads", 0);
    const std::pair<std::string, std::size_t> key{e.value("dtype", std::string("fp32")),
                                                  e["params"].get<std::size_t>()};
    auto it = best.find(key);
    if (it == best.end() || it->second.gparams_per_s < f.gparams_per_s) best[key] = f;
  }
  return best;
}

// ---- report -------------------------------------------------------------------------------------------

struct Derived {
  double bound_gbps, fused_gbps, unfused_gbps, unfused_effective_gbps;
  double fused_gparams, unfused_gparams, fused_over_bound, fused_over_unfused;
  double triad_gbps, fused_over_triad;  // fused GB/s over triad GB/s, each counted its own way
};

Derived derive(const SizeResult& r, BenchOptimizer o) {
  const double n = static_cast<double>(r.params);
  const double fb = static_cast<double>(fused_bytes(o).total()) * n;
  const double ub = static_cast<double>(unfused_bytes(o).total()) * n;
  const double ut = r.unfused.total();
  const double triad_gbps = static_cast<double>(kTriadBytesPerElem) * n / r.triad_s / 1e9;
  const double fused_gbps = fb / r.fused_s / 1e9;
  return {
      fb / r.bound_s / 1e9,  fused_gbps,     ub / ut / 1e9, fb / ut / 1e9,          n / r.fused_s / 1e9, n / ut / 1e9,
      r.bound_s / r.fused_s, ut / r.fused_s, triad_gbps,    fused_gbps / triad_gbps};
}

struct Skipped {
  std::size_t params;
  std::string reason;
};

// The figures of one storage variant: its bytes per param, fused time, GB/s and Gparam/s, and its speed
// over the f32 step of the same rounds (the first).
struct StorageDerived {
  BytesPerParam bytes;
  double gbps, gparams, over_f32;
};

StorageDerived derive_storage(const SizeResult& r, const StorageResult& sr, BenchOptimizer o) {
  const double n = static_cast<double>(r.params);
  const BytesPerParam b = fused_bytes(o, sr.storage);
  return {b, static_cast<double>(b.total()) * n / sr.fused_s / 1e9, n / sr.fused_s / 1e9,
          r.storages.front().fused_s / sr.fused_s};
}

nlohmann::ordered_json storages_json(const SizeResult& r, BenchOptimizer o) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const StorageResult& sr : r.storages) {
    const StorageDerived d = derive_storage(r, sr, o);
    nlohmann::ordered_json e;
    e["states"] = std::string(sr.storage.name);
    e["master"] = std::string(dtype_name(sr.storage.master));
    e["state"] = std::string(dtype_name(sr.storage.state));
    e["grad"] = std::string(dtype_name(sr.storage.grad));
    e["param"] = std::string(dtype_name(sr.storage.param));
    e["bytes_per_param"] = d.bytes.total();
    e["fused_ms"] = sr.fused_s * 1e3;
    e["fused_gbps"] = d.gbps;
    e["fused_gparams_per_s"] = d.gparams;
    e["over_f32"] = d.over_f32;
    if (sr.torch_gparams) {
      e["torch_gparams_per_s"] = *sr.torch_gparams;
      e["torch_variant"] = sr.torch_variant;
    }
    out.push_back(e);
  }
  return out;
}

// The storage variants' table, when any size ran them.
void print_storages_table(const std::vector<SizeResult>& results, BenchOptimizer o) {
  if (std::none_of(results.begin(), results.end(),
                   [](const SizeResult& r) { return !r.storages.empty() || !r.storages_skipped.empty(); }))
    return;
  fmt::print(
      "\nstorage variants: the fused step alone, each on buffers of its own, repeats interleaved with the f32 "
      "row's\n");
  fmt::print("{:>8} {:<19} {:>6} {:>6} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8} {:>7} {:>8}  {}\n", "params", "states",
             "master", "state", "grad", "param", "B/param", "fused ms", "GB/s", "Gpar/s", "vs f32", "torch",
             "torch variant");
  for (const SizeResult& r : results) {
    if (!r.storages_skipped.empty()) fmt::print("{:>8} skipped: {}\n", count_label(r.params), r.storages_skipped);
    for (const StorageResult& sr : r.storages) {
      const StorageDerived d = derive_storage(r, sr, o);
      std::string line = fmt::format(
          "{:>8} {:<19} {:>6} {:>6} {:>6} {:>6} {:>8} {:>9.2f} {:>8.2f} {:>8.3f} {:>7.2f}", count_label(r.params),
          sr.storage.name, dtype_name(sr.storage.master), dtype_name(sr.storage.state), dtype_name(sr.storage.grad),
          dtype_name(sr.storage.param), d.bytes.total(), sr.fused_s * 1e3, d.gbps, d.gparams, d.over_f32);
      if (sr.torch_gparams) line += fmt::format(" {:>8.3f}  {}", *sr.torch_gparams, sr.torch_variant);
      fmt::print("{}\n", line);
    }
  }
  fmt::print(
      "  B/param: the fused step's loads and stores for that storage; vs f32 = f32 fused time / this fused time;\n"
      "  torch: torch.optim.AdamW on bf16 params (bf16 moments), from tools/python/torch_adamw.py --dtype bf16\n");
}

void print_json(const std::vector<SizeResult>& results, const std::vector<Skipped>& skipped, BenchOptimizer o,
                SimdPath path, int threads) {
  nlohmann::ordered_json doc;
  doc["results"] = nlohmann::ordered_json::array();
  for (const SizeResult& r : results) {
    const Derived d = derive(r, o);
    nlohmann::ordered_json e;
    e["params"] = r.params;
    e["threads"] = threads;
    e["triad_gbps"] = d.triad_gbps;
    e["fused_over_triad"] = d.fused_over_triad;
    e["bound_gbps"] = d.bound_gbps;
    e["fused_gbps"] = d.fused_gbps;
    e["unfused_gbps"] = d.unfused_gbps;
    e["fused_gparams_per_s"] = d.fused_gparams;
    e["fused_over_bound"] = d.fused_over_bound;
    e["fused_over_unfused"] = d.fused_over_unfused;
    e["simd"] = std::string(offload::simd_path_name(path));
    e["optimizer"] = std::string(bench_optimizer_name(o));
    e["statistic"] = "best";
    e["repeats"] = r.repeats;
    e["unfused_gparams_per_s"] = d.unfused_gparams;
    e["unfused_effective_gbps"] = d.unfused_effective_gbps;
    e["fused_bytes_per_param"] = fused_bytes(o).total();
    e["unfused_bytes_per_param"] = unfused_bytes(o).total();
    e["triad_ms"] = r.triad_s * 1e3;
    e["bound_ms"] = r.bound_s * 1e3;
    e["fused_ms"] = r.fused_s * 1e3;
    e["unfused_ms"] = {{"total", r.unfused.total() * 1e3},
                       {"norm", r.unfused.norm * 1e3},
                       {"unscale_clip", r.unfused.unscale * 1e3},
                       {"optimizer", r.unfused.optimizer * 1e3},
                       {"cast_bf16", r.unfused.cast * 1e3}};
    if (r.torch_gparams) {
      e["torch_gparams_per_s"] = *r.torch_gparams;
      e["torch_variant"] = r.torch_variant;
      e["fused_over_torch"] = d.fused_gparams / *r.torch_gparams;
    }
    if (!r.storages.empty()) e["storage_variants"] = storages_json(r, o);
    if (!r.storages_skipped.empty()) e["storage_variants_skipped"] = r.storages_skipped;
    doc["results"].push_back(e);
  }
  if (!skipped.empty()) {
    doc["skipped"] = nlohmann::ordered_json::array();
    for (const Skipped& s : skipped) doc["skipped"].push_back({{"params", s.params}, {"reason", s.reason}});
  }
  fmt::print("{}\n", doc.dump());
}

void print_table(const std::vector<SizeResult>& results, const std::vector<Skipped>& skipped, BenchOptimizer o,
                 SimdPath path, int threads, bool with_torch) {
  const BytesPerParam fb = fused_bytes(o);
  const BytesPerParam ub = unfused_bytes(o);
  const std::string_view name = bench_optimizer_name(o);
  fmt::print(
      "zero3-bench cpu-optimizer: {}, fp32 grad and master, fp32 states, bf16 param out; {} threads, SIMD {}, "
      "tiles of {} elements; each time is the best of interleaved repeats (counts below)\n",
      name, threads, offload::simd_path_name(path), offload::kCpuStepTileElems);
  fmt::print(
      "bytes/param: fused and bound {} ({} loaded + {} stored); unfused {} (norm 4 + unscale 8 + {} {} + cast 6)\n\n",
      fb.total(), fb.loaded, fb.stored, ub.total(), name, fb.total() - 2);
  std::string head = fmt::format("{:>8} {:>3} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7}",
                                 "params", "thr", "simd", "triad", "bound", "fused", "unfused", "unf.eff", "fused",
                                 "unfused", "fused/", "fused/", "fused/");
  std::string head2 =
      fmt::format("{:>8} {:>3} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7}", "", "", "", "GB/s",
                  "GB/s", "GB/s", "GB/s", "GB/s", "Gpar/s", "Gpar/s", "triad", "bound", "unfused");
  if (with_torch) {
    head += fmt::format(" {:>8} {:>7}  {}", "torch", "fused/", "torch variant");
    head2 += fmt::format(" {:>8} {:>7}", "Gpar/s", "torch");
  }
  fmt::print("{}\n{}\n", head, head2);
  for (const SizeResult& r : results) {
    const Derived d = derive(r, o);
    std::string line = fmt::format(
        "{:>8} {:>3} {:>6} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.3f} {:>8.3f} {:>7.3f} {:>7.3f} {:>7.2f}",
        count_label(r.params), threads, offload::simd_path_name(path), d.triad_gbps, d.bound_gbps, d.fused_gbps,
        d.unfused_gbps, d.unfused_effective_gbps, d.fused_gparams, d.unfused_gparams, d.fused_over_triad,
        d.fused_over_bound, d.fused_over_unfused);
    if (with_torch) {
      if (r.torch_gparams) {
        line += fmt::format(" {:>8.3f} {:>7.2f}  {}", *r.torch_gparams, d.fused_gparams / *r.torch_gparams,
                            r.torch_variant);
      } else {
        line += fmt::format(" {:>8} {:>7}", "-", "-");
      }
    }
    fmt::print("{}\n", line);
  }
  for (const Skipped& s : skipped) fmt::print("{:>8} skipped: {}\n", count_label(s.params), s.reason);
  print_storages_table(results, o);
  fmt::print("\ntimes (ms, best of the repeats):\n");
  for (const SizeResult& r : results) {
    fmt::print(
        "{:>8} x {:>2}: triad {:.2f}, bound {:.2f}, fused {:.2f}, unfused {:.2f} = norm {:.2f} + unscale {:.2f} + {} "
        "{:.2f} + cast {:.2f}\n",
        count_label(r.params), r.repeats, r.triad_s * 1e3, r.bound_s * 1e3, r.fused_s * 1e3, r.unfused.total() * 1e3,
        r.unfused.norm * 1e3, r.unfused.unscale * 1e3, name, r.unfused.optimizer * 1e3, r.unfused.cast * 1e3);
  }
  fmt::print(
      "\nlegend:\n"
      "  triad        STREAM's triad a = b + s c over three of the step's fp32 arrays, same pool and tiles: the "
      "machine's\n"
      "               streaming bandwidth, counted as STREAM counts it (12 B/element, no write-allocate read)\n"
      "  bound        the fused step's loads and stores with trivial arithmetic, same pool, tiles and SIMD path\n"
      "  fused        zero3 offload::{}_range over CpuThreadPool::for_tiles: one pass, unscale+clip folded in\n"
      "               (the grad norm comes from the gradient-accumulation pass, so it is not timed here)\n"
      "  unfused      DeepSpeed's 16-bit ZeRO-Offload sequence: norm, unscale+clip, {} (no 16-bit copy), cast\n"
      "  GB/s         bytes/param above x params / time; bound and fused use the fused bytes, unfused its own\n"
      "  unf.eff      fused bytes / unfused time: the bandwidth the unfused sequence delivers for the same step\n"
      "  fused/triad  fused GB/s over triad GB/s\n"
      "  Gpar/s       1e9 params per second; fused/bound = bound time / fused time; fused/unfused = unfused "
      "time / fused time\n",
      name == "adamw" ? "adam" : name, name);
  if (with_torch)
    fmt::print(
        "  torch        torch.optim.AdamW from tools/python/torch_adamw.py (fastest variant); fused/torch = "
        "ratio of Gpar/s\n");
}

// The storage variants at r's size, after run_size has freed its buffers, with run_size's repeat count;
// torch's bf16 figure goes beside bf16-master-states (torch.optim.AdamW on bf16 params keeps bf16 moments).
void run_size_storages(offload::CpuThreadPool& pool, SimdPath path, BenchOptimizer o,
                       const std::vector<StepStorage>& storages, const TorchFigures& torch, SizeResult& r) {
  const std::size_t n = r.params;
  const std::uint64_t need = storage_buffer_bytes(o, storages, n);
  if (const auto avail = offload::read_allocatable_bytes()) {
    const std::uint64_t margin = memory_margin(*avail);
    if (need + margin > *avail) {
      constexpr double kGiB = double(std::uint64_t{1} << 30);
      r.storages_skipped = fmt::format(
          "the storage variants need {:.1f} GiB of buffers; {:.1f} GiB available, "
          "less a {:.1f} GiB margin",
          double(need) / kGiB, double(*avail) / kGiB, double(margin) / kGiB);
      fmt::print(stderr, "zero3-bench cpu-optimizer: {} params: {}\n", count_label(n), r.storages_skipped);
      return;
    }
  }
  r.storages = run_storages(pool, path, o, n, storages, r.repeats, 1.0f);
  for (StorageResult& sr : r.storages) {
    if (sr.storage.name != "bf16-master-states") continue;
    if (auto it = torch.find({"bf16", n}); it != torch.end()) {
      sr.torch_gparams = it->second.gparams_per_s;
      sr.torch_variant = it->second.variant;
    }
  }
}

void run_cpu_optimizer_bench(const CpuBenchOptions& opt) {
  const BenchOptimizer o = parse_optimizer(opt.optimizer);
  std::vector<std::size_t> sizes;
  if (opt.params.empty()) {
    sizes = {10'000'000, 100'000'000, 1'000'000'000};
  } else {
    for (const std::string& p : opt.params) sizes.push_back(*parse_count(p));  // validated by the option's check
  }
  const std::vector<StepStorage> storages = parse_storages(opt.states);
  TorchFigures torch;
  const bool with_torch = !opt.torch_json.empty();
  if (with_torch) {
    torch = read_torch_json(opt.torch_json);
    if (o != BenchOptimizer::adamw)
      fmt::print(stderr, "note: the torch figures are torch.optim.AdamW's; this run measures {}\n",
                 bench_optimizer_name(o));
  }

  offload::CpuThreadPool pool(opt.threads);
  const SimdPath path = offload::best_simd_path();
  std::vector<SizeResult> results;
  std::vector<Skipped> skipped;
  for (const std::size_t n : sizes) {
    const std::uint64_t need = step_buffer_bytes(o, n);
    if (const auto avail = offload::read_allocatable_bytes()) {
      const std::uint64_t margin = memory_margin(*avail);
      if (need + margin > *avail) {
        constexpr double kGiB = double(std::uint64_t{1} << 30);
        Skipped s{n, fmt::format("needs {:.1f} GiB of buffers; {:.1f} GiB available, less a {:.1f} GiB margin",
                                 double(need) / kGiB, double(*avail) / kGiB, double(margin) / kGiB)};
        fmt::print(stderr, "zero3-bench cpu-optimizer: {} params skipped: {}\n", count_label(n), s.reason);
        skipped.push_back(std::move(s));
        continue;
      }
    }
    SizeResult r = run_size(pool, path, o, n, opt.repeats);
    if (auto it = torch.find({"fp32", n}); it != torch.end()) {
      r.torch_gparams = it->second.gparams_per_s;
      r.torch_variant = it->second.variant;
      if (it->second.threads != 0 && it->second.threads != pool.threads())
        fmt::print(stderr, "note: torch ran {} params on {} threads, zero3 on {}\n", count_label(n), it->second.threads,
                   pool.threads());
    }
    if (storages.size() > 1) run_size_storages(pool, path, o, storages, torch, r);
    results.push_back(std::move(r));
  }
  if (opt.json) {
    print_json(results, skipped, o, path, pool.threads());
  } else {
    print_table(results, skipped, o, path, pool.threads(), with_torch);
  }
}

}  // namespace

void add_bench_cpu_optimizer_command(CLI::App& app) {
  auto opt = std::make_shared<CpuBenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "cpu-optimizer", "zero3's fused CPU optimizer step vs its memory bound and vs DeepSpeed's unfused pass sequence");
  cmd->add_option("--params", opt->params,
                  "Parameter counts, comma-separated (100003, 10M, 1B, 1e9); default 10M,100M,1B, each skipped "
                  "when its buffers do not fit in available memory")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& s) {
            return parse_count(s) ? std::string() : "not a parameter count in [1, 2^40] (e.g. 100003, 10M, 1B)";
          },
          "COUNT"));
  cmd->add_option("--threads", opt->threads, "Optimizer threads; 0 = every core of the process")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--optimizer", opt->optimizer, "The fused step to time")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "adam", "lion", "adagrad"}));
  cmd->add_option("--repeats", opt->repeats,
                  "Timed repeats per path (interleaved); the best is reported. Default: per size, about 2 s of "
                  "repeats, 5 to 50")
      ->check(CLI::Range(1, 10'000));
  bench::add_json_flag(*cmd, opt->json);
  cmd->add_option("--torch-json", opt->torch_json,
                  "Merge torch.optim.AdamW figures from tools/python/torch_adamw.py --json into the table");
  cmd->add_option("--states", opt->states,
                  "Storage variants of the fused step to time beside the fp32 one, comma-separated: f32, "
                  "bf16-master (bf16 grad and master, fp32 states), bf16-master-states (all bf16), fp16-master "
                  "(fp16 grad, master and param, fp32 states); bf16 states need a bf16 master")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& s) {
            for (const StepStorage& st : step_storages())
              if (st.name == s) return std::string();
            if (s == "bf16-states")
              return std::string(
                  "bf16 states need a bf16 master, as DeepSpeed's bf16_optimizer_states needs "
                  "bf16_master_weights_and_grads: use bf16-master-states");
            return std::string("not one of f32, bf16-master, bf16-master-states, fp16-master");
          },
          "STATES"));
  cmd->callback([opt] { run_cpu_optimizer_bench(*opt); });
}

}  // namespace zero3::tools
