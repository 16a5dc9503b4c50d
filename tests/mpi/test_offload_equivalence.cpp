// CPU offload against on-device training: the same model, data and config trained twice at world size W,
// once with offload_optimizer (and offload_param) switched on and once without, step by step in lockstep.
// The CPU optimizer does the device kernels' fp32 operations in the same order, gradients are accumulated
// with the same arithmetic, and the norm's partial sums are added as the device kernels add them, so
// every tensor (master, moments, params) and every StepResult is expected bitwise equal; the one place the
// operation order differs is the double-precision sum of squares (per arrival instead of per 64 Ki chunk),
// which could change the fp32 norm by 1 ulp, so grad norms are compared within 2^-22 relative and the
// tensors bitwise, with the first difference reported. Also: fp16 overflow skips leave the CPU state
// bitwise unchanged; ratio 0.5 (partial offload), sub_group_size smaller than a unit, offload_param on and
// off, gradient accumulation, Lion and Adagrad. NVMe offload (master, moments and accumulators in files) is
// compared with CPU offload the same way, bitwise. The unsharded float64 comparison of the engine itself is
// test_engine_equivalence.cpp; this file proves offloaded == on-device.
#include <fmt/format.h>
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine_trainer.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/offload/pinned_budget.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;

namespace {

constexpr int kSteps = 6;

bool same_bits(float a, float b) {
  std::uint32_t x = 0;
  std::uint32_t y = 0;
  std::memcpy(&x, &a, sizeof a);
  std::memcpy(&y, &b, sizeof b);
  return x == y;
}

// Index of the first element whose bits differ (rtol 0) or that is off by more than rtol relative to the
// tensor's largest magnitude, or -1; sizes must match.
long first_difference(const std::vector<float>& a, const std::vector<float>& b, double rtol = 0.0) {
  if (a.size() != b.size()) return 0;
  double scale = 0.0;
  for (const float v : b) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (rtol == 0.0 ? !same_bits(a[i], b[i]) : std::fabs(static_cast<double>(a[i]) - b[i]) > rtol * scale) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

std::vector<TensorKind> state_kinds(const config::Config& cfg) {
  switch (cfg.optimizer->type) {
    case config::OptimizerType::lion:
      return {TensorKind::master, TensorKind::param, TensorKind::exp_avg};
    case config::OptimizerType::adagrad:
      return {TensorKind::master, TensorKind::param, TensorKind::exp_avg_sq};
    default:
      return {TensorKind::master, TensorKind::param, TensorKind::exp_avg, TensorKind::exp_avg_sq};
  }
}

// Every tensor of every param of both engines (collective, same order on every rank); counts the
// tensors that are not bitwise equal and names the first.
int compare_all(Engine& offloaded, Engine& on_device, const std::vector<TensorKind>& kinds, const std::string& what,
                double rtol = 0.0) {
  int differing = 0;
  for (const std::string& unit : on_device.unit_names()) {
    for (const ParamSpec& p : on_device.unit_params(unit)) {
      for (const TensorKind k : kinds) {
        if (!p.trainable && k != TensorKind::param && k != TensorKind::master) continue;
        const std::vector<float> a = offloaded.gather_tensor(p.name, k);
        const std::vector<float> b = on_device.gather_tensor(p.name, k);
        const long at = first_difference(a, b, rtol);
        if (at < 0) continue;
        ++differing;
        UNSCOPED_INFO(fmt::format("{}: {} of {} differs at [{}]: offloaded {:.9g} vs on-device {:.9g}", what,
                                  tensor_kind_name(k), p.name, at, a.empty() ? 0.0f : a[static_cast<std::size_t>(at)],
                                  b.empty() ? 0.0f : b[static_cast<std::size_t>(at)]));
      }
    }
  }
  return differing;
}

struct Case {
  std::string name;
  std::string offload;  // the offload keys added to zero_optimization
  std::string precision;
  std::string baseline = "";  // the keys of the side compared with ("": on the device)
  std::string top = "";       // top-level keys of the offloaded side (the aio block)
  std::string optimizer = R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})";
  double clipping = 0.5;  // active: the clip coefficient (from the norm) enters every update
  int gas = 1;
  // 0: bitwise. Partial offload adds the device part's fp32 sum of squares to the host part's in fp32
  // (one more rounding than the device's single sum), so its norm, hence the clip coefficient, may differ
  // by an ulp: every update then differs by ~1e-7 relative, compounded over the steps.
  double rtol = 0.0;
};

