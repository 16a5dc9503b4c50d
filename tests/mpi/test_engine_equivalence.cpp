// The ZeRO-3 engine at world size W against the unsharded float64 reference (tests/model/reference.hpp):
// the float test model runs through GatherScope/GradScope on the engine's compute stream, each rank on its
// rank-strided share of a global batch that does not depend on W, and the reference trains the same model
// on the whole global batch with its own optimizer, schedule, clipping and loss-scale code. Checked:
// params (gather_tensor master) per param with a norm-wise relative bound and an element bound, the loss
// curve, grad norms, lrs, loss scales; gradient accumulation against one big micro-batch; overflow skips
// leaving state bitwise unchanged; the gathered-memory budget; communication volume; frozen params,
// weight_decay=false and lr_scale. Tolerances and their reasons: docs/testing.md.
// Every rank runs every collective (gather_tensor included) in the same order, and results are checked
// with CHECK afterwards, so a failure on one rank cannot strand the others in a collective.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine_trainer.hpp"
#include "reference.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/engine/engine.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;
using model::Arch;

namespace {

constexpr int kSteps = 20;
// At world size 1 the engine uses units in place (zero3.single_rank_in_place); the tests of the gather and
// reduction machinery ask for the sharded path, which every world size above 1 takes anyway.
constexpr const char* kShardedPath = R"("single_rank_in_place": false)";

// Per dtype (docs/testing.md explains each number):
//  norm: ||zero3 - ref|| / ||ref|| per param after the run;
//  update, rtol: per element, |zero3 - ref| <= update * (sum of the lrs applied) * lr_scale + rtol * |ref|.
//    Adam, Lion and Adagrad normalize each element's step to about lr whatever the gradient's size, so an
//    element whose gradient is tiny next to the terms it sums (relative rounding error large) still moves by
//    a full step: element errors scale with the distance travelled, not with the element's value.
//  loss, grad_norm: per step, relative.
struct Tolerance {
  double norm;
  double update;
  double rtol;
  double loss;
  double grad_norm;
};
// fp32: the float model's rounding (~1e-7 relative per op, sums of <= 100 terms; up to ~1e-3 for an element
// 1e4 times smaller than its terms), the engine's fp32 master and optimizer arithmetic, over 20 steps.
constexpr Tolerance kFp32{1e-5, 1e-3, 1e-5, 1e-5, 1e-5};
// bf16: the forward reads bf16-rounded params (the reference does too), but the engine's gradients are
// rounded to bf16 (8 bits: 2e-3 relative) before the reduce-scatter, and once the masters differ slightly
// their bf16 roundings differ by whole ulps (4e-3 relative) in the next forward.
constexpr Tolerance kBf16{2e-2, 2.5e-1, 1e-2, 1e-3, 1e-2};
// fp16: as bf16 with 11-bit mantissas (5e-4 relative), the gradients scaled by the loss scale to stay normal.
constexpr Tolerance kFp16{5e-3, 5e-3, 2e-3, 1e-4, 2e-3};

struct Worst {
  double norm = 0.0;
  double elem = 0.0;
  std::string norm_param;
  std::string elem_param;
};

// Every param's master (collective, in the reference's order on every rank) against the reference.
// `sum_lr`: the lrs of the applied steps, summed (the distance an element can travel, before lr_scale).
Worst compare_masters(Engine& engine, const test::ReferenceTrainer& ref, const Tolerance& tol, double sum_lr) {
  Worst w;
  for (const std::string& name : ref.param_names()) {
    const std::vector<float> z = engine.gather_tensor(name, TensorKind::master);
    const double nr = test::norm_rel_error(z, ref.master(name));
    const double atol = tol.update * sum_lr * ref.spec(name).lr_scale;
    std::size_t at = 0;
    const double er = test::element_bound_ratio(z, ref.master(name), atol, tol.rtol, &at);
    INFO(fmt::format(
        "param {}: norm-wise relative error {:.3e} (bound {:.0e}); worst element [{}] = {:.9g} vs "
        "reference {:.9g}, at {:.3f} of its bound ({:.1e} + {:.0e} |ref|)",
        name, nr, tol.norm, at, z.empty() ? 0.0f : z[at], z.empty() ? 0.0 : ref.master(name)[at], er, atol, tol.rtol));
    CHECK(nr <= tol.norm);
    CHECK(er <= 1.0);
    if (nr > w.norm) {
      w.norm = nr;
      w.norm_param = name;
    }
    if (er > w.elem) {
      w.elem = er;
      w.elem_param = name;
    }
  }
  return w;
}

void report(const std::string& what, const Worst& w, double loss_err, double norm_err) {
  if (world_rank() != 0) return;
  std::printf(
      "[np%d] %-34s params: norm-rel %.2e (%s), element %.3f of bound (%s); loss rel %.2e; grad-norm rel %.2e\n",
      world_size(), what.c_str(), w.norm, w.norm_param.c_str(), w.elem, w.elem_param.c_str(), loss_err, norm_err);
  std::fflush(stdout);
}

// Trains `steps` steps on both sides, comparing each step's loss, grad norm, lr and loss scale, then every
// param. Returns the worst per-step loss and grad-norm errors through the report.
void run_and_compare(const std::string& what, const ConfigText& text, const model::ModelConfig& mc,
                     std::vector<UnitSpec> units, const Tolerance& tol, int steps = kSteps) {
  const config::Config cfg = text.parse();
  EngineTrainer zt(cfg, mc, units);
  test::ReferenceTrainer ref(cfg, mc, units, kDataSeed);
  double loss_err = 0.0;
  double norm_err = 0.0;
  double sum_lr = 0.0;
  for (int s = 0; s < steps; ++s) {
    double loss = 0.0;
    const StepResult z = zt.train_step(s, &loss);
    const test::RefStep r = ref.step();
    INFO(fmt::format("{}: step {}: loss {} vs {}, grad norm {} vs {}, lr {} vs {}", what, s, loss, r.loss, z.grad_norm,
                     r.grad_norm, z.lr, r.lr));
    CHECK(z.applied);
    CHECK(rel(loss, r.loss) <= tol.loss);
    CHECK(rel(z.grad_norm, r.grad_norm) <= tol.grad_norm);
    CHECK(z.lr == Approx(r.lr).epsilon(1e-12).margin(1e-18));
    CHECK(z.loss_scale == r.loss_scale);
    CHECK(z.global_step == s + 1);
    loss_err = std::max(loss_err, rel(loss, r.loss));
    norm_err = std::max(norm_err, rel(z.grad_norm, r.grad_norm));
    sum_lr += r.lr;
  }
  const Worst w = compare_masters(zt.engine(), ref, tol, sum_lr);
  report(what, w, loss_err, norm_err);
}

}  // namespace

