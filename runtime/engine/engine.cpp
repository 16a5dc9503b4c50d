// The public Engine (zero3/engine/engine.hpp): each call checks what it needs of the engine's state and
// hands over to Engine::Impl (engine_impl.cpp builds it, engine_step.cpp steps it, engine_tensor.cpp gathers
// whole tensors, engine_scopes.cpp opens and closes scopes, engine_state.cpp reads and writes state). The
// mechanics live in layout/init (partitioning), gather_coordinator, grad_reducer and optimizer_step.
#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "engine_impl.hpp"
#include "zero3/core/error.hpp"

namespace zero3 {

Engine::Engine(const config::Config& config, const comm::World& world, EngineResources resources)
    : impl_(std::make_unique<Impl>(config, world, std::move(resources))) {}

Engine::~Engine() = default;

void Engine::add_unit(UnitSpec unit) {
  impl_->add_unit(std::move(unit));
}

void Engine::finalize() {
  impl_->finalize();
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

void Engine::mark_memory_pressure(MemoryPressure pressure) {
  Impl& impl = *impl_;
  impl.check_call("mark_memory_pressure", true);
  (pressure == MemoryPressure::high ? impl.marks.memory_high : impl.marks.memory_low) = true;
}

void Engine::set_accumulation(std::int64_t micro_batch, std::int64_t gradient_accumulation_steps) {
  Impl& impl = *impl_;
  if (impl.layout) impl.check_boundary("set_accumulation");
  config::BatchConfig& b = impl.config.batch;
  if (micro_batch < 1 || gradient_accumulation_steps < 1 ||
      micro_batch * gradient_accumulation_steps * b.world_size != b.train_batch_size) {
    throw ConfigError(
        fmt::format("set_accumulation: micro-batch {} x accumulation {} x world size {} is not train_batch_size {}",
                    micro_batch, gradient_accumulation_steps, b.world_size, b.train_batch_size));
  }
  b.train_micro_batch_size_per_gpu = micro_batch;
  b.gradient_accumulation_steps = gradient_accumulation_steps;
  if (impl.optimizer_step) impl.optimizer_step->optimizer().set_final_micro_step(gradient_accumulation_steps == 1);
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

}  // namespace zero3
