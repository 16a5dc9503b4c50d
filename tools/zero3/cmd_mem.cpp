// `zero3 mem plan --config F [--world-size N] [--ranks-per-node K] [--model.* ...] [--json]`: the memory
// plan of a `zero3 train` job (zero3/engine/memory_plan.hpp) before anything is allocated or launched: per
// rank, the peak bytes of each memory kind by category, what each is made of, and beside it what
// DeepSpeed's own estimator (estimate_zero3_model_states_mem_needs_all_live) says for the same model.
// --json prints the shape `zero3 train --memory-json` writes (train/memory_report.hpp), plus the plan's
// explanations and the DeepSpeed figures.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "train_config.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/resident.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/memory_report.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace zero3::tools {
namespace {

constexpr double kMiB = 1 << 20;

struct PlanOptions {
  TrainConfigOptions train;
  int world_size = 1;
  int ranks_per_node = 0;  // 0: min(world size, 8)
  bool json = false;
};

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) / kMiB);
}

void print_table(const MemoryPlan& plan, const config::Config& cfg, std::uint64_t params, const std::string& model) {
  fmt::print("zero3 mem plan: {} ({} params), {} ranks ({} per node), batch {} = micro {} x accumulation {} x {}\n",
             model, params, plan.world_size, plan.ranks_per_node, cfg.batch.train_batch_size,
             cfg.batch.train_micro_batch_size_per_gpu, cfg.batch.gradient_accumulation_steps, plan.world_size);
  fmt::print("per rank, each category at its peak (MiB); every rank holds the same\n");
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    if (plan.peak_total(kind) == 0) continue;
    fmt::print("{} {:>10} MiB\n{}", memory_kind_name(kind), mib(plan.peak_total(kind)), plan.describe_kind(kind));
  }
  fmt::print(
      "resident memory of a rank's process (what ru_maxrss reports): {} MiB = {} MiB of this program's own "
      "(code, libraries) + {} MiB the MPI library takes inside a gradient reduction + {}\n",
      mib(plan.resident_peak()), mib(plan.resident_base), mib(plan.library_temporary),
      plan.device_memory_on_host ? "every kind above (the host device's memory is host memory)"
                                 : "the host kinds above (device memory is the GPU's)");
  fmt::print(
      "optimizer storage per trainable param: {} bytes = {} master ({} B) + {} optimizer state(s) in {} ({} B each) + "
      "fp32 gradient accumulator (4 B)\n",
      plan.optimizer_bytes_per_param, dtype_name(plan.master_dtype), size_of(plan.master_dtype), plan.optimizer_states,
      dtype_name(plan.state_dtype), size_of(plan.state_dtype));
  if (plan.nvme_file_bytes > 0) {
    fmt::print(
        "NVMe offload: {} MiB of files per rank under offload_optimizer.nvme_path; each optimizer step reads {} MiB "
        "and writes {} MiB of them\n",
        mib(plan.nvme_file_bytes), mib(plan.nvme_read_bytes_per_step), mib(plan.nvme_write_bytes_per_step));
  }
  const DeepSpeedEstimate& ds = plan.deepspeed;
  fmt::print("\nDeepSpeed's estimate_zero3_model_states_mem_needs_all_live for the same model (model states only):\n");
  if (!ds.covered) {
    fmt::print("  not evaluated for offload_param without offload_optimizer (DeepSpeed prints no such row)\n");
    return;
  }
  fmt::print("  P = {} params, largest layer L = {} params; {:.2f} MiB per GPU, {:.2f} MiB per node's CPUs\n",
             ds.total_params, ds.largest_layer, static_cast<double>(ds.gpu_bytes_per_gpu) / kMiB,
             static_cast<double>(ds.cpu_bytes_per_node) / kMiB);
  fmt::print(
      "  zero3's plan per GPU: {:.2f} MiB device; it adds what DeepSpeed's leaves out: gathered params, gradient "
      "buffers, communication buffers, staging, activations\n",
      static_cast<double>(plan.peak_total(MemoryKind::device)) / kMiB);
}

void run_plan(const PlanOptions& o) {
  const config::Config cfg = load_train_config(o.train, o.world_size, "--world-size");
  const config::ModelSettings& ms = *cfg.zero3.model;
  // The plan is of ranks elsewhere; this host holds the model's unit records alone, so it checks those.
  train::check_model_size(cfg, 1, 1, 0, static_cast<std::uint64_t>(ms.layers) + 2, std::nullopt);
  const std::unique_ptr<Device> host = make_host_device();
  const std::unique_ptr<models::UnitModel> model = models::make_train_model(ms, *host);
  const int ranks_per_node = o.ranks_per_node > 0 ? o.ranks_per_node : std::min(o.world_size, 8);
  // zero3.device (--device overrides it): "auto" plans for a GPU where this machine has one.
  const bool cuda = cfg.zero3.device == config::DeviceChoice::cuda ||
                    (cfg.zero3.device == config::DeviceChoice::automatic && cuda_device_count() > 0);
  const DeviceKind device = cuda ? DeviceKind::cuda : DeviceKind::host;
  MemoryPlanOptions options;
  options.ranks_per_node = ranks_per_node;
  options.device = device;
  // A rank runs this same program: its resident size now (libraries loaded, no job allocated) stands for the
  // rank's before its job allocates.
  options.resident_base_bytes = resident_bytes().value_or(0);
  options.activations = train::plan_activations(
      *model, cfg, cfg.batch.train_micro_batch_size_per_gpu, heldout_batch_per_rank(cfg, o.train, o.world_size),
      static_cast<int>(ms.seq_len), device == DeviceKind::cuda ? MemoryKind::device : model->activation_memory());
  const MemoryPlan plan = plan_memory(model->units(), cfg, options);
  if (o.json) {
    fmt::print("{}\n", train::plan_json(plan).dump(1));
    return;
  }
  print_table(plan, cfg, models::train_model_params(ms), model->describe());
}

}  // namespace

void add_mem_command(CLI::App& app) {
  CLI::App* group =
      app.add_subcommand("mem", "Memory: a job's plan before launch, what fits, the report of a profiled run");
  group->require_subcommand(1);
  auto opt = std::make_shared<PlanOptions>();
  CLI::App* plan = group->add_subcommand(
      "plan", "Per rank, the peak bytes of each memory kind by category, derived from the config before anything runs");
  add_train_config_options(*plan, opt->train);
  plan->add_option("--world-size", opt->world_size, "Ranks of the job")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  plan->add_option("--ranks-per-node", opt->ranks_per_node,
                   "Ranks on one node (DeepSpeed's estimate is per node); "
                   "default: the world size, at most 8")
      ->check(CLI::Range(1, 1 << 20));
  plan->add_flag("--json", opt->json, "One JSON object: per rank peak_bytes by kind and category, as --memory-json");
  plan->callback([opt] { run_plan(*opt); });
  add_mem_report_command(*group);
  add_mem_fit_command(*group);
}

}  // namespace zero3::tools
