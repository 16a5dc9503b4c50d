// Engine::Impl's construction and finalize(): the config checks, the device, communicator, watchdog and
// streams (made here unless the caller brings them), the unit registry before finalize(), and finalize()
// itself (partitioning, the offload budget, the optimizer and the components it wires); with the checks
// every public call shares.
#include "engine_impl.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "init.hpp"
#include "nvme_optimizer.hpp"
#include "offload_optimizer.hpp"
#include "zero3/comm/communicator_factory.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/device/device_factory.hpp"
#include "zero3/offload/aio.hpp"
#include "zero3/offload/pinned_budget.hpp"

namespace zero3 {

namespace {

using config::OffloadDevice;

// What the engine cannot run, as ConfigErrors naming the key.
void check_config(const config::Config& config, const comm::World& world) {
  if (config.zero.stage != 3) {
    throw ConfigError(
        fmt::format("zero_optimization.stage: the zero3 engine runs ZeRO stage 3, but the config says stage {}",
                    config.zero.stage));
  }
  if (!config.optimizer) {
    throw ConfigError(
        "optimizer: the zero3 engine needs an optimizer block (type Adam, AdamW, Lion or Adagrad); ZeRO-3 inference "
        "without an optimizer is not implemented");
  }
  if (config.zero.offload_param.device == OffloadDevice::nvme &&
      (config.zero.offload_optimizer.device == OffloadDevice::none || config.zero.offload_optimizer.ratio < 1.0)) {
    throw ConfigError(
        "zero_optimization.offload_param.device: \"nvme\" needs the optimizer step on the CPU "
        "(offload_optimizer.device \"cpu\" or \"nvme\", ratio 1), which writes the new params from host memory; "
        "NVMe offload of params with the optimizer on the device is not implemented");
  }
  if (config.zero.offload_optimizer.device == OffloadDevice::nvme &&
      config.aio.block_size % static_cast<std::int64_t>(offload::kDirectAlign) != 0) {
    throw ConfigError(
        fmt::format("aio.block_size: {} bytes; NVMe offload reads and writes with O_DIRECT in requests "
                    "of whole {}-byte blocks: use a multiple of {}",
                    config.aio.block_size, offload::kDirectAlign, offload::kDirectAlign));
  }
  if (config.zero.offload_optimizer.device == OffloadDevice::nvme && config.zero.offload_optimizer.ratio < 1.0) {
    throw ConfigError(fmt::format(
        "zero_optimization.offload_optimizer.ratio: {} with device \"nvme\": partial offload is implemented for "
        "\"cpu\" only; remove it (1.0) or offload to the CPU",
        config.zero.offload_optimizer.ratio));
  }
  if (config.prescale_gradients) {
    throw ConfigError("prescale_gradients: ZeRO-3 reduce-scatters a mean; true is not supported (as in DeepSpeed)");
  }
  if (config.gradient_predivide_factor != 1.0) {
    throw ConfigError(
        fmt::format("gradient_predivide_factor: ZeRO-3 reduce-scatters a mean and needs 1.0, not {} (as in DeepSpeed)",
                    config.gradient_predivide_factor));
  }
  if (config.batch.world_size != world.size) {
    throw ConfigError(fmt::format(
        "train_batch_size: the config's batch sizes were resolved for a world size of {} ({}), but this job has {} "
        "ranks ({}); parse the config with the job's world size",
        config.batch.world_size,
        config.batch.world_size_source.empty() ? "the default" : config.batch.world_size_source, world.size,
        world.source));
  }
}

// The engine's config as the device and communicator factories' options.
DeviceOptions device_options(const config::Config& config, const comm::World& world) {
  using config::DeviceChoice;
  const DeviceChoice choice = config.zero3.device;
  std::optional<DeviceKind> kind;
  if (choice != DeviceChoice::automatic) kind = choice == DeviceChoice::cuda ? DeviceKind::cuda : DeviceKind::host;
  return {.kind = kind, .local_rank = world.local_rank};
}

comm::CommunicatorOptions communicator_options(const config::Config& config) {
  using config::CommBackend;
  const CommBackend choice = config.zero3.comm.backend;
  std::optional<comm::CommBackend> backend;
  if (choice != CommBackend::automatic) {
    backend = choice == CommBackend::nccl ? comm::CommBackend::nccl : comm::CommBackend::mpi;
  }
  return {.backend = backend, .desync_check = config.zero3.comm.desync_check};
}

}  // namespace

Engine::Impl::Impl(const config::Config& cfg, const comm::World& w, EngineResources resources)
    : config(cfg), world(w), dtype(cfg.model_dtype()), comm_dtype(cfg.communication_data_type) {
  check_config(config, world);
  // wall_clock_breakdown: where a step's time goes (EngineStats::last_step_times, last_step_offload).
  timeline = std::make_unique<engine::Timeline>(config.wall_clock_breakdown);
  if (config.data_types.grad_accum_dtype && *config.data_types.grad_accum_dtype != DType::f32 && world.rank == 0) {
    log::warn(
        "data_types.grad_accum_dtype: {} is accepted, but zero3 accumulates gradients in fp32 (its optimizer "
        "kernels read fp32 gradients)",
        dtype_name(*config.data_types.grad_accum_dtype));
  }
  if (resources.communicator && (!resources.device || !resources.bootstrap)) {
    throw UsageError("EngineResources: a communicator must come with its device and bootstrap");
  }
  device = resources.device ? std::move(resources.device) : make_device(device_options(config, world));
  bootstrap = resources.bootstrap ? std::move(resources.bootstrap) : comm::make_mpi_bootstrap(world);
  if (bootstrap->rank() != world.rank || bootstrap->size() != world.size) {
    throw UsageError(fmt::format("EngineResources: the bootstrap is rank {} of {}, but the world is rank {} of {} ({})",
                                 bootstrap->rank(), bootstrap->size(), world.rank, world.size, world.source));
  }
  communicator = resources.communicator ? std::move(resources.communicator)
                                        : comm::make_communicator(communicator_options(config), *device, bootstrap);
  if (communicator->rank() != world.rank || communicator->size() != world.size) {
    throw UsageError(fmt::format("EngineResources: the communicator is rank {} of {}, but the world is rank {} of {}",
                                 communicator->rank(), communicator->size(), world.rank, world.size));
  }
  comm::set_flight_capacity(static_cast<std::size_t>(config.zero3.comm.flight_records));
  watchdog = std::make_unique<comm::Watchdog>(
      comm::WatchdogOptions{
          .timeout = std::chrono::duration<double>(config.zero3.comm.timeout_s),
          .first_step_timeout = std::chrono::duration<double>(config.zero3.comm.first_step_timeout())},
      world.rank, world.size, comm::make_progress_channel(*bootstrap, world.local_size == world.size));
  watchdog->progress().set(0, 0);
  events = std::make_unique<engine::EventPool>(*device);
  compute = device->create_stream("compute");
  comm_stream = device->create_stream("comm");
  compute_done = device->create_event();
  step_done = device->create_event();
}

Engine::Impl::~Impl() {
  if (!scopes.empty()) {
    log::error("engine destroyed with {} scope(s) open, the innermost {}; scopes must not outlive their engine",
               scopes.size(), describe_scope(scopes.back()));
  }
  // Let queued work finish before the buffers it uses are freed.
  for (Stream* s : {compute.get(), comm_stream.get()}) {
    if (s == nullptr) continue;
    try {
      s->synchronize();
    } catch (const std::exception& e) {
      log::error("engine shutdown: stream '{}' failed: {}", s->name(), e.what());
    }
  }
}

void Engine::Impl::check_call(std::string_view call, bool needs_finalized) {
  if (kept_error) std::rethrow_exception(std::exchange(kept_error, nullptr));
  if (needs_finalized && !layout) throw UsageError(fmt::format("{}: call finalize() first", call));
  if (!needs_finalized && layout) throw UsageError(fmt::format("{}: finalize() has already run", call));
}

void Engine::Impl::keep_error(std::exception_ptr error) noexcept {
  if (!kept_error) kept_error = std::move(error);  // the first one explains the rest
}

std::size_t Engine::Impl::unit_or_throw(std::string_view call, std::string_view name) const {
  if (const auto u = layout->find_unit(name)) return *u;
  throw UsageError(fmt::format("{}: no unit named '{}'", call, name));
}

std::size_t Engine::Impl::param_of_unit(std::size_t unit, std::string_view name, std::string_view what) const {
  const std::string& unit_name = layout->units[unit].name;
  const auto p = layout->find_param(name);
  if (!p) throw UsageError(fmt::format("{}: unit '{}' has no param '{}'", what, unit_name, name));
  if (layout->params[*p].unit != unit) {
    throw UsageError(fmt::format("{}: unit '{}' has no param '{}' (it belongs to unit '{}')", what, unit_name, name,
                                 layout->units[layout->params[*p].unit].name));
  }
  return *p;
}

void Engine::Impl::add_unit(UnitSpec unit) {
  if (kept_error) std::rethrow_exception(std::exchange(kept_error, nullptr));
  if (layout) {
    throw UsageError(
        fmt::format("add_unit('{}') after finalize(): the model is partitioned once; declare every unit "
                    "before finalize()",
                    unit.name));
  }
  engine::validate_unit_spec(unit);
  if (unit_names.contains(unit.name)) {
    throw UsageError(fmt::format("add_unit: a unit named '{}' was already declared", unit.name));
  }
  std::unordered_set<std::string> mine;
  for (const ParamSpec& p : unit.params) {
    if (param_names.contains(p.name) || !mine.insert(p.name).second) {
      throw UsageError(fmt::format("add_unit('{}'): a param named '{}' was already declared", unit.name, p.name));
    }
  }
  std::unordered_set<std::string_view> borrowed;
  for (const std::string& b : unit.borrows) {
    if (b == unit.name || !unit_names.contains(b)) {
      throw UsageError(fmt::format(
          "add_unit('{}'): it borrows unit '{}', which is not declared before it (declare a unit whose params "
          "another also reads first)",
          unit.name, b));
    }
    if (!borrowed.insert(b).second) {
      throw UsageError(fmt::format("add_unit('{}'): unit '{}' is borrowed twice", unit.name, b));
    }
  }
  unit_names.insert(unit.name);
  param_names.insert(mine.begin(), mine.end());
  specs.push_back(std::move(unit));
}

void Engine::Impl::agree_or_throw(const std::function<void()>& fn, bool config_error) const {
  std::string failure;
  std::exception_ptr mine;
  try {
    fn();
  } catch (const std::exception& e) {
    failure = e.what();
    mine = std::current_exception();
  }
  const std::vector<std::string> all = comm::all_gather_strings(*bootstrap, failure);
  if (mine) std::rethrow_exception(mine);
  const auto failed = std::find_if(all.begin(), all.end(), [](const std::string& m) { return !m.empty(); });
  if (failed == all.end()) return;
  const std::string what = fmt::format("on rank {}: {}", failed - all.begin(), *failed);
  if (config_error) throw ConfigError(what);
  throw IoError(what);
}

void Engine::Impl::check_offload_budget(const engine::Layout& built) {
  const config::ZeroConfig& zero = config.zero;
  const bool offload_params = zero.offload_param.device != OffloadDevice::none;
  const bool offload_optimizer = zero.offload_optimizer.device != OffloadDevice::none;
  if (!offload_params && !offload_optimizer) return;
  // Everything offload will take from host memory (and from the disk) is checked against the budget before
  // any of it (or anything else) is allocated.
  const engine::OffloadOptions options{
      .compute_dtype = dtype, .comm_dtype = comm_dtype, .params_on_device = !offload_params};
  const engine::HostFootprint need = engine::offload_footprint(config, built, options, device->kind());
  check_nvme_paths(built, options);
  offload::PinnedRequest request;
  request.pinned_bytes = need.pinned_bytes;
  request.pageable_bytes = need.pageable_bytes;
  request.ranks_on_node = world.local_size;
  request.pinning_uses_mlock = device->caps().pins_by_mlock;
  request.budget_gb = config.zero3.pinned_memory_budget_gb;
  const offload::PinnedBudget budget = offload::check_pinned_budget(request, offload::read_host_memory_facts());
  offload_host = std::make_unique<engine::OffloadHost>(*device, world);
  if (world.local_rank == 0) {
    const bool nvme = zero.offload_optimizer.device == OffloadDevice::nvme;
    log::info(
        "{} offload: {} bytes pinned + {} bytes pageable host memory per rank (pinned budget {} bytes: {}){}; {}",
        nvme ? "NVMe" : "CPU", need.pinned_bytes, need.pageable_bytes, budget.budget_bytes, budget.source,
        nvme ? fmt::format(", {} bytes of files per rank under {}",
                           engine::nvme_optimizer_disk_bytes(config, built, options), *zero.offload_optimizer.nvme_path)
             : std::string(),
        offload_host->describe());
  }
}

void Engine::Impl::check_nvme_paths(const engine::Layout& built, const engine::OffloadOptions& options) {
  const config::ZeroConfig& zero = config.zero;
  const std::uint64_t optimizer_bytes = engine::nvme_optimizer_disk_bytes(config, built, options);
  const std::uint64_t param_bytes = engine::nvme_params_disk_bytes(config, built, dtype);
  const bool same_path =
      optimizer_bytes > 0 && param_bytes > 0 && *zero.offload_optimizer.nvme_path == *zero.offload_param.nvme_path;
  // The node's ranks share the disk: room for all of them, and the same verdict on every rank before any
  // file is made.
  const auto check = [&](const std::optional<std::string>& path, std::uint64_t per_rank, const char* key) {
    agree_or_throw(
        [&] { offload::check_nvme_path(*path, per_rank * static_cast<std::uint64_t>(world.local_size), key); },
        /*config_error=*/true);
  };
  if (optimizer_bytes > 0) {
    check(zero.offload_optimizer.nvme_path, optimizer_bytes + (same_path ? param_bytes : 0),
          "zero_optimization.offload_optimizer.nvme_path");
  }
  if (param_bytes > 0 && !same_path) {
    check(zero.offload_param.nvme_path, param_bytes, "zero_optimization.offload_param.nvme_path");
  }
}

std::unique_ptr<engine::ShardOptimizer> Engine::Impl::make_optimizer(const engine::Layout& built) {
  const config::ZeroConfig& zero = config.zero;
  const engine::OffloadOptions options{.compute_dtype = dtype,
                                       .comm_dtype = comm_dtype,
                                       .params_on_device = zero.offload_param.device == OffloadDevice::none,
                                       .nvme_params = nvme_params.get()};
  if (zero.offload_optimizer.device == OffloadDevice::cpu) {
    return engine::make_offload_optimizer(config, built, *device, *comm_stream, *offload_host, *timeline, options);
  }
  if (zero.offload_optimizer.device == OffloadDevice::nvme) {
    std::unique_ptr<engine::ShardOptimizer> made;
    agree_or_throw(
        [&] {
          made = engine::make_nvme_optimizer(config, built, *device, *comm_stream, *offload_host, *timeline, options,
                                             world);
        },
        /*config_error=*/false);
    return made;
  }
  return engine::make_device_optimizer(*config.optimizer, engine::StateStorage::of(config), *device, *comm_stream,
                                       built.state_count, built.sharded_state_count, engine::state_segments(built));
}

void Engine::Impl::finalize() {
  check_call("finalize", false);
  engine::Layout built = engine::build_layout(specs, world.size, world.rank, config.zero);
  check_offload_budget(built);
  const config::OffloadConfig& offload_param = config.zero.offload_param;
  Buffer shards;
  if (offload_param.device == OffloadDevice::cpu) {
    shards = offload_host->allocate(*device, built.param_shard_count, dtype, offload_param.pin_memory,
                                    MemCategory::param_shard);
  } else if (offload_param.device == OffloadDevice::none) {
    shards = device->allocate(built.param_shard_count, dtype, MemoryKind::device, MemCategory::param_shard);
  }
  std::unique_ptr<engine::ShardOptimizer> optimizer;
  std::vector<std::uint64_t> value_hashes;
  try {
    if (offload_param.device == OffloadDevice::nvme) {
      agree_or_throw(
          [&] {
            nvme_params =
                std::make_unique<engine::NvmeParams>(config, built, *device, *offload_host, dtype, world.rank);
          },
          /*config_error=*/false);
    }
    optimizer = make_optimizer(built);
    engine::ShardOptimizer& opt = *optimizer;
    engine::initialize_shards(
        built, static_cast<std::uint64_t>(config.zero3.seed), *device, *comm_stream,
        [&](std::size_t at, ConstBufferView values) {
          opt.copy_in(*device, TensorKind::master, at, values, *comm_stream);
        },
        dtype,
        [&](std::size_t at, ConstBufferView values) {
          if (nvme_params) {
            nvme_params->write(at, values.count, values.data);
          } else {
            device->copy_async(shards.view().slice(at, values.count), values, *comm_stream);
          }
        },
        value_hashes);
  } catch (...) {
    try {
      comm_stream->synchronize();  // nothing queued may outlive the buffers unwinding here
    } catch (...) {                // the first error is the one to report
    }
    throw;
  }
  engine::check_ranks_agree(built, value_hashes, config::to_json(config), *bootstrap);

  layout.emplace(std::move(built));
  param_shards = std::move(shards);
  optimizer->set_final_micro_step(config.batch.gradient_accumulation_steps == 1);
  const engine::Wiring wiring = make_wiring();
  optimizer_step =
      std::make_unique<engine::OptimizerStep>(wiring, std::move(optimizer), param_shards.view(), *bootstrap);
  coordinator = std::make_unique<engine::GatherCoordinator>(wiring, param_shards.view(), nvme_params.get());
  reducer = std::make_unique<engine::GradReducer>(wiring, optimizer_step->optimizer());
  // The first forward reads what finalize() left on the comm stream (offloaded params: the persistent
  // units' device copies).
  comm_stream->record(*step_done);
  compute->wait(*step_done);
  stats.total_elems = layout->total_elems;
  stats.persistent_elems = layout->persistent_elems;
  specs.clear();
  if (world.rank == 0) log_finalized();
}

engine::Wiring Engine::Impl::make_wiring() {
  return {
      .layout = *layout,
      .config = config,
      .device = *device,
      .communicator = *communicator,
      .compute_stream = *compute,
      .comm_stream = *comm_stream,
      .events = *events,
      .compute_dtype = dtype,
      .comm_dtype = comm_dtype,
      .stats = stats,
      .timeline = *timeline,
      .progress = watchdog->progress(),
      .single_rank_in_place = config.zero3.single_rank_in_place && world.size == 1 && !device->guards_scope_memory()};
}

void Engine::Impl::log_finalized() const {
  const bool offload_params = config.zero.offload_param.device == OffloadDevice::cpu;
  const bool nvme_params_on = config.zero.offload_param.device == OffloadDevice::nvme;
  const bool offload_optimizer = config.zero.offload_optimizer.device == OffloadDevice::cpu;
  const bool nvme_optimizer = config.zero.offload_optimizer.device == OffloadDevice::nvme;
  const auto persistent_units = std::count_if(layout->units.begin(), layout->units.end(),
                                              [](const engine::UnitLayout& u) { return u.persistent; });
  log::info(
      "zero3 engine: {} units ({} persistent), {} params, {} elements ({} persistent) on {} ranks; compute {}, "
      "reduce {}, master {}, moments {}, accumulators fp32 ({}); params {}; {} device, {} communicator",
      layout->units.size(), persistent_units, layout->params.size(), layout->total_elems, layout->persistent_elems,
      world.size, dtype_name(dtype), dtype_name(comm_dtype), dtype_name(config.master_dtype()),
      dtype_name(config.optimizer_state_dtype()),
      offload_optimizer
          ? fmt::format("CPU offload of {} of {} elements",
                        layout->state_count - engine::offload_cut(config, layout->state_count), layout->state_count)
      : nvme_optimizer ? fmt::format("NVMe offload under {}", *config.zero.offload_optimizer.nvme_path)
                       : std::string("on the device"),
      offload_params   ? std::string("offloaded to host memory")
      : nvme_params_on ? fmt::format("on NVMe in {} ({} of {} elements kept in host memory, {} read buffers)",
                                     nvme_params->path(), engine::nvme_params_kept_elems(config, *layout),
                                     layout->param_shard_count, nvme_params->buffer_count())
                       : std::string("on the device"),
      device_kind_name(device->kind()), communicator->backend_name());
}

void Engine::Impl::read_params(std::size_t flat, BufferView dst) {
  if (!nvme_params) {
    device->copy_async(dst, param_shards.cview().slice(flat, dst.count), *comm_stream);
    return;
  }
  if (dst.kind != MemoryKind::device) {
    nvme_params->read(flat, dst.count, dst.data);
    return;
  }
  Buffer host = device->allocate(dst.count, dst.dtype, device->caps().host_staging, MemCategory::staging);
  nvme_params->read(flat, dst.count, host.data());
  device->copy_async(dst, host.cview(), *comm_stream);
  comm_stream->synchronize();  // before `host` goes
}

void Engine::Impl::write_params(std::size_t flat, ConstBufferView src) {
  if (!nvme_params) {
    device->copy_async(param_shards.view().slice(flat, src.count), src, *comm_stream);
    return;
  }
  if (src.kind != MemoryKind::device) {
    nvme_params->write(flat, src.count, src.data);
    return;
  }
  Buffer host = device->allocate(src.count, src.dtype, device->caps().host_staging, MemCategory::staging);
  device->copy_async(host.view(), src, *comm_stream);
  comm_stream->synchronize();
  nvme_params->write(flat, src.count, host.data());
}

}  // namespace zero3
