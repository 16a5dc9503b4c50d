// Engine::Impl: what one Engine owns, in lifetime order (members are destroyed in reverse, so the device
// outlives every buffer, and the streams are drained before the buffers their work uses go away).
// engine_impl.cpp builds it (construction, finalize()), engine_step.cpp and engine_tensor.cpp hold step()
// and gather_tensor(), engine_scopes.cpp the scopes, engine.cpp the public class on top of it and
// engine_state.cpp the EngineState view. Engine thread only.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "deferred_free.hpp"
#include "gather_coordinator.hpp"
#include "grad_reducer.hpp"
#include "layout.hpp"
#include "nvme_params.hpp"
#include "offload_optimizer.hpp"
#include "optimizer_step.hpp"
#include "wiring.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3 {

struct Engine::Impl {
  Impl(const config::Config& config, const comm::World& world, EngineResources resources);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // ---- checks shared by the public calls
  // Rethrows an error kept by a scope's destructor (once), then checks finalize() has (or has not) run.
  void check_call(std::string_view call, bool needs_finalized);
  std::size_t unit_or_throw(std::string_view call, std::string_view name) const;
  std::size_t param_of_unit(std::size_t unit, std::string_view name, std::string_view what) const;
  void keep_error(std::exception_ptr error) noexcept;
  // EngineState's calls that move state: finalize() has run, at an accumulation boundary, no scope open.
  void check_boundary(std::string_view call) const;
  // Throws, naming what is missing, unless `kind` of `slice` can be read and written: gradients, a frozen
  // param's optimizer state, a state the optimizer lacks.
  void check_state_source(TensorKind kind, const ParamSlice& slice, bool frozen, std::string_view call) const;

  // ---- scopes
  struct OpenScope {
    bool grad = false;
    std::size_t unit = 0;
    std::uint64_t token = 0;
    engine::GradBuffer grads;            // grad scopes: the full-size gradient buffer
    std::uint64_t compute_interval = 0;  // Timeline id of the scope's compute-stream interval
  };
  OpenScope* find_scope(std::uint64_t token);
  // Closes the scope `token` (a no-op when it is not open). State is updated before an order error throws.
  void close_scope(std::uint64_t token);
  std::string describe_scope(const OpenScope& s) const;

  void add_unit(UnitSpec unit);
  void finalize();
  // finalize()'s parts: the offload budget check (and the OffloadHost), the optimizer, and the components.
  void check_offload_budget(const engine::Layout& built);
  // The NVMe paths (offload_optimizer's, offload_param's) can take their files, on every rank.
  void check_nvme_paths(const engine::Layout& built, const engine::OffloadOptions& options);
  // Collective: runs fn on every rank; when it threw on some rank, every rank throws (that rank its own error,
  // the others ConfigError or IoError naming the first failing rank and its message).
  void agree_or_throw(const std::function<void()>& fn, bool config_error) const;
  std::unique_ptr<engine::ShardOptimizer> make_optimizer(const engine::Layout& built);
  // What the components share, every member named (after `layout` is set); finalize() builds it once.
  engine::Wiring make_wiring();
  void log_finalized() const;
  // Elements [flat, flat + count) of the param shards into dst / from src (any memory), wherever the shards
  // are: enqueued on comm_stream, or blocking (src may be reused when it returns) for shards on NVMe.
  void read_params(std::size_t flat, BufferView dst);
  void write_params(std::size_t flat, ConstBufferView src);
  StepResult step();
  // step() at the accumulation boundary: the optimizer and the window's statistics.
  void step_boundary(StepResult& r);
  std::vector<float> gather_tensor(std::string_view param, TensorKind kind);

  config::Config config;
  comm::World world;
  DType dtype = DType::f32;       // compute: param shards, gathered params, grad buffers
  DType comm_dtype = DType::f32;  // gradient reduction
  // Before the streams: their pending timestamp callbacks write into it until they are drained.
  std::unique_ptr<engine::Timeline> timeline;
  std::shared_ptr<Device> device;
  std::shared_ptr<comm::Bootstrap> bootstrap;
  std::shared_ptr<comm::Communicator> communicator;
  // Watches every collective of this process from here on (zero3.comm.timeout_s and friends).
  std::unique_ptr<comm::Watchdog> watchdog;
  std::unique_ptr<engine::EventPool> events;
  std::unique_ptr<Stream> compute;
  // All collectives, the accumulation and the optimizer step: one in-order queue for everything that touches
  // the shards, so the step sees every reduction and the next gathers see the new params without events.
  std::unique_ptr<Stream> comm_stream;
  std::unique_ptr<Event> compute_done;  // compute -> comm joins
  std::unique_ptr<Event> step_done;     // comm -> compute join after a step

  // Before finalize(): the declared units.
  std::vector<UnitSpec> specs;
  std::unordered_set<std::string> unit_names;
  std::unordered_set<std::string> param_names;

  // After finalize().
  std::optional<engine::Layout> layout;
  std::unique_ptr<engine::OffloadHost> offload_host;  // CPU offload: NUMA placement and the CPU pool
  Buffer param_shards;  // compute dtype, layout.param_shard_count (host memory with offload_param cpu)
  std::unique_ptr<engine::NvmeParams> nvme_params;  // instead, with offload_param nvme
  std::unique_ptr<engine::OptimizerStep> optimizer_step;
  std::unique_ptr<engine::GatherCoordinator> coordinator;
  std::unique_ptr<engine::GradReducer> reducer;

  std::vector<OpenScope> scopes;  // open scopes, in opening order
  std::uint64_t next_token = 1;
  bool untraced = false;  // an UntracedScope is open
  std::exception_ptr kept_error;
  EngineStats stats;
  std::int64_t micro_steps = 0;  // in the current accumulation window
  // A GradScope was closed since the last step() (or finalize()): step() refuses to run without one.
  bool backward_since_step = false;
  std::int64_t global_step = 0;
  std::int64_t skipped_steps = 0;
  engine::WindowMarks marks;  // of the window in progress (discard_window), cleared at its boundary
};

}  // namespace zero3