ConfigText text_for(const Case& c, bool offload) {
  ConfigText t = trainer_config();
  t.optimizer = c.optimizer;
  t.precision = c.precision;
  t.clipping = c.clipping;
  t.gas = c.gas;
  t.zero = R"("stage3_param_persistence_threshold": 200)";
  if (offload) t.zero += ", " + c.offload;
  if (offload) t.top = c.top;
  if (!offload && !c.baseline.empty()) t.zero += ", " + c.baseline;
  return t;
}

// Trains both sides in lockstep and compares every step's result and, at the end, every tensor.
void run_case(const Case& c, const model::ModelConfig& mc) {
  const config::Config off_cfg = text_for(c, true).parse();
  const config::Config dev_cfg = text_for(c, false).parse();
  const auto units = model::model_units(mc);
  EngineTrainer off(off_cfg, mc, units);
  EngineTrainer dev(dev_cfg, mc, units);
  double worst_norm = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    double off_loss = 0.0;
    double dev_loss = 0.0;
    const StepResult a = off.train_step(s, &off_loss);
    const StepResult b = dev.train_step(s, &dev_loss);
    INFO(fmt::format("{}: step {}: grad norm {:.9g} vs {:.9g}, loss {:.9g} vs {:.9g}", c.name, s, a.grad_norm,
                     b.grad_norm, off_loss, dev_loss));
    CHECK(a.applied == b.applied);
    CHECK(a.loss_scale == b.loss_scale);
    CHECK(a.lr == b.lr);
    CHECK(rel(a.grad_norm, b.grad_norm) <= std::ldexp(1.0, -22));
    CHECK(rel(off_loss, dev_loss) <= c.rtol);
    worst_norm = std::max(worst_norm, rel(a.grad_norm, b.grad_norm));
  }
  const int differing = compare_all(off.engine(), dev.engine(), state_kinds(off_cfg), c.name, c.rtol);
  CHECK(differing == 0);
  if (world_rank() == 0) {
    std::printf("[np%d] offload %-44s %d tensors differ from %s (%s); grad-norm rel %.1e\n", world_size(),
                c.name.c_str(), differing, c.baseline.empty() ? "on-device" : "CPU offload",
                c.rtol == 0.0 ? "bitwise" : fmt::format("rtol {:.0e}", c.rtol).c_str(), worst_norm);
    std::fflush(stdout);
  }
}

}  // namespace

TEST_CASE("offloaded optimizer equals on-device: fp32, bf16, fp16", "[offload][equivalence]") {
  const model::ModelConfig mc = transformer();
  const std::string opt = R"("offload_optimizer": {"device": "cpu", "pin_memory": true})";
  const std::string both = opt + R"(, "offload_param": {"device": "cpu", "pin_memory": true})";
  const std::vector<Case> cases = {
      {"fp32 offload_optimizer", opt, ""},
      {"fp32 offload_optimizer + offload_param", both, ""},
      {"bf16 offload_optimizer", opt, R"("bf16": {"enabled": true})"},
      {"bf16 offload_optimizer + offload_param, pageable", R"("offload_optimizer": {"device": "cpu",
        "pin_memory": false}, "offload_param": {"device": "cpu", "pin_memory": false})",
       R"("bf16": {"enabled": true})"},
      {"fp16 offload_optimizer + offload_param", both, R"("fp16": {"enabled": true, "initial_scale_power": 8})"},
  };
  for (const Case& c : cases) run_case(c, mc);
}

