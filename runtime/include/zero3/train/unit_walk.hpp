// The unit walk every trainer makes: each unit's full params in forward order, then each unit's params
// and gradient buffers in reverse order for backward. A UnitSource says where a unit's buffers come from:
// the engine's scopes (EngineUnits: gathered params, zero-filled gradient buffers that reduce-scatter
// when the unit is left) or a trainer's own buffers (an unsharded baseline). The walk runs on the
// engine's thread; the views are valid for work enqueued on the compute stream while the callback runs.
//
//   zero3::train::EngineUnits units(engine, model.units());
//   zero3::train::walk_forward(units, [&](const zero3::train::UnitViews& u) {
//     model.forward_unit(u.unit, u.params, engine.compute_stream());
//   });
//   zero3::train::walk_backward(units, [&](const zero3::train::UnitViews& u) {
//     model.backward_unit(u.unit, u.params, u.grads, seed, engine.compute_stream());
//   });
//   engine.step();
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "zero3/core/buffer_view.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::train {

// One unit's buffers while a walk visits it. params[k] and grads[k] belong to the unit's k-th param (its
// UnitSpec order), followed by the params of the units it borrows (UnitSpec::borrows, in that order);
// grads is empty in forward, and grads[k] is an empty view for a frozen param. The spans live only during
// the callback: work enqueued on a stream must capture copies of the views.
struct UnitViews {
  std::size_t unit = 0;
  std::span<const BufferView> params;
  std::span<const BufferView> grads;
};
using UnitFn = std::function<void(const UnitViews&)>;

class UnitSource {
 public:
  virtual ~UnitSource() = default;
  virtual std::size_t num_units() const = 0;
  // Makes unit `unit`'s params (and, with `with_grads`, its gradient buffers) available, calls `fn` once
  // with them, then releases them (the engine reduce-scatters the gradients then).
  virtual void visit(std::size_t unit, bool with_grads, const UnitFn& fn) = 0;
};

// fn for units 0 .. n-1, params only.
void walk_forward(UnitSource& source, const UnitFn& fn);
// fn for units n-1 .. 0, params and gradient buffers.
void walk_backward(UnitSource& source, const UnitFn& fn);

// The engine's units, through GatherScope and GradScope. `units`: the UnitSpecs declared to the engine,
// in forward order (they must outlive this object).
class EngineUnits final : public UnitSource {
 public:
  // A visit gathers the unit and then each unit it borrows (nested scopes), and in backward opens their
  // GradScopes in the same order; a borrowed unit's gradients of this visit reduce into its accumulators
  // when the visit ends, adding to those of its own visit.
  // With memory_breakdown, each visit is a phase of the engine's memory tracker, entered before the gather:
  // "<forward_phase> <unit>" without gradients ("forward", or "held-out" for an evaluation pass),
  // "backward <unit>" with them.
  EngineUnits(Engine& engine, std::span<const UnitSpec> units, std::string forward_phase = "forward")
      : engine_(engine), units_(units), forward_phase_(std::move(forward_phase)) {}
  std::size_t num_units() const override { return units_.size(); }
  void visit(std::size_t unit, bool with_grads, const UnitFn& fn) override;

 private:
  Engine& engine_;
  std::span<const UnitSpec> units_;
  std::string forward_phase_;
};

}  // namespace zero3::train
