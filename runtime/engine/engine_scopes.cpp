// Scopes: GatherScope, GradScope and UntracedScope, opened by Engine::gather, grads and untraced and
// closed in the reverse order of opening; closing a GradScope hands its gradients to the reducer.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "engine_impl.hpp"
#include "zero3/core/error.hpp"

namespace zero3 {

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

Engine::UntracedScope Engine::untraced() {
  Impl& impl = *impl_;
  impl.check_call("untraced()", true);
  if (impl.untraced) throw UsageError("untraced(): an UntracedScope is already open");
  impl.untraced = true;
  impl.coordinator->set_traced(false);
  return UntracedScope(this);
}

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
