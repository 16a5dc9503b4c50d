// `zero3 mem fit --config F --world-size N --device-memory-gb G`: does the job fit a device of G GiB per
// rank, and if not, which settings make it fit with the least slowdown. Each candidate is the config with
// one setting changed (or offload with a smaller micro-batch), planned (zero3/engine/memory_plan.hpp) and
// costed by the time the change adds to a step, from the bytes it moves and the bandwidths given
// (--pcie-gbps, --net-gbps, --cpu-gparams) or the compute it repeats (--tflops, --hbm-gbps: activation
// checkpointing): a first-order model to rank the candidates, stated with them. With --host-memory-gb the
// host memory of a node counts too (pinned and pageable, every rank of the node): each candidate that offloads
// the optimizer is also tried with its state on NVMe (its traffic at --disk-gbps, the node's disk shared by
// its ranks) and with 16-bit master weights and moments (bf16 or fp16 jobs).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "train_config.hpp"
#include "zero3/config/schema.hpp"
#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace zero3::tools {
namespace {

constexpr double kGiB = 1 << 30;

struct FitOptions {
  TrainConfigOptions train;
  int world_size = 1;
  double device_memory_gb = 0.0;
  double pcie_gbps = 20.0;      // host <-> device, per rank
  double net_gbps = 50.0;       // all-gather / reduce-scatter, per rank
  double cpu_gparams = 1.0;     // CPU optimizer, per rank
  double tflops = 200.0;        // the device's achieved dense matrix-product rate, per rank
  double hbm_gbps = 2000.0;     // the device's memory bandwidth, per rank
  double host_memory_gb = 0.0;  // per node; 0: host memory is not checked
  double disk_gbps = 2.0;       // the NVMe disk's read + write bandwidth, per node
};

struct Candidate {
  std::string change;
  config::Config config;
  std::uint64_t device_bytes = 0;
  double extra_ms = 0.0;         // the model's estimate of what the change adds to a step
  std::string why;               // how extra_ms was estimated
  std::uint64_t host_bytes = 0;  // pinned + pageable, per rank
};

class Fitter {
 public:
  explicit Fitter(const FitOptions& o)
      : o_(o),
        base_(load_train_config(o.train, o.world_size, "--world-size")),
        host_(make_host_device()),
        model_(models::make_train_model(*base_.zero3.model, *host_)),
        eval_batch_(heldout_batch_per_rank(base_, o.train, o.world_size)) {
    for (const UnitSpec& u : model_->units()) {
      std::uint64_t n = 0;
      for (const ParamSpec& p : u.params) n += p.numel();
      params_ += n;
      largest_ = std::max(largest_, n);
    }
  }

  int ranks_per_node() const { return std::min(o_.world_size, 8); }

  MemoryPlan plan(const config::Config& c) const {
    MemoryPlanOptions options;
    options.device = DeviceKind::cuda;
    options.ranks_per_node = ranks_per_node();
    options.activations = train::plan_activations(*model_, c, c.batch.train_micro_batch_size_per_gpu, eval_batch_,
                                                  static_cast<int>(c.zero3.model->seq_len), MemoryKind::device);
    return plan_memory(model_->units(), c, options);
  }

  // Whether a plan's device and host bytes fit the budgets (host: the node's ranks together).
  bool fits(std::uint64_t device_bytes, std::uint64_t host_bytes) const {
    if (static_cast<double>(device_bytes) > o_.device_memory_gb * kGiB) return false;
    return o_.host_memory_gb <= 0.0 || static_cast<double>(host_bytes) * ranks_per_node() <= o_.host_memory_gb * kGiB;
  }

