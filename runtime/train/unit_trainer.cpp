#include "zero3/train/unit_trainer.hpp"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>
#include <vector>

#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/resident.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/train/accumulation.hpp"
#include "zero3/train/init_from.hpp"
#include "zero3/train/unit_walk.hpp"

namespace zero3::train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Host memory a unit's records take at least on every rank: its spec, its params' specs and names, its layout.
constexpr std::uint64_t kUnitRecordBytes = 1024;

std::uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

// Free bytes of the file system of an NVMe offload path; 0 without one.
std::uint64_t nvme_free_bytes(const config::OffloadConfig& o) {
  if (o.device != config::OffloadDevice::nvme || !o.nvme_path) return 0;
  struct statvfs fs {};
  if (statvfs(o.nvme_path->c_str(), &fs) != 0) return 0;
  return static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
}

}  // namespace

void check_model_size(const config::Config& config, int world_size, int ranks_per_node, std::uint64_t params,
                      std::uint64_t units, std::optional<std::uint64_t> device_free_bytes) {
  if (params == 0 && units == 0) return;
  const auto ranks = static_cast<std::uint64_t>(std::max(1, world_size));
  const auto local = static_cast<std::uint64_t>(std::max(1, ranks_per_node));
  const std::uint64_t shard = params == 0 ? 0 : params / ranks + 1;
  const std::uint64_t need = checked_add<ConfigError>(
      checked_mul<ConfigError>(shard, std::uint64_t{4}, "memory: the fp32 master weights of a rank's shard"),
      checked_mul<ConfigError>(units, kUnitRecordBytes, "memory: the records of the model's units"),
      "memory: the model's lower bound per rank");
  const std::uint64_t host = host_memory_bytes() / local;
  const std::uint64_t nvme =
      (nvme_free_bytes(config.zero.offload_param) + nvme_free_bytes(config.zero.offload_optimizer)) / local;
  const std::uint64_t device = device_free_bytes.value_or(0);
  // Saturating: the sum only has to exceed what is needed.
  const std::uint64_t have = std::min(host + nvme, ~std::uint64_t{0} - device) + device;
  if (need <= have) return;
  constexpr double kGiB = 1 << 30;
  const std::string master =
      params == 0
          ? std::string()
          : fmt::format("its {} params' fp32 master weights alone need {:.2f} GiB per rank (world size {}) and ",
                        params, static_cast<double>(shard * 4) / kGiB, world_size);
  throw ConfigError(fmt::format(
      "memory: the model does not fit: {}the records of its {} units {:.2f} GiB, past the {:.2f} GiB a rank has in "
      "all (host memory {:.2f} GiB, device {:.2f} GiB, NVMe offload paths {:.2f} GiB free); lower zero3.model.layers "
      "or the model's sizes",
      master, units, static_cast<double>(units * kUnitRecordBytes) / kGiB, static_cast<double>(have) / kGiB,
      static_cast<double>(host) / kGiB, static_cast<double>(device) / kGiB, static_cast<double>(nvme) / kGiB));
}

ActivationPlan plan_activations(const models::UnitModel& model, const config::Config& config, std::int64_t micro_batch,
                                int eval_batch, int len, MemoryKind kind) {
  const models::UnitModel::ActivationShape shape{
      .micro_batch = checked_narrow<int, ConfigError>(micro_batch, "train_micro_batch_size_per_gpu"),
      .eval_batch = eval_batch,
      .len = len,
      .params = config.model_dtype(),
      .recompute = config.zero3.model ? config.zero3.model->activation_checkpointing : Recompute::none,
      .offload_kept_inputs = config.activation_checkpointing.cpu_checkpointing};
  return {.bytes = model.planned_activation_bytes(shape),
          .kind = kind,
          .offloaded_bytes = model.planned_offloaded_bytes(shape)};
}

namespace {

// The disk figures of `to` beside the same ones of `from`.
std::array<std::pair<double*, const double*>, 9> disk_fields(StepSplit& to, const StepSplit& from) {
  return {{{&to.disk_step_ms, &from.disk_step_ms},
           {&to.disk_step_wait_ms, &from.disk_step_wait_ms},
           {&to.disk_grad_wait_ms, &from.disk_grad_wait_ms},
           {&to.disk_step_read_bytes, &from.disk_step_read_bytes},
           {&to.disk_step_write_bytes, &from.disk_step_write_bytes},
           {&to.disk_grad_read_bytes, &from.disk_grad_read_bytes},
           {&to.disk_grad_write_bytes, &from.disk_grad_write_bytes},
           {&to.disk_param_read_bytes, &from.disk_param_read_bytes},
           {&to.disk_param_wait_ms, &from.disk_param_wait_ms}}};
}

}  // namespace