TEST_CASE("partial offload (ratio 0.5) and sub-groups smaller than a unit equal on-device", "[offload][ratio]") {
  const model::ModelConfig mc = transformer();
  // sub_group_size 1000: the blocks' slices (a few thousand elements per rank) span several sub-groups,
  // whose boundaries fall inside params; with ratio 0.5 the first half of them stays on the device.
  const std::vector<Case> cases = {
      {"ratio 0.5, sub_group_size 1000", R"("sub_group_size": 1000,
        "offload_optimizer": {"device": "cpu", "ratio": 0.5})",
       R"("bf16": {"enabled": true})"},
      {"ratio 0.5 + offload_param", R"("sub_group_size": 1000, "offload_optimizer": {"device": "cpu",
        "ratio": 0.5}, "offload_param": {"device": "cpu"})",
       ""},
      {"ratio 0.5, no clipping", R"("sub_group_size": 1000, "offload_optimizer": {"device": "cpu",
        "ratio": 0.5})",
       ""},
      {"sub_group_size 100 (< a param)", R"("sub_group_size": 100, "offload_optimizer": {"device": "cpu"})", ""},
      {"ratio 0 (all on the device)", R"("offload_optimizer": {"device": "cpu", "ratio": 0.0})", ""},
  };
  for (Case c : cases) {
    if (c.name.starts_with("ratio 0.5")) c.rtol = 1e-5;
    if (c.name == "ratio 0.5, no clipping") {
      c.clipping = 0.0;  // no clip coefficient: nothing depends on the norm, so bitwise again
      c.rtol = 0.0;
    }
    run_case(c, mc);
  }
}

TEST_CASE("offload with gradient accumulation, Lion and Adagrad equals on-device", "[offload][optimizers]") {
  const model::ModelConfig mc = transformer();
  const std::string opt = R"("sub_group_size": 3000, "offload_optimizer": {"device": "cpu"})";
  Case accumulation{"AdamW, gradient accumulation 3", opt, R"("bf16": {"enabled": true})"};
  accumulation.gas = 3;
  Case lion{"Lion", opt, ""};
  lion.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
  Case adagrad{"Adagrad", opt, ""};
  adagrad.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
  Case adam{"Adam (L2), no clipping", opt, ""};
  adam.optimizer = R"({"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.01, "adam_w_mode": false}})";
  adam.clipping = 0.0;
  for (const Case& c : {accumulation, lion, adagrad, adam}) run_case(c, mc);
}

TEST_CASE("fp16 overflow with offload: the step is skipped and the CPU state stays bitwise", "[offload][overflow]") {
  const model::ModelConfig mc = transformer();
  Case c{"fp16 overflow", R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})",
         R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 1})"};
  const config::Config off_cfg = text_for(c, true).parse();
  const config::Config dev_cfg = text_for(c, false).parse();
  const auto units = model::model_units(mc);
  EngineTrainer off(off_cfg, mc, units);
  EngineTrainer dev(dev_cfg, mc, units);
  const std::string victim = "blocks.0.mlp.fc.weight";
  const std::vector<TensorKind> kinds = state_kinds(off_cfg);
  for (int s = 0; s < 4; ++s) {
    const bool inject = s == 2;
    std::vector<std::vector<float>> before;
    if (inject) {
      for (const TensorKind k : kinds) before.push_back(off.engine().gather_tensor(victim, k));
    }
    const StepResult a = [&] {
      off.forward_backward(s, 0, inject ? victim : std::string());
      return off.engine().step();
    }();
    const StepResult b = [&] {
      dev.forward_backward(s, 0, inject ? victim : std::string());
      return dev.engine().step();
    }();
    INFO(fmt::format("step {}: applied {} vs {}, loss scale {} vs {}", s, a.applied, b.applied, a.loss_scale,
                     b.loss_scale));
    CHECK(a.applied == !inject);
    CHECK(a.applied == b.applied);
    CHECK(a.next_loss_scale == b.next_loss_scale);
    if (inject) {
      CHECK(a.next_loss_scale == a.loss_scale / 2);
      for (std::size_t i = 0; i < kinds.size(); ++i) {
        INFO(tensor_kind_name(kinds[i]));
        CHECK(first_difference(off.engine().gather_tensor(victim, kinds[i]), before[i]) == -1);
      }
    }
  }
  CHECK(compare_all(off.engine(), dev.engine(), kinds, c.name) == 0);
}