TEST_CASE("fp32: params, loss curve and grad norms match the float64 reference", "[equivalence][fp32]") {
  struct Case {
    const char* name;
    model::ModelConfig model;
    const char* optimizer;
  };
  const Case cases[] = {
      {"fp32 AdamW transformer", transformer(),
       R"({"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.05}})"},
      {"fp32 Adam (L2) transformer", transformer(),
       R"({"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.01, "adam_w_mode": false}})"},
      {"fp32 Adagrad transformer", transformer(),
       R"({"type": "Adagrad", "params": {"lr": 1e-2, "weight_decay": 0.01}})"},
      // Lion's update is the sign of a momentum mix: a direction that rounding can flip moves an element by
      // 2 lr. The MLP has no element whose gradient is zero up to rounding; see docs/testing.md.
      {"fp32 Lion MLP", mlp(),
       R"({"type": "Lion", "params": {"lr": 2e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}})"},
      {"fp32 AdamW MLP", mlp(), R"({"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.05}})"},
  };
  for (const Case& c : cases) {
    ConfigText text = trainer_config();
    text.optimizer = c.optimizer;
    if (c.model.arch == Arch::mlp) text.zero = R"("stage3_param_persistence_threshold": 100)";
    run_and_compare(c.name, text, c.model, model::model_units(c.model), kFp32);
  }
}

