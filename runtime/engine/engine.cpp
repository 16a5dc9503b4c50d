// The public Engine: config checks, construction of the device, communicator and streams, the unit registry
// before finalize(), scopes and their nesting rules, the step's window bookkeeping, and gather_tensor.
// The mechanics live in layout/init (partitioning), gather_coordinator, grad_reducer and optimizer_step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "engine_impl.hpp"
#include "init.hpp"
#include "offload_optimizer.hpp"
#include "zero3/comm/communicator_factory.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/device/device_factory.hpp"
#include "zero3/kernels/kernels.hpp"
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
  const auto offload = [](std::string_view key, OffloadDevice d) {
    if (d != OffloadDevice::nvme) return;
    throw ConfigError(fmt::format(
        "zero_optimization.{}.device: \"nvme\" is not implemented (NVMe offload); use \"cpu\" or \"none\"", key));
  };
  offload("offload_optimizer", config.zero.offload_optimizer.device);
  offload("offload_param", config.zero.offload_param.device);
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

// ---------------------------------------------------------------- Impl

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

std::string Engine::Impl::describe_scope(const OpenScope& s) const {
  return fmt::format("the {} of unit '{}'", s.grad ? "GradScope" : "GatherScope", layout->units[s.unit].name);
}

Engine::Impl::OpenScope* Engine::Impl::find_scope(std::uint64_t token) {
  const auto it = std::find_if(scopes.begin(), scopes.end(), [&](const OpenScope& s) { return s.token == token; });
  return it == scopes.end() ? nullptr : &*it;
}