TEST_CASE("offload keeps master, moments and accumulators in host memory, params too with offload_param",
          "[offload][memory]") {
  const model::ModelConfig mc = transformer();
  Case c{"memory", R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})", ""};
  EngineTrainer off(text_for(c, true).parse(), mc, model::model_units(mc));
  off.train_step(0);
  const MemoryTracker& m = off.engine().memory();
  // Nothing of the optimizer's in device memory; on the host device "device" is a memory kind of its own.
  CHECK(m.get(MemoryKind::device, MemCategory::master).current_bytes == 0);
  CHECK(m.get(MemoryKind::device, MemCategory::optim_state).current_bytes == 0);
  CHECK(m.get(MemoryKind::device, MemCategory::grad_shard).current_bytes == 0);
  CHECK(m.get(MemoryKind::pinned_host, MemCategory::master).current_bytes > 0);
  CHECK(m.get(MemoryKind::pinned_host, MemCategory::optim_state).current_bytes > 0);
  CHECK(m.get(MemoryKind::pinned_host, MemCategory::grad_shard).current_bytes > 0);
  CHECK(m.get(MemoryKind::pinned_host, MemCategory::param_shard).current_bytes > 0);
}

TEST_CASE("a pinned budget the node cannot hold fails before anything is allocated", "[offload][budget]") {
  const model::ModelConfig mc = transformer();
  const auto units = model::model_units(mc);
  const auto try_budget = [&](const std::string& zero3_extra, const std::string& offload,
                              std::initializer_list<const char*> parts) {
    ConfigText t = trainer_config();
    t.zero = R"("stage3_param_persistence_threshold": 200, )" + offload;
    t.zero3_extra = zero3_extra;
    const std::unique_ptr<Engine> e = make_engine(t.parse());  // unfinalized: finalize throws below
    for (const UnitSpec& u : units) e->add_unit(u);
    bool threw = false;
    try {
      e->finalize();
    } catch (const ConfigError& err) {
      threw = true;
      INFO(err.what());
      for (const char* part : parts) CHECK_THAT(err.what(), Catch::Contains(part));
    }
    CHECK(threw);
    // Nothing of the model was allocated: no shard, master, state or accumulator, in any memory.
    const MemoryTracker& m = e->memory();
    for (const MemoryKind k : {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::pageable_host}) {
      for (const MemCategory c :
           {MemCategory::param_shard, MemCategory::master, MemCategory::optim_state, MemCategory::grad_shard}) {
        CHECK(m.get(k, c).current_bytes == 0);
        CHECK(m.get(k, c).peak_bytes == 0);
      }
    }
  };
  const std::string both = R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
  const offload::HostMemoryFacts facts = offload::read_host_memory_facts();
  if (facts.memlock_limit && !facts.can_lock_beyond_limit && *facts.memlock_limit < (std::uint64_t{1} << 30)) {
    // Pinning by mlock (the host backend) without CAP_IPC_LOCK: a 1 GiB budget is past the memlock limit.
    // (tests/mpi/offload.tests.cmake runs this test once more with CAP_IPC_LOCK dropped, through setpriv.)
    try_budget(R"("pinned_memory_budget_gb": 1)", both, {"zero3.pinned_memory_budget_gb", "ulimit -l"});
  } else if (world_rank() == 0) {
    WARN(
        "memlock case not run: this process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK) or the "
        "limit is >= 1 GiB");
  }
  // More than the node has: an explicit budget of 1 PiB per rank.
  try_budget(R"("pinned_memory_budget_gb": 1048576)", both, {"zero3.pinned_memory_budget_gb", "GiB", "bytes"});
  // Less than the offload needs: 1 KiB.
  try_budget(R"("pinned_memory_budget_gb": 0.000001)", both, {"zero3.pinned_memory_budget_gb", "pin_memory"});
}