  std::vector<Candidate> candidates() const {
    std::vector<Candidate> out;
    const double shard = static_cast<double>(params_) / o_.world_size;  // elements of this rank's shard
    const auto bytes_of = [](DType t) { return static_cast<double>(size_of(t)); };
    const auto gas = static_cast<double>(base_.batch.gradient_accumulation_steps);
    const double dt = static_cast<double>(size_of(base_.model_dtype()));
    const auto add = [&](std::string change, config::Config c, double extra_ms, std::string why) {
      out.push_back({std::move(change), std::move(c), 0, extra_ms, std::move(why)});
    };
    // Smaller prefetch and live budgets: gathers overlap compute less; first order, no extra bytes.
    for (std::int64_t b = base_.zero.prefetch_bucket_size / 2; b >= static_cast<std::int64_t>(largest_); b /= 2) {
      config::Config c = base_;
      c.zero.prefetch_bucket_size = b;
      add(fmt::format("stage3_prefetch_bucket_size {}", b), c, 0.0, "no extra bytes; less gather overlap");
    }
    for (std::int64_t l =
             std::min<std::int64_t>(base_.zero.max_live_parameters, static_cast<std::int64_t>(params_)) / 2;
         l >= static_cast<std::int64_t>(largest_); l /= 2) {
      config::Config c = base_;
      c.zero.max_live_parameters = l;
      c.zero.prefetch_bucket_size = std::min(c.zero.prefetch_bucket_size, l);
      add(fmt::format("stage3_max_live_parameters {}", l), c, 0.0, "no extra bytes; less gather overlap");
    }
    // A smaller micro-batch, the global batch kept by more accumulation: each micro-batch gathers every
    // unit twice again.
    for (std::int64_t m = base_.batch.train_micro_batch_size_per_gpu / 2; m >= 1; m /= 2) {
      if (base_.batch.train_batch_size % (m * o_.world_size) != 0) continue;
      config::Config c = base_;
      c.batch.train_micro_batch_size_per_gpu = m;
      c.batch.gradient_accumulation_steps = base_.batch.train_batch_size / (m * o_.world_size);
      const double extra_micro =
          static_cast<double>(c.batch.gradient_accumulation_steps - base_.batch.gradient_accumulation_steps);
      const double ms = extra_micro * 2.0 * static_cast<double>(params_) * dt / (o_.net_gbps * 1e9) * 1e3;
      add(fmt::format("train_micro_batch_size_per_gpu {} (accumulation {})", m, c.batch.gradient_accumulation_steps), c,
          ms, fmt::format("{} more micro-batches x 2 all-gathers of the model at {} GB/s", extra_micro, o_.net_gbps));
    }
    // The optimizer offloaded, on a fraction of the sub-groups or all.
    for (const double ratio : {0.25, 0.5, 0.75, 1.0}) {
      config::Config c = base_;
      c.zero.offload_optimizer.device = config::OffloadDevice::cpu;
      c.zero.offload_optimizer.ratio = ratio;
      const double elems = shard * ratio;
      const double ms =
          (elems * (bytes_of(c.communication_data_type) + dt) / (o_.pcie_gbps * 1e9) + elems / (o_.cpu_gparams * 1e9)) *
          1e3;
      add(fmt::format("offload_optimizer cpu, ratio {}", ratio), c, ms,
          fmt::format("gradients down and params up over PCIe at {} GB/s, the CPU step at {} Gparam/s", o_.pcie_gbps,
                      o_.cpu_gparams));
    }
    // Params offloaded too: every gather first copies the rank's shard up.
    config::Config both = base_;
    both.zero.offload_optimizer.device = config::OffloadDevice::cpu;
    both.zero.offload_param.device = config::OffloadDevice::cpu;
    const double both_ms = (shard * (bytes_of(both.communication_data_type) + dt) / (o_.pcie_gbps * 1e9) +
                            shard / (o_.cpu_gparams * 1e9) + 2.0 * shard * dt * gas / (o_.pcie_gbps * 1e9)) *
                           1e3;
    add("offload_optimizer cpu + offload_param cpu", both, both_ms,
        "as offload_optimizer, plus the shard copied up for each of a micro-batch's two gathers");
    // Offload with a smaller micro-batch, for jobs whose activations are the problem.
    for (std::int64_t m = base_.batch.train_micro_batch_size_per_gpu / 2; m >= 1; m /= 2) {
      if (base_.batch.train_batch_size % (m * o_.world_size) != 0) continue;
      config::Config c = both;
      c.batch.train_micro_batch_size_per_gpu = m;
      c.batch.gradient_accumulation_steps = base_.batch.train_batch_size / (m * o_.world_size);
      const double extra = static_cast<double>(c.batch.gradient_accumulation_steps);
      const double ms = both_ms + (extra - gas) *
                                      (2.0 * static_cast<double>(params_) * dt / (o_.net_gbps * 1e9) +
                                       2.0 * shard * dt / (o_.pcie_gbps * 1e9)) *
                                      1e3;
      add(fmt::format("offload_optimizer + offload_param, micro-batch {} (accumulation {})", m,
                      c.batch.gradient_accumulation_steps),
          c, ms, "both offloads, and each extra micro-batch's gathers and copies");
    }
    add_recompute_candidates(out, both, both_ms);
    if (o_.host_memory_gb > 0.0) add_state_storage_candidates(out);
    for (Candidate& c : out) {
      const MemoryPlan p = plan(c.config);
      c.device_bytes = p.peak_total(MemoryKind::device);
      c.host_bytes = p.peak_total(MemoryKind::pinned_host) + p.peak_total(MemoryKind::pageable_host);
    }
    return out;
  }