StepSplit& StepSplit::operator+=(const StepSplit& o) {
  forward_ms += o.forward_ms;
  backward_ms += o.backward_ms;
  step_ms += o.step_ms;
  gather_wait_ms += o.gather_wait_ms;
  reduce_wait_ms += o.reduce_wait_ms;
  optimizer_ms += o.optimizer_ms;
  copies_exposed_ms += o.copies_exposed_ms;
  kept_copies_ms += o.kept_copies_ms;
  for (auto [a, b] : disk_fields(*this, o)) *a += *b;
  return *this;
}

StepSplit StepSplit::scaled(double f) const {
  StepSplit s = *this;
  for (double* v : {&s.forward_ms, &s.backward_ms, &s.step_ms, &s.gather_wait_ms, &s.reduce_wait_ms, &s.optimizer_ms,
                    &s.copies_exposed_ms, &s.kept_copies_ms}) {
    *v *= f;
  }
  for (auto [a, b] : disk_fields(s, *this)) *a = *b * f;
  return s;
}

UnitTrainer::UnitTrainer(const config::Config& config, const comm::World& world,
                         std::shared_ptr<comm::Bootstrap> bootstrap, const ModelFactory& make_model,
                         const MemoryCheck& check)
    : timed_(config.wall_clock_breakdown),
      sync_unit_boundaries_(config.activation_checkpointing.synchronize_checkpoint_boundary),
      configured_batch_(config.batch),
      bootstrap_(bootstrap ? std::move(bootstrap) : comm::make_mpi_bootstrap(world)) {
  resident_base_bytes_ = resident_bytes().value_or(0);  // MPI is up, nothing of the job allocated yet
  EngineResources resources;
  resources.bootstrap = bootstrap_;
  const bool host = config.zero3.device == config::DeviceChoice::host ||
                    (config.zero3.device == config::DeviceChoice::automatic && cuda_device_count() == 0);
  if (check.device_memory_bytes && host) {
    resources.device = make_host_device({.capacity_bytes = static_cast<std::size_t>(*check.device_memory_bytes)});
  }
  engine_ = std::make_unique<Engine>(config, world, std::move(resources));
  // The CUDA device's memory is its own; the host backend's is the host's, counted once.
  const std::optional<std::uint64_t> device_free =
      engine_->device().kind() == DeviceKind::host ? std::nullopt : engine_->device().free_device_bytes();
  check_model_size(config, world.size, world.local_size, check.model_params, check.model_units, device_free);
  model_ = make_model(engine_->device());
  offload_kept_inputs(config);
  check_memory(config, world, check);
  std::vector<UnitSpec> units = model_->units();
  if (config.zero3.model && !config.zero3.model->init_from.empty()) {
    const std::string read = init_from_checkpoint(units, config.zero3.model->init_from);
    if (world.rank == 0) log::info("{}", read);
  }
  for (const UnitSpec& u : units) engine_->add_unit(u);
  engine_->finalize();
}

MemoryPlan UnitTrainer::plan_for(const config::Config& config, const comm::World& world, const MemoryCheck& check,
                                 std::int64_t micro_batch) {
  config::Config c = config;
  c.batch.train_micro_batch_size_per_gpu = micro_batch;
  c.batch.gradient_accumulation_steps = c.batch.train_batch_size / (c.batch.world_size * micro_batch);
  return plan_memory(model_->units(), c,
                     {.ranks_per_node = world.local_size,
                      .device = engine_->device().kind(),
                      .activations = plan_activations(*model_, config, micro_batch, check.eval_batch, check.len,
                                                      model_->activation_memory()),
                      .checkpoint_staging_bytes = check.checkpoint_staging_bytes,
                      .resident_base_bytes = resident_base_bytes_});
}