TEST_CASE("NVMe offload equals CPU offload bitwise", "[offload][nvme]") {
  const model::ModelConfig mc = transformer();
  const std::string dir = test::nvme_test_directory();
  const auto nvme = [&](const std::string& extra) {
    return fmt::format(R"("offload_optimizer": {{"device": "nvme", "nvme_path": "{}"{}}})", dir, extra);
  };
  const std::string cpu = R"("offload_optimizer": {"device": "cpu"})";
  const auto params_on_nvme = [&](int max_in_cpu, int buffers) {
    return fmt::format(
        R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}", "max_in_cpu": {}, "buffer_count": {}}})", dir,
        max_in_cpu, buffers);
  };
  const std::string pipelined = R"(, "pipeline_read": true, "pipeline_write": true)";
  std::vector<Case> cases = {
      {"nvme fp32, pipelined", nvme(pipelined), "", cpu},
      {"nvme bf16, not pipelined", nvme(""), R"("bf16": {"enabled": true})", cpu},
      // sub_group_size 1000: slices of 1024 elements, so the ring of 4 (buffer_count 16) turns many times,
      // and the arrivals are split at the same sub-group bounds as CPU offload's.
      {"nvme bf16, slices of 1024, ring of 4, offload_param",
       R"("sub_group_size": 1000, )" + nvme(pipelined + R"(, "buffer_count": 16)") +
           R"(, "offload_param": {"device": "cpu"})",
       R"("bf16": {"enabled": true})",
       R"("sub_group_size": 1000, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})"},
      {"nvme fp16 + offload_param", nvme(pipelined) + R"(, "offload_param": {"device": "cpu"})",
       R"("fp16": {"enabled": true, "initial_scale_power": 8})", cpu + R"(, "offload_param": {"device": "cpu"})"},
      // Params on NVMe: every unit but the persistent ones read from the file at each gather (max_in_cpu 0),
      // through 2 read buffers, so buffers are reused within a pass and the trace's read-ahead runs out.
      {"nvme params + nvme optimizer bf16, 2 read buffers", nvme(pipelined) + params_on_nvme(0, 2),
       R"("bf16": {"enabled": true})", cpu + R"(, "offload_param": {"device": "cpu"})"},
      {"nvme params + cpu optimizer fp32", cpu + params_on_nvme(0, 5), "",
       cpu + R"(, "offload_param": {"device": "cpu"})"},
      // max_in_cpu 1100: at 2 ranks the first of the two sharded units is kept in host memory, the second
      // read from the file; slices of 2048 elements that end inside units.
      {"nvme params (some kept) + nvme optimizer fp16, slices of 2048",
       R"("sub_group_size": 1000, )" + nvme(pipelined) + params_on_nvme(1100, 3),
       R"("fp16": {"enabled": true, "initial_scale_power": 8})",
       R"("sub_group_size": 1000, )" + cpu + R"(, "offload_param": {"device": "cpu"})"},
  };
  Case params_accumulation{"nvme params + nvme optimizer, gradient accumulation 3",
                           nvme(pipelined) + params_on_nvme(0, 2), R"("bf16": {"enabled": true})",
                           cpu + R"(, "offload_param": {"device": "cpu"})"};
  params_accumulation.gas = 3;
  cases.push_back(params_accumulation);
  Case accumulation{"nvme AdamW, gradient accumulation 3, 4 KiB requests",
                    R"("sub_group_size": 3000, )" + nvme(pipelined), R"("bf16": {"enabled": true})",
                    R"("sub_group_size": 3000, )" + cpu};
  accumulation.gas = 3;
  accumulation.top = R"("aio": {"block_size": 4096, "queue_depth": 2})";
  Case lion{"nvme Lion, gradient accumulation 3", nvme(pipelined), "", cpu};
  lion.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
  lion.gas = 3;
  Case adagrad{"nvme Adagrad", R"("sub_group_size": 1000, )" + nvme(pipelined), "",
               R"("sub_group_size": 1000, )" + cpu};
  adagrad.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
  for (const Case& c : {accumulation, lion, adagrad}) cases.push_back(c);
  for (const Case& c : cases) {
    run_case(c, mc);
    CHECK(test::nvme_rank_directory_removed(dir, world_rank()));
  }
}