  // For host memory: every candidate with the whole optimizer state offloaded, again with the state in files
  // (NVMe: its traffic at --disk-gbps, shared by the node's ranks), with 16-bit master weights and moments
  // (no time added: fewer bytes to step; the update rounds once per stored value, docs/optim.md), and both.
  void add_state_storage_candidates(std::vector<Candidate>& out) const {
    const bool bf16 = base_.bf16.enabled;
    const bool fp16 = base_.fp16.enabled;
    const std::size_t n = out.size();
    for (std::size_t i = 0; i < n; ++i) {
      const Candidate from = out[i];  // a copy: out grows below
      const config::OffloadConfig& off = from.config.zero.offload_optimizer;
      if (off.device != config::OffloadDevice::cpu || off.ratio < 1.0) continue;
      for (const bool nvme : {false, true}) {
        for (const bool narrow : {false, true}) {
          if (!nvme && !narrow) continue;
          if (narrow && !bf16 && !fp16) continue;
          Candidate c = from;
          std::string change = c.change;
          std::string why = c.why;
          if (narrow) {
            if (bf16) {
              c.config.bf16.bf16_master_weights_and_grads = true;
              c.config.bf16.bf16_optimizer_states = true;
              change += " + bf16 master and optimizer states";
            } else {
              c.config.fp16.fp16_master_weights_and_grads = true;
              change += " + fp16 master weights";
            }
            why += "; 16-bit state rounded once per stored value";
          }
          if (!nvme) {
            out.push_back({std::move(change), std::move(c.config), 0, c.extra_ms, std::move(why)});
            continue;
          }
          c.config.zero.offload_optimizer.device = config::OffloadDevice::nvme;
          c.config.zero.offload_optimizer.nvme_path = "/local_nvme";  // planned only: any directory
          out.push_back(on_disk(c, change + " + state on NVMe (nvme_path)", why));
          if (c.config.zero.offload_param.device == config::OffloadDevice::cpu) {
            // The params too, every sharded unit read at its gathers (max_in_cpu 0).
            c.config.zero.offload_param.device = config::OffloadDevice::nvme;
            c.config.zero.offload_param.nvme_path = "/local_nvme";
            c.config.zero.offload_param.max_in_cpu = 0;
            out.push_back(on_disk(c, change + " + state and params on NVMe (nvme_path, max_in_cpu 0)", why));
          }
        }
      }
    }
  }

  // `c` with its NVMe traffic per step timed at --disk-gbps (the node's ranks share the disk).
  Candidate on_disk(const Candidate& c, std::string change, const std::string& why) const {
    const MemoryPlan p = plan(c.config);
    const double bytes = static_cast<double>(p.nvme_read_bytes_per_step + p.nvme_write_bytes_per_step);
    return {std::move(change), c.config, 0, c.extra_ms + bytes * ranks_per_node() / (o_.disk_gbps * 1e9) * 1e3,
            why + fmt::format("; {:.1f} GiB per rank read and written per step on a {} GB/s disk per node",
                              bytes / kGiB, o_.disk_gbps)};
  }