void Engine::Impl::close_scope(std::uint64_t token) {
  const auto it = std::find_if(scopes.begin(), scopes.end(), [&](const OpenScope& s) { return s.token == token; });
  if (it == scopes.end()) return;
  std::string order_error;
  if (std::next(it) != scopes.end()) {
    order_error = fmt::format(
        "{} was closed while {}, opened after it, is still open; close scopes in the reverse "
        "order of opening",
        describe_scope(*it), describe_scope(*std::next(it)));
  }
  OpenScope s = std::move(*it);
  scopes.erase(it);
  timeline->end(*compute, s.compute_interval);
  if (s.grad) {
    backward_since_step = true;
    reducer->reduce(s.unit, std::move(s.grads));
  } else {
    coordinator->release(s.unit);
  }
  if (!order_error.empty()) throw UsageError(order_error);
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

void Engine::Impl::check_offload_budget(const engine::Layout& built) {
  const config::ZeroConfig& zero = config.zero;
  const bool offload_params = zero.offload_param.device == OffloadDevice::cpu;
  const bool offload_optimizer = zero.offload_optimizer.device == OffloadDevice::cpu;
  if (!offload_params && !offload_optimizer) return;
  // Everything offload will take from host memory is checked against the budget before any of it (or
  // anything else) is allocated.
  const engine::HostFootprint need = engine::offload_footprint(
      config, built, {.compute_dtype = dtype, .comm_dtype = comm_dtype, .params_on_device = !offload_params},
      device->kind());
  offload::PinnedRequest request;
  request.pinned_bytes = need.pinned_bytes;
  request.pageable_bytes = need.pageable_bytes;
  request.ranks_on_node = world.local_size;
  request.pinning_uses_mlock = device->caps().pins_by_mlock;
  request.budget_gb = config.zero3.pinned_memory_budget_gb;
  const offload::PinnedBudget budget = offload::check_pinned_budget(request, offload::read_host_memory_facts());
  offload_host = std::make_unique<engine::OffloadHost>(*device, world);
  if (world.local_rank == 0) {
    log::info("CPU offload: {} bytes pinned + {} bytes pageable host memory per rank (pinned budget {} bytes: {}); {}",
              need.pinned_bytes, need.pageable_bytes, budget.budget_bytes, budget.source, offload_host->describe());
  }
}

std::unique_ptr<engine::ShardOptimizer> Engine::Impl::make_optimizer(const engine::Layout& built) {
  const config::ZeroConfig& zero = config.zero;
  if (zero.offload_optimizer.device == OffloadDevice::cpu) {
    const bool offload_params = zero.offload_param.device == OffloadDevice::cpu;
    return engine::make_offload_optimizer(
        config, built, *device, *comm_stream, *offload_host, *timeline,
        {.compute_dtype = dtype, .comm_dtype = comm_dtype, .params_on_device = !offload_params});
  }
  return engine::make_device_optimizer(*config.optimizer, *device, *comm_stream, built.state_count,
                                       built.sharded_state_count, engine::state_segments(built));
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
  } else {
    shards = device->allocate(built.param_shard_count, dtype, MemoryKind::device, MemCategory::param_shard);
  }
  std::unique_ptr<engine::ShardOptimizer> optimizer;
  std::vector<std::uint64_t> value_hashes;
  try {
    optimizer = make_optimizer(built);
    engine::initialize_shards(built, static_cast<std::uint64_t>(config.zero3.seed), *device, *comm_stream,
                              optimizer->pieces(TensorKind::master), shards.view(), value_hashes);
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
  coordinator = std::make_unique<engine::GatherCoordinator>(wiring, param_shards.view());
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
  const bool offload_optimizer = config.zero.offload_optimizer.device == OffloadDevice::cpu;
  const auto persistent_units = std::count_if(layout->units.begin(), layout->units.end(),
                                              [](const engine::UnitLayout& u) { return u.persistent; });
  log::info(
      "zero3 engine: {} units ({} persistent), {} params, {} elements ({} persistent) on {} ranks; compute {}, "
      "reduce {}, master and accumulators fp32 ({}); params {}; {} device, {} communicator",
      layout->units.size(), persistent_units, layout->params.size(), layout->total_elems, layout->persistent_elems,
      world.size, dtype_name(dtype), dtype_name(comm_dtype),
      offload_optimizer
          ? fmt::format("CPU offload of {} of {} elements",
                        layout->state_count - engine::offload_cut(config, layout->state_count), layout->state_count)
          : std::string("on the device"),
      offload_params ? "offloaded to host memory" : "on the device", device_kind_name(device->kind()),
      communicator->backend_name());
}

StepResult Engine::Impl::step() {
  check_call("step", true);
  if (!scopes.empty()) {
    std::string open;
    for (const OpenScope& s : scopes) open += (open.empty() ? "" : ", ") + describe_scope(s);
    throw UsageError(fmt::format("step() with scopes still open ({}); close them first", open));
  }
  if (!backward_since_step) {
    throw UsageError(fmt::format(
        "step() with no gradient scope closed since the last step() (or finalize()): call step() once per "
        "micro-batch, after its backward (engine.grads(unit) for the units it trains, closed); this step() would {}",
        config.batch.gradient_accumulation_steps == 1
            ? "move the weights on zero gradients"
            : fmt::format("shift the accumulation window (gradient_accumulation_steps {}, micro-step {} of it)",
                          config.batch.gradient_accumulation_steps, micro_steps + 1)));
  }
  backward_since_step = false;
  StepResult r;
  r.loss_scale = optimizer_step->loss_scale();
  r.next_loss_scale = r.loss_scale;
  const std::int64_t gas = config.batch.gradient_accumulation_steps;
  if (++micro_steps < gas) {
    optimizer_step->optimizer().set_final_micro_step(micro_steps + 1 == gas);
  } else {
    micro_steps = 0;
    step_boundary(r);
    watchdog->progress().mark_first_step_done();
  }
  watchdog->progress().set(global_step, micro_steps);
  r.global_step = global_step;
  r.skipped_steps = skipped_steps;
  coordinator->reclaim();
  reducer->reclaim();
  return r;
}

void Engine::Impl::step_boundary(StepResult& r) {
  r.boundary = true;
  if (config.memory_breakdown || trace::enabled()) device->memory().enter_phase("reductions");
  // The step may update persistent params that compute work enqueued so far still reads.
  const auto started = std::chrono::steady_clock::now();
  compute->record(*compute_done);
  comm_stream->wait(*compute_done);
  coordinator->end_window();
  const bool timed = timeline->enabled();
  if (timed) comm_stream->synchronize();  // the reductions (wall_clock_breakdown only)
  const auto reduced = std::chrono::steady_clock::now();
  engine::WindowMarks marks = std::exchange(this->marks, {});
  marks.step = global_step + 1;
  if (config.memory_breakdown || trace::enabled()) device->memory().enter_phase("optimizer step");
  engine::StepOutcome out;
  try {
    out = optimizer_step->run(marks);
  } catch (const NonFiniteError&) {
    // The run ends, but the engine stays usable (state reads, a checkpoint): the step counts as skipped.
    reducer->accumulators_cleared();
    ++global_step;
    ++skipped_steps;
    comm_stream->record(*step_done);
    compute->wait(*step_done);
    throw;
  }
  reducer->accumulators_cleared();  // every outcome of run() zeroed them
  if (timed) comm_stream->synchronize();
  const engine::Timeline::Summary times = timeline->summarize();
  stats.last_step_offload = times.offload;
  if (timed) {
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    stats.last_step_times.gather_wait_ms = times.gather_wait_ms;
    stats.last_step_times.reduce_wait_ms = ms(reduced - started);
    stats.last_step_times.optimizer_ms = ms(std::chrono::steady_clock::now() - reduced);
  }
  optimizer_step->optimizer().set_final_micro_step(config.batch.gradient_accumulation_steps == 1);
  if (out.applied) coordinator->refresh_persistent();
  ++global_step;
  if (!out.applied) ++skipped_steps;
  r.applied = out.applied;
  r.nonfinite = out.nonfinite;
  r.discarded = out.discarded;
  r.stop_requests = out.stop_requests;
  r.grad_norm = out.grad_norm;
  r.lr = out.lr;
  r.loss_scale = out.loss_scale;
  r.next_loss_scale = out.next_loss_scale;

  stats.last_step_all_gather_elems = std::exchange(stats.all_gather_elems, 0);
  stats.last_step_reduce_scatter_elems = std::exchange(stats.reduce_scatter_elems, 0);
  stats.last_step_all_reduce_elems = std::exchange(stats.all_reduce_elems, 0);
  // Compute work after this (the next forward) reads the persistent params the step wrote.
  comm_stream->record(*step_done);
  compute->wait(*step_done);
}

std::vector<float> Engine::Impl::gather_tensor(std::string_view name, TensorKind kind) {
  const comm::ScopedOpAnnotation note("gather_tensor", name);
  check_call(fmt::format("gather_tensor('{}')", name), true);
  const auto pi = layout->find_param(name);
  if (!pi) throw UsageError(fmt::format("gather_tensor: no param named '{}'", name));
  const engine::ParamLayout& p = layout->params[*pi];
  const engine::UnitLayout& unit = layout->units[p.unit];
  const engine::GroupLayout& g = unit.group(p.group);
  const bool frozen = p.group == engine::Group::frozen;
  if (frozen && kind != TensorKind::param && kind != TensorKind::master) {
    throw UsageError(
        fmt::format("gather_tensor('{}', {}): param '{}' of unit '{}' is frozen (trainable = false): it "
                    "has no gradient and no optimizer state",
                    name, tensor_kind_name(kind), name, unit.name));
  }
  // The rank's slice of this kind, copied into device memory (wherever it lives: device, host chunks)
  // so the all-gather reads it from where every backend can.
  engine::StatePieces shard_pieces{{0, param_shards.view()}};
  const engine::StatePieces* source = &shard_pieces;
  DType source_dtype = param_shards.dtype();
  engine::ShardOptimizer& opt = optimizer_step->optimizer();
  if (!(kind == TensorKind::param || (kind == TensorKind::master && frozen))) {
    source = &opt.pieces(kind);
    source_dtype = DType::f32;
    if (source->empty()) {
      throw UsageError(fmt::format("gather_tensor('{}', {}): the {} optimizer keeps no {}", name,
                                   tensor_kind_name(kind), config::to_string(config.optimizer->type),
                                   tensor_kind_name(kind)));
    }
  }
  comm_stream->synchronize();
  opt.prepare_read();
  Buffer mine = device->allocate(g.shard, source_dtype, MemoryKind::device, MemCategory::workspace);
  if (g.shard > 0) engine::copy_from_pieces(*device, *source, g.flat_offset, mine.view(), *comm_stream);
  Buffer full;
  ConstBufferView piece;
  if (unit.persistent) {
    piece = mine.cview().slice(p.offset, p.numel);
  } else {  // collective: every rank takes this path for the same param
    full = device->allocate(g.padded, source_dtype, MemoryKind::device, MemCategory::workspace);
    if (g.padded > 0) communicator->all_gather(mine.cview(), full.view(), *comm_stream);
    piece = full.cview().slice(p.offset, p.numel);
  }
  Buffer host = device->allocate(p.numel, source_dtype, device->caps().host_staging, MemCategory::staging);
  if (p.numel > 0) device->copy_async(host.view(), piece, *comm_stream);
  comm_stream->synchronize();  // also orders after every reduction and step enqueued so far
  std::vector<float> out(p.numel);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(host.data(), host.dtype(), i);
  return out;
}

// ---------------------------------------------------------------- Engine

Engine::Engine(const config::Config& config, const comm::World& world, EngineResources resources)
    : impl_(std::make_unique<Impl>(config, world, std::move(resources))) {}

Engine::~Engine() = default;

void Engine::add_unit(UnitSpec unit) {
  impl_->add_unit(std::move(unit));
}

void Engine::finalize() {
  impl_->finalize();
}

Engine::GatherScope Engine::gather(std::string_view unit) {
  Impl& impl = *impl_;
  impl.check_call(fmt::format("gather('{}')", unit), true);
  const std::size_t u = impl.unit_or_throw("gather", unit);
  impl.coordinator->acquire(u);
  const std::uint64_t token = impl.next_token++;
  impl.scopes.push_back({false, u, token, {}, impl.timeline->begin(*impl.compute, engine::Timeline::Lane::compute)});
  return GatherScope(this, u, token);
}

Engine::GradScope Engine::grads(std::string_view unit) {
  Impl& impl = *impl_;
  impl.check_call(fmt::format("grads('{}')", unit), true);
  const std::size_t u = impl.unit_or_throw("grads", unit);
  const auto open = [&](bool grad) {
    return std::any_of(impl.scopes.begin(), impl.scopes.end(),
                       [&](const Impl::OpenScope& s) { return s.grad == grad && s.unit == u; });
  };
  if (!open(false)) {
    throw UsageError(
        fmt::format("grads('{}'): the unit's GatherScope is not open; open engine.gather(\"{}\") first "
                    "and keep it open while writing the gradients",
                    unit, unit));
  }
  if (open(true)) throw UsageError(fmt::format("grads('{}'): a GradScope of this unit is already open", unit));
  if (impl.untraced) {
    throw UsageError(fmt::format("grads('{}'): an UntracedScope is open (forward-only gathers); close it first", unit));
  }
  engine::GradBuffer buffer = impl.reducer->open(u);
  const std::uint64_t token = impl.next_token++;
  impl.scopes.push_back(
      {true, u, token, std::move(buffer), impl.timeline->begin(*impl.compute, engine::Timeline::Lane::compute)});
  return GradScope(this, u, token);
}

double Engine::loss_scale() const {
  if (impl_->optimizer_step) return impl_->optimizer_step->loss_scale();
  return optim::LossScaler::from_config(impl_->config).scale();
}

double Engine::loss_multiplier() const {
  return loss_scale() / static_cast<double>(impl_->config.batch.gradient_accumulation_steps);
}

StepResult Engine::step() {
  return impl_->step();
}

std::vector<float> Engine::gather_tensor(std::string_view param, TensorKind kind) {
  return impl_->gather_tensor(param, kind);
}

void Engine::discard_window(DiscardReason reason) {
  Impl& impl = *impl_;
  impl.check_call("discard_window", true);
  (reason == DiscardReason::nonfinite_loss ? impl.marks.nonfinite_loss : impl.marks.discard) = true;
}

void Engine::mark_stop_request() {
  Impl& impl = *impl_;
  impl.check_call("mark_stop_request", true);
  impl.marks.stop = true;
}

void Engine::reset_moments() {
  Impl& impl = *impl_;
  impl.check_call("reset_moments", true);
  impl.check_boundary("reset_moments");
  impl.optimizer_step->reset_moments();
}

void Engine::set_lr_factor(double factor) {
  Impl& impl = *impl_;
  impl.check_call("set_lr_factor", true);
  if (!std::isfinite(factor) || factor < 0.0) {
    throw UsageError(fmt::format("set_lr_factor({}): the lr factor must be finite and >= 0", factor));
  }
  impl.optimizer_step->set_lr_factor(factor);
}

double Engine::lr_factor() const {
  return impl_->optimizer_step ? impl_->optimizer_step->lr_factor() : 1.0;
}

Stream& Engine::compute_stream() {
  return *impl_->compute;
}
Device& Engine::device() {
  return *impl_->device;
}
comm::Communicator& Engine::communicator() {
  return *impl_->communicator;
}
std::shared_ptr<comm::Bootstrap> Engine::bootstrap() const {
  return impl_->bootstrap;
}
comm::Watchdog& Engine::watchdog() {
  return *impl_->watchdog;
}
EngineState Engine::state() {
  return EngineState(this);
}
const config::Config& Engine::config() const {
  return impl_->config;
}
EngineStats Engine::stats() const {
  return impl_->stats;
}
void Engine::reset_peaks() {
  impl_->stats.gathered_peak_elems = impl_->stats.gathered_elems;
  impl_->device->memory().reset_peaks();
}
MemoryTracker& Engine::memory() {
  return impl_->device->memory();
}
std::int64_t Engine::global_step() const {
  return impl_->global_step;
}
std::int64_t Engine::skipped_steps() const {
  return impl_->skipped_steps;
}

std::vector<std::string> Engine::unit_names() const {
  std::vector<std::string> names;
  if (impl_->layout) {
    for (const engine::UnitLayout& u : impl_->layout->units) names.push_back(u.name);
  } else {
    for (const UnitSpec& u : impl_->specs) names.push_back(u.name);
  }
  return names;
}

std::vector<ParamSpec> Engine::unit_params(std::string_view unit) const {
  if (impl_->layout) {
    const std::size_t u = impl_->unit_or_throw("unit_params", unit);
    std::vector<ParamSpec> params;
    for (const std::size_t p : impl_->layout->units[u].params) params.push_back(impl_->layout->params[p].spec);
    return params;
  }
  for (const UnitSpec& u : impl_->specs) {
    if (u.name == unit) return u.params;
  }
  throw UsageError(fmt::format("unit_params: no unit named '{}'", unit));
}

Engine::UntracedScope Engine::untraced() {
  Impl& impl = *impl_;
  impl.check_call("untraced()", true);
  if (impl.untraced) throw UsageError("untraced(): an UntracedScope is already open");
  impl.untraced = true;
  impl.coordinator->set_traced(false);
  return UntracedScope(this);
}

// ---------------------------------------------------------------- scopes

Engine::UntracedScope::UntracedScope(UntracedScope&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}

Engine::UntracedScope::~UntracedScope() {
  close();
}

void Engine::UntracedScope::close() {
  if (engine_ == nullptr) return;
  Impl& impl = *std::exchange(engine_, nullptr)->impl_;
  impl.untraced = false;
  impl.coordinator->set_traced(true);
}

Engine::GatherScope::GatherScope(Engine* engine, std::size_t unit_index, std::uint64_t token)
    : engine_(engine), unit_index_(unit_index), token_(token) {}

Engine::GatherScope::GatherScope(GatherScope&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      unit_index_(other.unit_index_),
      token_(std::exchange(other.token_, 0)) {}

Engine::GatherScope::~GatherScope() {
  try {
    close();
  } catch (...) {  // a destructor never throws: the engine's next call does
    if (engine_ != nullptr) engine_->impl_->keep_error(std::current_exception());
  }
}

const std::string& Engine::GatherScope::unit() const {
  if (engine_ == nullptr) throw UsageError("GatherScope::unit() of a moved-from scope");
  return engine_->impl_->layout->units[unit_index_].name;
}

BufferView Engine::GatherScope::param(std::string_view name) const {
  if (engine_ == nullptr) throw UsageError(fmt::format("GatherScope::param('{}') of a moved-from scope", name));
  Impl& impl = *engine_->impl_;
  if (token_ == 0 || impl.find_scope(token_) == nullptr) {
    throw UsageError(fmt::format("GatherScope::param('{}'): the GatherScope of unit '{}' is closed", name,
                                 impl.layout->units[unit_index_].name));
  }
  return impl.coordinator->param(impl.param_of_unit(unit_index_, name, "GatherScope::param"));
}

void Engine::GatherScope::close() {
  if (engine_ == nullptr || token_ == 0) return;
  engine_->impl_->close_scope(std::exchange(token_, 0));
}

Engine::GradScope::GradScope(Engine* engine, std::size_t unit_index, std::uint64_t token)
    : engine_(engine), unit_index_(unit_index), token_(token) {}

Engine::GradScope::GradScope(GradScope&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      unit_index_(other.unit_index_),
      token_(std::exchange(other.token_, 0)) {}

Engine::GradScope::~GradScope() {
  try {
    close();
  } catch (...) {  // a destructor never throws: the engine's next call does
    if (engine_ != nullptr) engine_->impl_->keep_error(std::current_exception());
  }
}

const std::string& Engine::GradScope::unit() const {
  if (engine_ == nullptr) throw UsageError("GradScope::unit() of a moved-from scope");
  return engine_->impl_->layout->units[unit_index_].name;
}

BufferView Engine::GradScope::grad(std::string_view name) const {
  if (engine_ == nullptr) throw UsageError(fmt::format("GradScope::grad('{}') of a moved-from scope", name));
  Impl& impl = *engine_->impl_;
  const std::string& unit_name = impl.layout->units[unit_index_].name;
  Impl::OpenScope* scope = token_ == 0 ? nullptr : impl.find_scope(token_);
  if (scope == nullptr) {
    throw UsageError(fmt::format("GradScope::grad('{}'): the GradScope of unit '{}' is closed", name, unit_name));
  }
  const engine::ParamLayout& p = impl.layout->params[impl.param_of_unit(unit_index_, name, "GradScope::grad")];
  if (p.group == engine::Group::frozen) {
    throw UsageError(
        fmt::format("GradScope::grad('{}'): param '{}' of unit '{}' is frozen (trainable = false) and "
                    "has no gradient",
                    name, name, unit_name));
  }
  return scope->grads.view.slice(p.offset, p.numel);
}

void Engine::GradScope::close() {
  if (engine_ == nullptr || token_ == 0) return;
  engine_->impl_->close_scope(std::exchange(token_, 0));
}

}  // namespace zero3