TEST_CASE("NVMe offload of params: the gathers read the shards from the file, the step writes them back",
          "[offload][nvme]") {
  const model::ModelConfig mc = transformer();
  const std::string dir = test::nvme_test_directory();
  const std::string optimizer = fmt::format(
      R"("offload_optimizer": {{"device": "nvme", "nvme_path": "{}", "pipeline_read": true, "pipeline_write": true}})",
      dir);
  const std::string params = fmt::format(
      R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}", "max_in_cpu": 0, "buffer_count": 3}})", dir);
  const auto disk_per_step = [&](const std::string& offload, int steps) {
    Case c{"disk", offload, R"("bf16": {"enabled": true})"};
    EngineTrainer e(text_for(c, true).parse(), mc, model::model_units(mc));
    std::vector<DiskTimes> out;
    for (int s = 0; s < steps; ++s) {
      e.train_step(s);
      out.push_back(e.engine().stats().last_step_disk);
    }
    return std::make_pair(out, e.engine().memory().get(MemoryKind::pinned_host, MemCategory::param_shard).peak_bytes);
  };
  const auto [with, kept_bytes] = disk_per_step(optimizer + params, 3);
  const auto [without, unused] = disk_per_step(optimizer, 3);
  (void)unused;
  // The shards not kept in host memory (every sharded unit's: max_in_cpu 0), from the layout every rank shares.
  const Case probe{"probe", optimizer, R"("bf16": {"enabled": true})"};
  const config::Config cfg = text_for(probe, true).parse();
  const MemoryPlan plan = plan_memory(model::model_units(mc), cfg, {});
  const std::uint64_t shards = plan.peak.at(MemoryKind::device, MemCategory::param_shard);  // every shard, bf16
  const std::uint64_t on_disk = shards - kept_bytes;
  INFO(fmt::format("[np{}] shards {} bytes, kept {} bytes", world_rank(), shards, kept_bytes));
  REQUIRE(on_disk > 0);
  const std::uint64_t slack = 2 * 2 * 4096 * mc.layers;  // whole blocks around each unit's two group spans
  for (std::size_t s = 0; s < with.size(); ++s) {
    INFO(fmt::format("step {}: params read {} bytes, the update wrote {} bytes (without params on NVMe {})", s + 1,
                     with[s].param_read_bytes, with[s].step_write_bytes, without[s].step_write_bytes));
    // Each sharded unit is read at least once (forward) and at most twice (backward too) per micro-batch.
    CHECK(with[s].param_read_bytes >= on_disk);
    CHECK(with[s].param_read_bytes <= 2 * (on_disk + slack));
    CHECK(without[s].param_read_bytes == 0);
    // The update writes the new params besides the master and moments.
    CHECK(with[s].step_write_bytes >= without[s].step_write_bytes + on_disk);
    CHECK(with[s].step_read_bytes == without[s].step_read_bytes);
  }
}

namespace {

// The offloaded side of an NVMe case whose nvme_path is `dir`; `params` (offload_param's keys after device and
// nvme_path): the params on NVMe too, under test::nvme_test_directory() (and the optimizer's files under `dir`
// unless params_at_dir, in which case the params' are there and the optimizer's under the test directory).
config::Config nvme_config(const std::string& dir, const std::string& params = "", bool params_at_dir = false) {
  const std::string root = test::nvme_test_directory();
  std::string zero =
      fmt::format(R"("offload_optimizer": {{"device": "nvme", "nvme_path": "{}"}})", params_at_dir ? root : dir);
  if (!params.empty() || params_at_dir) {
    zero += fmt::format(R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}"{}}})", params_at_dir ? dir : root,
                        params);
  }
  Case c{"nvme", zero, ""};
  return text_for(c, true).parse();
}

// finalize() of an NVMe job with nvme_path `dir` throws ConfigError containing every part.
void check_refused(const std::string& dir, std::initializer_list<std::string> parts, const std::string& params = "",
                   bool params_at_dir = false) {
  const model::ModelConfig mc = transformer();
  bool threw = false;
  try {
    EngineTrainer e(nvme_config(dir, params, params_at_dir), mc, model::model_units(mc));
  } catch (const ConfigError& err) {
    threw = true;
    INFO(err.what());
    for (const std::string& part : parts) CHECK_THAT(err.what(), Catch::Contains(part));
  }
  CHECK(threw);
}