void UnitTrainer::start_at(const config::Config& config, std::int64_t micro, int rank) {
  const config::BatchConfig& b = config.batch;
  const std::int64_t accumulation = b.train_batch_size / b.world_size / micro;
  engine_->set_accumulation(micro, accumulation);
  if (rank != 0) return;  // every rank starts alike; one reports
  events::emit({.level = log::Level::info,
                .kind = "accumulation_changed",
                .step = 0,
                .message = fmt::format(
                    "zero3.accumulation: micro-batch {} is planned past {:.0f}% of the device's {:.2f} MiB: "
                    "micro-batch {} -> {}, gradient accumulation {} -> {} (global batch {} kept)",
                    b.train_micro_batch_size_per_gpu, 100.0 * config.zero3.accumulation.high,
                    static_cast<double>(device_budget_bytes_.value_or(0)) / (1 << 20), b.train_micro_batch_size_per_gpu,
                    micro, b.gradient_accumulation_steps, accumulation, b.train_batch_size),
                .figures = {{"micro_batch_from", static_cast<double>(b.train_micro_batch_size_per_gpu)},
                            {"micro_batch_to", static_cast<double>(micro)},
                            {"accumulation_from", static_cast<double>(b.gradient_accumulation_steps)},
                            {"accumulation_to", static_cast<double>(accumulation)}},
                .fields = {{"reason", "plan"}}});
}

// DeepSpeed's activation_checkpointing block, as far as it applies to data parallelism.
void UnitTrainer::offload_kept_inputs(const config::Config& config) {
  if (!config.activation_checkpointing.cpu_checkpointing) return;
  if (!model_->can_offload_kept_inputs()) {
    throw ConfigError(
        fmt::format("activation_checkpointing.cpu_checkpointing: {} cannot keep its checkpointed inputs "
                    "in host memory",
                    model_->describe()));
  }
  try {
    model_->set_offload_kept_inputs(true);
  } catch (const UsageError& e) {
    throw ConfigError(fmt::format("activation_checkpointing.cpu_checkpointing: {}", e.what()));
  }
}

void UnitTrainer::check_memory(const config::Config& config, const comm::World& world, const MemoryCheck& check) {
  Device& device = engine_->device();
  std::optional<std::uint64_t> free = device.free_device_bytes();
  if (check.device_memory_bytes) free = std::min(free.value_or(*check.device_memory_bytes), *check.device_memory_bytes);
  std::int64_t micro = config.batch.train_micro_batch_size_per_gpu;
  if (config.zero3.accumulation.policy == config::AccumulationPolicy::memory) {
    if (!free) {
      throw ConfigError(
          "zero3.accumulation.policy: \"memory\" sizes the micro-batch by the device's memory, and this device has "
          "no limit (the host backend simulates one with `zero3 train --device-memory-gb`)");
    }
    device_budget_bytes_ = *free + engine_->memory().total(MemoryKind::device).current_bytes;
    const config::BatchConfig& b = config.batch;
    const std::vector<std::int64_t> choices = micro_batch_choices(b.train_batch_size / b.world_size, micro);
    micro = starting_micro_batch(config.zero3.accumulation, choices, *device_budget_bytes_, [&](std::int64_t m) {
      return plan_for(config, world, check, m).peak_total(MemoryKind::device);
    });
  }
  plan_ = plan_for(config, world, check, micro);
  const std::uint64_t need = plan_.peak_total(MemoryKind::device);
  if (!free || need <= *free) {
    if (micro != config.batch.train_micro_batch_size_per_gpu) start_at(config, micro, world.rank);
    return;
  }
  constexpr double kMiB = 1 << 20;
  const std::string at = micro == config.batch.train_micro_batch_size_per_gpu
                             ? ""
                             : fmt::format(" (at micro-batch {}, the smallest zero3.accumulation can take)", micro);
  throw ConfigError(fmt::format(
      "memory: the job's plan needs {:.2f} MiB of device memory per rank{} and the device has {:.2f} MiB free; by "
      "category:\n{}(`zero3 mem plan --config ... --world-size {}` shows the whole plan; offload_optimizer, "
      "offload_param, stage3_max_live_parameters, stage3_prefetch_bucket_size, a smaller micro-batch and "
      "zero3.model.activation_checkpointing lower it)",
      static_cast<double>(need) / kMiB, at, static_cast<double>(*free) / kMiB, plan_.describe_kind(MemoryKind::device),
      world.size));
}

UnitTrainer::~UnitTrainer() {
  engine_.reset();  // drains the streams first
}