  // Activation checkpointing, alone and with the offloads: full reruns each unit's forward (its matrix
  // products, about 2 flops per param per token, at --tflops); selective reruns the norms and the activation
  // (memory-bound: their inputs read and outputs written at --hbm-gbps).
  void add_recompute_candidates(std::vector<Candidate>& out, const config::Config& both, double both_ms) const {
    if (!base_.zero3.model || base_.activation_checkpointing.cpu_checkpointing) return;
    const config::ModelSettings& m = *base_.zero3.model;
    const double tokens = static_cast<double>(base_.batch.train_micro_batch_size_per_gpu) *
                          static_cast<double>(m.seq_len) * static_cast<double>(base_.batch.gradient_accumulation_steps);
    const double full_ms = 2.0 * static_cast<double>(params_) * tokens / (o_.tflops * 1e12) * 1e3;
    const double width = static_cast<double>(2 * m.hidden_size + std::max(m.intermediate_size, 4 * m.hidden_size));
    const double selective_ms = 2.0 * tokens * width * static_cast<double>(m.layers) * 4.0 / (o_.hbm_gbps * 1e9) * 1e3;
    config::Config optimizer = base_;
    optimizer.zero.offload_optimizer.device = config::OffloadDevice::cpu;
    // As the offload_optimizer candidate at ratio 1: gradients down, params up, the CPU step.
    const double shard = static_cast<double>(params_) / o_.world_size;
    const double optimizer_ms = (shard *
                                     (static_cast<double>(size_of(optimizer.communication_data_type)) +
                                      static_cast<double>(size_of(base_.model_dtype()))) /
                                     (o_.pcie_gbps * 1e9) +
                                 shard / (o_.cpu_gparams * 1e9)) *
                                1e3;
    const struct {
      const char* name;
      const config::Config* config;
      double ms;
    } bases[] = {{"", &base_, 0.0},
                 {" + offload_optimizer cpu", &optimizer, optimizer_ms},
                 {" + offload_optimizer cpu + offload_param cpu", &both, both_ms}};
    // cpu_checkpointing: the kept inputs (one [tokens, hidden] per layer) down in forward and up in backward.
    const double kept_ms = 2.0 * tokens * static_cast<double>(m.hidden_size * m.layers) *
                           static_cast<double>(size_of(base_.model_dtype())) / (o_.pcie_gbps * 1e9) * 1e3;
    for (const auto& b : bases) {
      config::Config c = *b.config;
      c.zero3.model->activation_checkpointing = Recompute::full;
      c.activation_checkpointing.cpu_checkpointing = true;
      out.push_back(
          {fmt::format("activation_checkpointing full + cpu_checkpointing{}", b.name), std::move(c), 0,
           b.ms + full_ms + kept_ms,
           fmt::format("a second forward's products at {} TFLOP/s and the kept inputs' copies at {} GB/s "
                       "(if not hidden behind compute){}",
                       o_.tflops, o_.pcie_gbps, b.ms > 0.0 ? ", and the offload's copies and CPU step" : "")});
    }
    // Checkpointing with a smaller micro-batch: each extra micro-batch gathers the model twice more.
    const double dt = static_cast<double>(size_of(base_.model_dtype()));
    for (const Recompute mode : {Recompute::selective, Recompute::full}) {
      if (mode == m.activation_checkpointing) continue;  // the micro-batch candidates alone are these
      for (std::int64_t micro = base_.batch.train_micro_batch_size_per_gpu / 2; micro >= 1; micro /= 2) {
        if (base_.batch.train_batch_size % (micro * o_.world_size) != 0) continue;
        config::Config c = base_;
        c.zero3.model->activation_checkpointing = mode;
        c.batch.train_micro_batch_size_per_gpu = micro;
        c.batch.gradient_accumulation_steps = base_.batch.train_batch_size / (micro * o_.world_size);
        const double extra =
            static_cast<double>(c.batch.gradient_accumulation_steps - base_.batch.gradient_accumulation_steps);
        const double gathers_ms = extra * 2.0 * static_cast<double>(params_) * dt / (o_.net_gbps * 1e9) * 1e3;
        const bool full = mode == Recompute::full;
        out.push_back({fmt::format("activation_checkpointing {} + micro-batch {} (accumulation {})", to_string(mode),
                                   micro, c.batch.gradient_accumulation_steps),
                       std::move(c), 0, (full ? full_ms : selective_ms) + gathers_ms,
                       fmt::format("{}, and {} more micro-batches x 2 all-gathers of the model",
                                   full ? "a second forward's products" : "norms and activations again", extra)});
      }
    }
    for (const Recompute mode : {Recompute::selective, Recompute::full}) {
      if (mode == m.activation_checkpointing) continue;
      for (const auto& b : bases) {
        config::Config c = *b.config;
        c.zero3.model->activation_checkpointing = mode;
        const bool full = mode == Recompute::full;
        out.push_back({fmt::format("activation_checkpointing {}{}", to_string(mode), b.name), std::move(c), 0,
                       b.ms + (full ? full_ms : selective_ms),
                       fmt::format("{}{}",
                                   full ? fmt::format("a second forward's products at {} TFLOP/s", o_.tflops)
                                        : fmt::format("norms and activations again at {} GB/s", o_.hbm_gbps),
                                   b.ms > 0.0 ? ", and the offload's copies and CPU step" : "")});
      }
    }
  }

  const config::Config& base() const { return base_; }