TEST_CASE("fp32: optimizer state matches the reference", "[equivalence][fp32]") {
  ConfigText text = trainer_config();
  const config::Config cfg = text.parse();
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  EngineTrainer zt(cfg, mc, units);
  test::ReferenceTrainer ref(cfg, mc, units, kDataSeed);
  for (int s = 0; s < 10; ++s) {
    zt.train_step(s);
    ref.step();
  }
  double worst_m = 0.0;
  double worst_v = 0.0;
  for (const std::string& name : ref.param_names()) {
    const std::vector<float> m = zt.engine().gather_tensor(name, TensorKind::exp_avg);
    const std::vector<float> v = zt.engine().gather_tensor(name, TensorKind::exp_avg_sq);
    INFO(name);
    // The moments are averages of gradients (and of their squares): relative errors of the fp32 gradients,
    // plus, for v, the fp32 rounding of 1 - beta2: 1 - float(0.999) is 1.29e-5 below 0.001, on every
    // element alike (DeepSpeed's kernels compute it in fp32 too). Adam's update divides it out almost
    // entirely (v enters through a square root, and bias correction uses the same beta2).
    CHECK(test::norm_rel_error(m, ref.state1(name)) <= 1e-5);
    CHECK(test::norm_rel_error(v, ref.state2(name)) <= 3e-5);
    worst_m = std::max(worst_m, test::norm_rel_error(m, ref.state1(name)));
    worst_v = std::max(worst_v, test::norm_rel_error(v, ref.state2(name)));
  }
  if (world_rank() == 0)
    std::printf("[np%d] fp32 AdamW moments: m norm-rel %.2e, v norm-rel %.2e\n", world_size(), worst_m, worst_v);
}

TEST_CASE("bf16 and fp16: params and loss within the 16-bit tolerances", "[equivalence][bf16][fp16]") {
  const model::ModelConfig mc = transformer();
  ConfigText bf16 = trainer_config();
  bf16.precision = R"("bf16": {"enabled": true})";
  run_and_compare("bf16 AdamW transformer", bf16, mc, model::model_units(mc), kBf16);
  ConfigText fp16 = trainer_config();
  // A scale that keeps every scaled gradient below fp16's max: the reference cannot model natural overflows.
  fp16.precision = R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8})";
  run_and_compare("fp16 AdamW transformer", fp16, mc, model::model_units(mc), kFp16);
}

TEST_CASE("gradient accumulation 4 x micro-batch 2 equals 1 x micro-batch 8", "[equivalence][accumulation]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  ConfigText one = trainer_config();
  one.train_batch = 8 * world_size();
  ConfigText four = one;
  four.gas = 4;
  EngineTrainer a(one.parse(), mc, units);
  EngineTrainer b(four.parse(), mc, units);
  test::ReferenceTrainer ref(one.parse(), mc, units, kDataSeed);
  double loss_err = 0.0;
  double sum_lr = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    double la = 0.0;
    double lb = 0.0;
    const StepResult ra = a.train_step(s, &la);
    const StepResult rb = b.train_step(s, &lb);
    const test::RefStep rr = ref.step();
    // Not bitwise: a micro-batch of 8 sums its samples in one fp32 pass, four of 2 are summed per micro-step
    // and accumulated in the fp32 accumulator, so the roundings differ.
    CHECK(rel(lb, la) <= kFp32.loss);
    CHECK(rel(rb.grad_norm, ra.grad_norm) <= kFp32.grad_norm);
    CHECK(rel(la, rr.loss) <= kFp32.loss);
    loss_err = std::max(loss_err, rel(lb, la));
    sum_lr += rr.lr;
  }
  Worst w;
  for (const std::string& name : ref.param_names()) {
    const std::vector<float> pa = a.engine().gather_tensor(name, TensorKind::master);
    const std::vector<float> pb = b.engine().gather_tensor(name, TensorKind::master);
    const std::vector<double> pad(pa.begin(), pa.end());
    INFO(name);
    const double nr = test::norm_rel_error(pb, pad);
    const double er = test::element_bound_ratio(pb, pad, kFp32.update * sum_lr, kFp32.rtol);
    CHECK(nr <= kFp32.norm);
    CHECK(er <= 1.0);
    CHECK(test::norm_rel_error(pa, ref.master(name)) <= kFp32.norm);
    if (nr > w.norm) {
      w.norm = nr;
      w.norm_param = name;
    }
    if (er > w.elem) {
      w.elem = er;
      w.elem_param = name;
    }
  }
  report("accumulation 4x2 vs 1x8", w, loss_err, 0.0);
}