double UnitTrainer::micro_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                                int len) {
  Stream& stream = engine_->compute_stream();
  EngineUnits units(*engine_, model_->units());
  model_->set_batch(tokens, targets, batch, len, models::Pass::train);
  const Clock::time_point t0 = Clock::now();
  const std::vector<UnitSpec>& specs = model_->units();
  walk_forward(units, [&](const UnitViews& u) {
    const trace::Scope span("model", fmt::format("forward {}", specs[u.unit].name));
    model_->forward_unit(u.unit, u.params, stream);
    if (sync_unit_boundaries_) stream.synchronize();
  });
  if (timed_) stream.synchronize();
  const Clock::time_point t1 = Clock::now();
  const auto seed = static_cast<float>(engine_->loss_multiplier());
  walk_backward(units, [&](const UnitViews& u) {
    const trace::Scope span("model", fmt::format("backward {}", specs[u.unit].name));
    model_->backward_unit(u.unit, u.params, u.grads, seed, stream);
    if (sync_unit_boundaries_) stream.synchronize();
  });
  if (timed_) stream.synchronize();
  window_.forward_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
  window_.backward_ms += ms_since(t1);
  const models::UnitModel::KeptInputsOffload kept = model_->take_kept_inputs_offload();
  window_.kept_copies_ms += kept.exposed_copy_ms;
  report_activations(kept.host_bytes);
  return model_->loss(stream);  // the forward's loss, kept through backward
}

StepResult UnitTrainer::step() {
  const Clock::time_point t0 = Clock::now();
  StepResult r = engine_->step();
  window_.step_ms += ms_since(t0);
  if (r.boundary) {
    const EngineStats& s = engine_->stats();
    window_.gather_wait_ms = s.last_step_times.gather_wait_ms;
    window_.reduce_wait_ms = s.last_step_times.reduce_wait_ms;
    window_.optimizer_ms = s.last_step_times.optimizer_ms;
    const OffloadTimes& o = s.last_step_offload;
    window_.copies_exposed_ms = std::max(0.0, o.d2h_ms + o.h2d_ms - o.copies_hidden_ms);
    const DiskTimes& d = s.last_step_disk;
    window_.disk_step_ms = d.step_ms;
    window_.disk_step_wait_ms = d.step_wait_ms;
    window_.disk_grad_wait_ms = d.grad_wait_ms;
    window_.disk_step_read_bytes = static_cast<double>(d.step_read_bytes);
    window_.disk_step_write_bytes = static_cast<double>(d.step_write_bytes);
    window_.disk_grad_read_bytes = static_cast<double>(d.grad_read_bytes);
    window_.disk_grad_write_bytes = static_cast<double>(d.grad_write_bytes);
    window_.disk_param_read_bytes = static_cast<double>(d.param_read_bytes);
    window_.disk_param_wait_ms = d.param_wait_ms;
    last_split_ = timed_ ? window_ : StepSplit{};
    window_ = {};
  }
  return r;
}

double UnitTrainer::eval(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                         int len) {
  Stream& stream = engine_->compute_stream();
  EngineUnits units(*engine_, model_->units(), "held-out");
  model_->set_batch(tokens, targets, batch, len, models::Pass::eval);
  const Engine::UntracedScope untraced = engine_->untraced();  // keeps the training's prefetch schedule
  walk_forward(units, [&](const UnitViews& u) { model_->forward_unit(u.unit, u.params, stream); });
  report_activations(reported_kept_bytes_);
  return model_->loss(stream);
}

void UnitTrainer::report_activations(std::size_t kept_host_bytes) {
  MemoryTracker& tracker = engine_->memory();
  if (kept_host_bytes != reported_kept_bytes_) {
    const MemoryKind host = engine_->device().caps().host_staging;
    tracker.on_free(host, MemCategory::activations, reported_kept_bytes_);
    tracker.on_alloc(host, MemCategory::activations, kept_host_bytes);
    reported_kept_bytes_ = kept_host_bytes;
  }
  const std::size_t now = model_->activation_bytes();
  const MemoryKind kind = model_->activation_memory();
  if (now == reported_activations_ && kind == reported_kind_) return;
  tracker.on_free(reported_kind_, MemCategory::activations, reported_activations_);
  tracker.on_alloc(kind, MemCategory::activations, now);
  reported_activations_ = now;
  reported_kind_ = kind;
}

}  // namespace zero3::train