 private:
  const FitOptions& o_;
  config::Config base_;
  std::unique_ptr<Device> host_;
  std::unique_ptr<models::UnitModel> model_;
  int eval_batch_ = 0;
  std::uint64_t params_ = 0;
  std::uint64_t largest_ = 0;
};

void run_fit(const FitOptions& o) {
  const Fitter fitter(o);
  const MemoryPlan plan = fitter.plan(fitter.base());
  const std::uint64_t as_is = plan.peak_total(MemoryKind::device);
  const std::uint64_t as_is_host =
      plan.peak_total(MemoryKind::pinned_host) + plan.peak_total(MemoryKind::pageable_host);
  const bool fits_as_is = fitter.fits(as_is, as_is_host);
  fmt::print(
      "zero3 mem fit: {} ranks, {:.2f} GiB of device memory each{}; the job as configured needs {:.3f} GiB per "
      "rank{}: {}\n",
      o.world_size, o.device_memory_gb,
      o.host_memory_gb > 0.0 ? fmt::format(" and {:.2f} GiB of host memory per node", o.host_memory_gb) : "",
      static_cast<double>(as_is) / kGiB,
      o.host_memory_gb > 0.0
          ? fmt::format(" and {:.3f} GiB of host memory per node ({} ranks)",
                        static_cast<double>(as_is_host) * fitter.ranks_per_node() / kGiB, fitter.ranks_per_node())
          : "",
      fits_as_is ? "it fits" : "it does not fit");
  if (fits_as_is) return;
  std::vector<Candidate> fits;
  for (Candidate& c : fitter.candidates()) {
    if (fitter.fits(c.device_bytes, c.host_bytes)) fits.push_back(std::move(c));
  }
  std::stable_sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
    return a.extra_ms != b.extra_ms ? a.extra_ms < b.extra_ms : a.device_bytes < b.device_bytes;
  });
  if (fits.empty()) {
    throw ConfigError(fmt::format(
        "mem fit: nothing tried fits {:.2f} GiB per rank{} (offload of optimizer and params, activation "
        "checkpointing, smaller micro-batches, live and prefetch budgets{}); more ranks shrink the shards: zero3 "
        "mem plan --world-size N shows by how much",
        o.device_memory_gb,
        o.host_memory_gb > 0.0 ? fmt::format(" and {:.2f} GiB of host memory per node", o.host_memory_gb) : "",
        o.host_memory_gb > 0.0 ? ", the optimizer state on NVMe and in 16 bits" : ""));
  }
  fmt::print(
      "settings that fit, least estimated slowdown first (pcie {} GB/s, network {} GB/s, CPU optimizer {} "
      "Gparam/s per rank):\n",
      o.pcie_gbps, o.net_gbps, o.cpu_gparams);
  bool smaller_micro = false;
  for (const Candidate& c : fits) {
    const std::string host =
        o.host_memory_gb > 0.0
            ? fmt::format("  host {:.2f} GiB/node", static_cast<double>(c.host_bytes) * fitter.ranks_per_node() / kGiB)
            : "";
    fmt::print("  {:<77} {:>8.3f} GiB{}  +{:.1f} ms/step  ({})\n", c.change, static_cast<double>(c.device_bytes) / kGiB,
               host, c.extra_ms, c.why);
    smaller_micro |= c.config.batch.train_micro_batch_size_per_gpu < fitter.base().batch.train_micro_batch_size_per_gpu;
  }
  if (smaller_micro) {
    fmt::print(
        "or leave the micro-batch to the job: \"zero3\": {{\"accumulation\": {{\"policy\": \"memory\"}}}} starts at "
        "the "
        "largest one planned within {:.0f}% of the device and follows the measured use (docs/train.md)\n",
        100.0 * config::row_number(config::blocks::zero3_accumulation, "high"));
  }
}

}  // namespace

void add_mem_fit_command(CLI::App& group) {
  auto opt = std::make_shared<FitOptions>();
  CLI::App* cmd = group.add_subcommand(
      "fit", "Does the job fit a device of this size, and which settings make it fit with the least slowdown");
  add_train_config_options(*cmd, opt->train);
  cmd->add_option("--world-size", opt->world_size, "Ranks of the job")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--device-memory-gb", opt->device_memory_gb, "Device memory per rank, GiB")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pcie-gbps", opt->pcie_gbps, "Host<->device bandwidth per rank, GB/s (the cost model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--net-gbps", opt->net_gbps, "Collective bandwidth per rank, GB/s (the cost model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--cpu-gparams", opt->cpu_gparams, "CPU optimizer speed per rank, 1e9 params/s (the cost model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tflops", opt->tflops,
                  "Achieved matrix-product rate per rank, TFLOP/s (the cost model of full recomputation)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--host-memory-gb", opt->host_memory_gb,
                  "Host memory per node, GiB: offloaded state must fit it too (then the optimizer state on NVMe and "
                  "in 16 bits are tried)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--disk-gbps", opt->disk_gbps, "NVMe read + write bandwidth per node, GB/s (the cost model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--hbm-gbps", opt->hbm_gbps,
                  "Device memory bandwidth per rank, GB/s (the cost model of selective recomputation)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([opt] { run_fit(*opt); });
}

}  // namespace zero3::tools