TEST_CASE("clipping: the reported grad norm and the clipped params match the reference", "[equivalence][clip]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  ConfigText text = trainer_config();
  text.clipping = 0.05;  // below every step's gradient norm here: clipping bites at every step
  const config::Config cfg = text.parse();
  EngineTrainer zt(cfg, mc, units);
  test::ReferenceTrainer ref(cfg, mc, units, kDataSeed);
  double norm_err = 0.0;
  double sum_lr = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    const StepResult z = zt.train_step(s);
    const test::RefStep r = ref.step();
    sum_lr += r.lr;
    INFO(fmt::format("step {}: grad norm {} vs {}", s, z.grad_norm, r.grad_norm));
    CHECK(r.clip_coef > 1.5);
    CHECK(rel(z.grad_norm, r.grad_norm) <= kFp32.grad_norm);
    norm_err = std::max(norm_err, rel(z.grad_norm, r.grad_norm));
  }
  report("fp32 AdamW clip 0.05", compare_masters(zt.engine(), ref, kFp32, sum_lr), 0.0, norm_err);
}

TEST_CASE("LR schedules: the lr of every step equals the DeepSpeed formula", "[equivalence][lr]") {
  const model::ModelConfig mc = transformer();
  struct Case {
    const char* name;
    const char* optimizer;
    const char* scheduler;
  };
  const char* adamw = R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})";
  const Case cases[] = {
      {"WarmupLR", adamw,
       R"({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 8}})"},
      {"WarmupDecayLR", adamw,
       R"({"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 5,
           "total_num_steps": 16, "warmup_type": "linear"}})"},
      {"WarmupCosineLR", adamw,
       R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 18, "warmup_num_steps": 4,
           "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}})"},
      // With Adam, OneCycle's momentum cycling (beta1, and beta2 = 0.99) reaches the optimizer too.
      {"OneCycle", R"({"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.01}})",
       R"({"type": "OneCycle", "params": {"cycle_min_lr": 2e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 5,
           "cycle_second_step_size": 4, "cycle_first_stair_count": 2, "cycle_second_stair_count": 2,
           "decay_step_size": 3, "decay_lr_rate": 0.2, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
           "decay_mom_rate": 0.01}})"},
      {"LRRangeTest", adamw,
       R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 4,
           "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": true}})"},
  };
  for (const Case& c : cases) {
    ConfigText text = trainer_config();
    text.optimizer = c.optimizer;
    text.scheduler = c.scheduler;
    // run_and_compare checks StepResult.lr of every step against reference_lr (deepspeed/runtime/lr_schedules.py).
    run_and_compare(fmt::format("fp32 {}", c.name), text, mc, model::model_units(mc), kFp32);
  }
}

TEST_CASE("fp16 overflow: the step is skipped, state stays bitwise, the loss scale follows DeepSpeed",
          "[equivalence][fp16][overflow]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  ConfigText text = trainer_config();
  text.precision =
      R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 4,
          "hysteresis": 2, "min_loss_scale": 1})";
  text.scheduler = R"({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 2e-3,
                      "warmup_num_steps": 10, "warmup_type": "linear"}})";
  const config::Config cfg = text.parse();
  EngineTrainer zt(cfg, mc, units);
  test::ReferenceTrainer ref(cfg, mc, units, kDataSeed);
  // Scale 256. Step 3: hysteresis 2 -> 1, scale kept; steps 5 and 6: halved to 128, then 64; after that the
  // scale doubles every 4 clean steps (iterations 11, 15 and 19): 512 at the end.
  const std::vector<int> overflow_steps = {3, 5, 6};
  const std::string victim = "blocks.0.mlp.fc.weight";
  const TensorKind kinds[] = {TensorKind::master, TensorKind::param, TensorKind::exp_avg, TensorKind::exp_avg_sq};
  int skipped = 0;
  double sum_lr = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    const bool overflow = std::find(overflow_steps.begin(), overflow_steps.end(), s) != overflow_steps.end();
    zt.forward_backward(s, 0, overflow ? victim : std::string());
    std::vector<std::vector<float>> before;
    if (overflow) {
      for (const std::string& name : ref.param_names()) {
        for (TensorKind k : kinds) before.push_back(zt.engine().gather_tensor(name, k));
      }
    }
    const StepResult z = zt.engine().step();
    const test::RefStep r = ref.step(overflow);
    sum_lr += r.lr;
    INFO(fmt::format("step {}: applied {} vs {}, scale {} -> {} vs {} -> {}, lr {} vs {}", s, z.applied, r.applied,
                     z.loss_scale, z.next_loss_scale, r.loss_scale, r.next_loss_scale, z.lr, r.lr));
    CHECK(z.boundary);
    CHECK(z.applied == !overflow);
    CHECK(z.loss_scale == r.loss_scale);
    CHECK(z.next_loss_scale == r.next_loss_scale);
    CHECK(z.lr == Approx(r.lr).epsilon(1e-12).margin(1e-18));
    skipped += overflow ? 1 : 0;
    CHECK(z.skipped_steps == skipped);
    CHECK(z.global_step == s + 1);
    if (overflow) {
      CHECK_FALSE(std::isfinite(z.grad_norm));
      std::size_t i = 0;
      for (const std::string& name : ref.param_names()) {
        for (TensorKind k : kinds) {
          INFO(fmt::format("param {} kind {}", name, static_cast<int>(k)));
          const std::vector<float> after = zt.engine().gather_tensor(name, k);
          CHECK(std::memcmp(after.data(), before[i].data(), after.size() * sizeof(float)) == 0);
          ++i;
        }
      }
    }
  }
  CHECK(ref.loss_scale() == 512.0);
  CHECK(zt.engine().loss_scale() == 512.0);
  report("fp16 with 3 injected overflows", compare_masters(zt.engine(), ref, kFp16, sum_lr), 0.0, 0.0);
}