// A tmpfs of `size` that rank 0 mounts at `dir` (root only, where mounting is allowed; every rank learns whether
// it did) and detaches and removes when the scope ends, also when a check throws.
class Tmpfs {
 public:
  Tmpfs(std::string dir, const std::string& size) : dir_(std::move(dir)) {
    int ok = 0;
    if (world_rank() == 0) {
      std::filesystem::create_directories(dir_);
      ok = ::geteuid() == 0 && ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0 ? 1 : 0;
    }
    mounted_ = comm::broadcast_value(*env().bootstrap, ok, 0) == 1;
  }
  ~Tmpfs() {
    if (world_rank() != 0) return;
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ignored;
    std::filesystem::remove(dir_, ignored);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

}  // namespace

TEST_CASE("NVMe offload: a path that cannot hold the state is refused before training", "[nvme][errors]") {
  const std::string root = test::nvme_test_directory();
  const std::string key = "zero_optimization.offload_optimizer.nvme_path";
  check_refused(root + "/missing", {key, root + "/missing", "does not exist"});
  const std::string file = fmt::format("{}/a-file-rank{}", root, world_rank());
  std::fclose(std::fopen(file.c_str(), "w"));
  check_refused(file, {key, "not a directory"});
  // offload_param's own path, and its buffers.
  const std::string param_key = "zero_optimization.offload_param.nvme_path";
  check_refused(root + "/missing", {param_key, root + "/missing", "does not exist"}, "", true);
  check_refused(file, {param_key, "not a directory"}, "", true);
  check_refused(root, {"zero_optimization.offload_param.buffer_size", "use at least"},
                R"(, "max_in_cpu": 0, "buffer_size": 10)");
  check_refused(root, {"zero_optimization.offload_param.buffer_count", "at least 1"},
                R"(, "max_in_cpu": 0, "buffer_count": 0)");
  std::filesystem::remove(file);
  // A real disk too small: a 64 KiB tmpfs for the ranks' files (about 74 KiB each).
  const std::string small = fmt::format("{}/small-{}", root, comm::broadcast_value(*env().bootstrap, ::getpid(), 0));
  const Tmpfs disk(small, "64k");
  if (!disk.mounted()) {
    if (world_rank() == 0) WARN("tmpfs not mounted (needs root and CAP_SYS_ADMIN): the full-disk case did not run");
    return;
  }
  check_refused(small, {key, "bytes"});
  env().bootstrap->barrier();
}

TEST_CASE("NVMe offload: a disk that fills up during training fails no step (the files are reserved)",
          "[nvme][errors]") {
  const std::string root = test::nvme_test_directory();
  const std::string dir = fmt::format("{}/filling-{}", root, comm::broadcast_value(*env().bootstrap, ::getpid(), 0));
  const Tmpfs disk(dir, "4m");
  if (!disk.mounted()) {
    if (world_rank() == 0) WARN("tmpfs not mounted (needs root and CAP_SYS_ADMIN): the case did not run");
    return;
  }
  {
    const model::ModelConfig mc = transformer();
    Case c{"nvme, gradient accumulation 3",
           fmt::format(R"("offload_optimizer": {{"device": "nvme", "nvme_path": "{}"}})", dir), ""};
    c.gas = 3;
    EngineTrainer e(text_for(c, true).parse(), mc, model::model_units(mc));
    CHECK(e.train_step(0).applied);
    env().bootstrap->barrier();
    if (world_rank() == 0) {  // fill what is left
      std::FILE* f = std::fopen((dir + "/filler").c_str(), "w");
      const std::vector<char> block(1 << 16, 'x');
      while (f != nullptr && std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
      }
      if (f != nullptr) std::fclose(f);
    }
    env().bootstrap->barrier();
    for (int s = 1; s < 3; ++s) CHECK(e.train_step(s).applied);
  }
  env().bootstrap->barrier();
}

TEST_CASE("NVMe offload: a read that fails in a step stops every rank with the file and the offset", "[nvme][errors]") {
  const model::ModelConfig mc = transformer();
  const std::string root = test::nvme_test_directory();
  EngineTrainer e(nvme_config(root), mc, model::model_units(mc));
  e.train_step(0);
  const int victim = world_size() - 1;
  std::string truncated;
  if (world_rank() == victim) {  // the rank's master file loses its contents under the job
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (name.find(fmt::format("-{}-", ::getpid())) != std::string::npos &&
          name.ends_with(fmt::format("-rank{}", victim))) {
        truncated = (entry.path() / "master.fp32").string();
      }
    }
    REQUIRE(!truncated.empty());
    REQUIRE(::truncate(truncated.c_str(), 0) == 0);
  }
  truncated = comm::broadcast_string(*env().bootstrap, truncated, victim);
  bool threw = false;
  try {
    e.train_step(1);
  } catch (const IoError& err) {
    threw = true;
    INFO(err.what());
    CHECK_THAT(err.what(), Catch::Contains(fmt::format("rank {}", victim)));
    CHECK_THAT(err.what(), Catch::Contains(truncated));
    CHECK_THAT(err.what(), Catch::Contains("offset"));
  }
  CHECK(threw);
}
