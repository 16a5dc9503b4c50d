#include "zero3/train/unit_walk.hpp"

#include <fmt/format.h>

#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"

namespace zero3::train {

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
  const Engine::GatherScope gathered = engine_.gather(spec.name);
  std::vector<BufferView> params;
  params.reserve(spec.params.size());
  for (const ParamSpec& p : spec.params) params.push_back(gathered.param(p.name));
  if (!with_grads) {
    fn(UnitViews{unit, params, {}});
    return;
  }
  const Engine::GradScope grads = engine_.grads(spec.name);
  std::vector<BufferView> grad_views;
  grad_views.reserve(spec.params.size());
  for (const ParamSpec& p : spec.params) grad_views.push_back(p.trainable ? grads.grad(p.name) : BufferView{});
  fn(UnitViews{unit, params, grad_views});
}

}  // namespace zero3::train