TEST_CASE("gathered params stay within max_live_parameters + the prefetch bucket", "[equivalence][memory]") {
  const model::ModelConfig mc = transformer(4);  // four sharded blocks of 2176 elements
  const auto units = model::model_units(mc);
  constexpr std::uint64_t kMaxLive = 2400;
  constexpr std::uint64_t kPrefetch = 2400;
  ConfigText limited = trainer_config();
  limited.zero = fmt::format(
      R"("stage3_param_persistence_threshold": 200, "stage3_max_live_parameters": {}, "stage3_prefetch_bucket_size": {})",
      kMaxLive, kPrefetch);
  limited.zero3_extra = kShardedPath;
  ConfigText unlimited = trainer_config();  // DeepSpeed's defaults: 1e9 live, 5e7 prefetched
  unlimited.zero3_extra = kShardedPath;
  EngineTrainer zt(limited.parse(), mc, units);
  EngineTrainer free_run(unlimited.parse(), mc, units);
  zt.engine().reset_peaks();
  free_run.engine().reset_peaks();
  for (int s = 0; s < 5; ++s) {
    zt.train_step(s);
    free_run.train_step(s);
  }
  const EngineStats st = zt.engine().stats();
  const MemoryTracker::Counter gathered = zt.engine().memory().get(MemoryKind::device, MemCategory::param_gathered);
  // Padding: each gathered unit is rounded up to world size x 64 elements.
  const std::uint64_t slack = 2ull * static_cast<std::uint64_t>(world_size()) * 64;
  std::uint64_t largest = 0;
  for (const UnitSpec& u : units) {
    std::uint64_t n = 0;
    for (const ParamSpec& p : u.params) n += model::numel(p);
    largest = std::max(largest, n);
  }
  INFO(fmt::format("gathered peak {} elements, param_gathered peak {} bytes; without a budget {} elements",
                   st.gathered_peak_elems, gathered.peak_bytes, free_run.engine().stats().gathered_peak_elems));
  CHECK(st.gathered_peak_elems >= largest);
  CHECK(st.gathered_peak_elems <= kMaxLive + kPrefetch);
  CHECK(gathered.peak_bytes >= largest * sizeof(float));
  CHECK(gathered.peak_bytes <= (kMaxLive + kPrefetch + slack) * sizeof(float));
  CHECK(gathered.current_bytes <= (kMaxLive + slack) * sizeof(float));
  // Without the budget the prefetcher gathers more: the budget is what held the peak down.
  CHECK(free_run.engine().stats().gathered_peak_elems > kMaxLive + kPrefetch);
  // The budget changes when gathers happen, never the arithmetic: bitwise the same params.
  bool bitwise = true;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) {
      const std::vector<float> a = zt.engine().gather_tensor(p.name, TensorKind::master);
      const std::vector<float> b = free_run.engine().gather_tensor(p.name, TensorKind::master);
      bitwise = bitwise && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    }
  }
  CHECK(bitwise);
  if (world_rank() == 0) {
    std::printf(
        "[np%d] live budget %llu + prefetch %llu: gathered peak %llu elements, %zu bytes (%llu without the "
        "budget); params bitwise equal: %s\n",
        world_size(), static_cast<unsigned long long>(kMaxLive), static_cast<unsigned long long>(kPrefetch),
        static_cast<unsigned long long>(st.gathered_peak_elems), gathered.peak_bytes,
        static_cast<unsigned long long>(free_run.engine().stats().gathered_peak_elems), bitwise ? "yes" : "no");
  }
}

