#include "zero3/train/unit_walk.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"

namespace zero3::train {
namespace {

// Engine scopes closed in the reverse order of opening, as the engine requires (a vector's own destructor
// leaves the order of its elements' destruction unspecified).
template <typename Scope>
class ScopeStack {
 public:
  ScopeStack() = default;
  ScopeStack(const ScopeStack&) = delete;
  ScopeStack& operator=(const ScopeStack&) = delete;
  ~ScopeStack() {
    while (!scopes_.empty()) scopes_.pop_back();
  }
  const Scope& push(Scope scope) { return scopes_.emplace_back(std::move(scope)); }

 private:
  std::vector<Scope> scopes_;
};

}  // namespace

void walk_forward(UnitSource& source, const UnitFn& fn) {
  for (std::size_t u = 0; u < source.num_units(); ++u) source.visit(u, false, fn);
}

void walk_backward(UnitSource& source, const UnitFn& fn) {
  for (std::size_t u = source.num_units(); u-- > 0;) source.visit(u, true, fn);
}

void EngineUnits::visit(std::size_t unit, bool with_grads, const UnitFn& fn) {
  if (unit >= units_.size()) {
    throw UsageError(fmt::format("EngineUnits::visit: unit {} of {}", unit, units_.size()));
  }
  const UnitSpec& spec = units_[unit];
  if (engine_.config().memory_breakdown || trace::enabled()) {
    engine_.memory().enter_phase(fmt::format("{} {}", with_grads ? "backward" : forward_phase_, spec.name));
  }
  // The unit's own scope, then one per borrowed unit; they close in the reverse order, gradients first.
  std::vector<const UnitSpec*> visited;
  for (const std::size_t v : visit_units(units_, unit)) visited.push_back(&units_[v]);
  ScopeStack<Engine::GatherScope> gathered;
  std::vector<BufferView> params;
  for (const UnitSpec* u : visited) {
    const Engine::GatherScope& g = gathered.push(engine_.gather(u->name));
    for (const ParamSpec& p : u->params) params.push_back(g.param(p.name));
  }
  if (!with_grads) {
    fn(UnitViews{unit, params, {}});
    return;
  }
  ScopeStack<Engine::GradScope> grads;
  std::vector<BufferView> grad_views;
  for (const UnitSpec* u : visited) {
    const Engine::GradScope& g = grads.push(engine_.grads(u->name));
    for (const ParamSpec& p : u->params) grad_views.push_back(p.trainable ? g.grad(p.name) : BufferView{});
  }
  fn(UnitViews{unit, params, grad_views});
}

}  // namespace zero3::train
