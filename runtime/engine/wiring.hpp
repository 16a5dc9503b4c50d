// What the engine's components (GatherCoordinator, GradReducer, OptimizerStep) share: built once by
// Engine::Impl::finalize() with designated initializers, so every stream and dtype is named where it is
// set (a reordered or misnamed designator does not compile) and each component reads the ones it needs by
// name. Everything referenced is owned by Engine::Impl and outlives the components.
#pragma once

#include "deferred_free.hpp"
#include "layout.hpp"
#include "timeline.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/config/config.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

struct Wiring {
  const Layout& layout;
  const config::Config& config;
  Device& device;
  comm::Communicator& communicator;
  // The trainer's stream: gathers are joined to it, gradient buffers are zero-filled on it.
  Stream& compute_stream;
  // Every collective, the accumulation and the optimizer step, in one order.
  Stream& comm_stream;
  EventPool& events;
  DType compute_dtype;  // param shards, gathered params, gradient buffers
  DType comm_dtype;     // gradient reduction
  EngineStats& stats;
  Timeline& timeline;
  // Where the training loop is (the watchdog's): ZERO3_FAULT's test faults fire at a step.
  const comm::LoopProgress& progress;
  // World size 1 and zero3.single_rank_in_place, without the host backend's scope-memory guard: gradients
  // skip the collectives, and units are used from their shards in place where those are in device memory
  // (docs/engine.md, "World size 1").
  bool single_rank_in_place;
};

}  // namespace zero3::engine