TEST_CASE("communication per step is 3 psi - 3 x persistent with max_reuse_distance 0", "[equivalence][comm]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  ConfigText text = trainer_config();
  text.zero = R"("stage3_param_persistence_threshold": 200, "stage3_max_reuse_distance": 0)";
  text.zero3_extra = kShardedPath;
  EngineTrainer zt(text.parse(), mc, units);
  const std::uint64_t psi = model::total_elems(units);
  std::uint64_t persistent = 0;
  for (const UnitSpec& u : units) {
    std::uint64_t n = 0;
    for (const ParamSpec& p : u.params) n += model::numel(p);
    if (n <= 200) persistent += n;
  }
  for (int s = 0; s < 3; ++s) {
    zt.train_step(s);
    const EngineStats st = zt.engine().stats();
    INFO(fmt::format("step {}: all-gather {}, reduce-scatter {}, all-reduce {}; psi {}, persistent {}", s,
                     st.last_step_all_gather_elems, st.last_step_reduce_scatter_elems, st.last_step_all_reduce_elems,
                     psi, persistent));
    CHECK(st.total_elems == psi);
    CHECK(st.persistent_elems == persistent);
    // Each sharded unit: gathered for forward, gathered again for backward, its gradient reduce-scattered.
    CHECK(st.last_step_all_gather_elems == 2 * (psi - persistent));
    CHECK(st.last_step_reduce_scatter_elems == psi - persistent);
    CHECK(st.last_step_all_gather_elems + st.last_step_reduce_scatter_elems == 3 * psi - 3 * persistent);
    // Persistent units are never gathered; their gradients are all-reduced.
    CHECK(st.last_step_all_reduce_elems == persistent);
  }
}

TEST_CASE("world size 1 in place gives the sharded path's results bit for bit", "[equivalence][in_place]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  struct Case {
    const char* what;
    const char* precision;
    const char* optimizer;
    int gas;
  };
  const Case cases[] = {
      {"fp32 AdamW", "", R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})", 1},
      {"fp32 AdamW, accumulation 3", "", R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})", 3},
      {"fp32 Lion, accumulation 2", "", R"({"type": "Lion", "params": {"lr": 1e-4, "weight_decay": 0.05}})", 2},
      {"bf16 AdamW, accumulation 2", R"("bf16": {"enabled": true})",
       R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})", 2},
      {"fp16 Adagrad", R"("fp16": {"enabled": true, "initial_scale_power": 8})",
       R"({"type": "Adagrad", "params": {"lr": 1e-2}})", 1},
  };
  for (const Case& c : cases) {
    ConfigText text = trainer_config();
    text.train_batch = 12 * c.gas;
    text.gas = c.gas;
    text.precision = c.precision;
    text.optimizer = c.optimizer;
    text.clipping = 0.5;
    ConfigText sharded = text;
    sharded.zero3_extra = kShardedPath;
    EngineTrainer in_place(text.parse(), mc, units);
    EngineTrainer reference(sharded.parse(), mc, units);
    in_place.engine().reset_peaks();
    for (int s = 0; s < 6; ++s) {
      double la = 0.0;
      double lb = 0.0;
      const StepResult a = in_place.train_step(s, &la);
      const StepResult b = reference.train_step(s, &lb);
      INFO(fmt::format("{}: step {}: loss {} vs {}, grad norm {} vs {}", c.what, s, la, lb, a.grad_norm, b.grad_norm));
      CHECK(la == lb);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.applied == b.applied);
    }
    for (const TensorKind kind : {TensorKind::param, TensorKind::master, TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
      for (const UnitSpec& u : units) {
        for (const ParamSpec& p : u.params) {
          if (!in_place.engine().state().keeps_state(kind)) continue;
          const std::vector<float> a = in_place.engine().gather_tensor(p.name, kind);
          const std::vector<float> b = reference.engine().gather_tensor(p.name, kind);
          INFO(fmt::format("{}: {} of {}", c.what, tensor_kind_name(kind), p.name));
          CHECK((a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0));
        }
      }
    }
    const EngineStats st = in_place.engine().stats();
    const MemoryTracker& mem = in_place.engine().memory();
    INFO(c.what);
    if (world_size() == 1) {
      // Nothing gathered, nothing communicated; fp32 gradients written straight into the accumulators
      // (except the accumulation window's later micro-batches, which add theirs).
      CHECK(st.last_step_all_gather_elems == 0);
      CHECK(st.last_step_reduce_scatter_elems + st.last_step_all_reduce_elems == 0);
      CHECK(mem.get(MemoryKind::device, MemCategory::param_gathered).peak_bytes == 0);
      const bool fp32 = std::string_view(c.precision).empty();
      CHECK((mem.get(MemoryKind::device, MemCategory::grad_buffer).peak_bytes == 0) == (fp32 && c.gas == 1));
      CHECK(reference.engine().stats().last_step_all_gather_elems > 0);
    } else {
      CHECK(st.last_step_all_gather_elems == reference.engine().stats().last_step_all_gather_elems);
    }
    if (world_rank() == 0) {
      std::printf("[np%d] in place vs sharded path, %s: bitwise equal; gathered %llu elements per step\n", world_size(),
                  c.what, static_cast<unsigned long long>(st.last_step_all_gather_elems));
    }
  }
}

TEST_CASE("frozen params stay at init; weight_decay=false and lr_scale are honoured", "[equivalence][frozen]") {
  const model::ModelConfig mc = transformer();
  auto units = model::model_units(mc);
  const auto set = [&](const std::string& name, auto&& edit) {
    for (UnitSpec& u : units) {
      for (ParamSpec& p : u.params) {
        if (p.name == name) edit(p);
      }
    }
  };
  set("input.weight", [](ParamSpec& p) { p.trainable = false; });              // in a persistent unit
  set("blocks.0.attn.qkv.weight", [](ParamSpec& p) { p.trainable = false; });  // in a sharded unit
  set("blocks.1.ln2.bias", [](ParamSpec& p) { p.trainable = false; });
  set("blocks.0.mlp.proj.weight", [](ParamSpec& p) { p.weight_decay = false; });
  set("blocks.1.mlp.fc.weight", [](ParamSpec& p) { p.lr_scale = 0.5; });
  set("head.weight", [](ParamSpec& p) { p.lr_scale = 2.0; });
  ConfigText text = trainer_config();
  text.optimizer = R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.2}})";
  const config::Config cfg = text.parse();
  EngineTrainer zt(cfg, mc, units);
  test::ReferenceTrainer ref(cfg, mc, units, kDataSeed);
  double sum_lr = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    const StepResult z = zt.train_step(s);
    const test::RefStep r = ref.step();
    CHECK(rel(z.grad_norm, r.grad_norm) <= kFp32.grad_norm);  // frozen params are outside the norm
    sum_lr += r.lr;
  }
  for (const char* name : {"input.weight", "blocks.0.attn.qkv.weight", "blocks.1.ln2.bias"}) {
    const std::vector<float> master = zt.engine().gather_tensor(name, TensorKind::master);
    const std::vector<float> param = zt.engine().gather_tensor(name, TensorKind::param);
    const std::vector<double> init = test::reference_init(ref.spec(name), 42);
    INFO(name);
    CHECK(ref.master(name) == init);
    bool bitwise = master.size() == init.size();
    for (std::size_t i = 0; bitwise && i < init.size(); ++i) {
      bitwise = master[i] == static_cast<float>(init[i]) && param[i] == static_cast<float>(init[i]);
    }
    CHECK(bitwise);
  }
  report("fp32 frozen / no decay / lr_scale", compare_masters(zt.engine(), ref, kFp32, sum_lr), 0.0, 0.0);
}
