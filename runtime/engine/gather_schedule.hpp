// Which units are gathered, when, and for how long: the policy of the GatherCoordinator, with no device.
// acquire() makes a unit's full params available (joining a prefetched gather, or gathering on demand),
// release() gives them up unless the unit is used again soon (max_reuse_distance). The order of acquires
// in the first accumulation window is recorded as a trace; in later windows each acquire is checked
// against it, and upcoming units are prefetched within prefetch_bucket_size and max_live_parameters. A
// changed order is reported and the trace re-recorded. Persistent units (and, in place at world size 1,
// every unit) are whole on the rank: nothing is gathered, traced or prefetched for them.
// What the decisions mean for memory and streams is the GatherActions' business: the coordinator's
// allocations and collectives, or the memory planner's count (zero3/engine/memory_plan.hpp), which runs
// this same schedule over a window's unit walk. Every decision depends only on the sequence of calls
// (never on timing), so all ranks make the same ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layout.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

class GatherActions {
 public:
  virtual ~GatherActions() = default;
  // The unit's full params are to be made available (ahead of their use when `prefetched`).
  virtual void gather(std::size_t unit, bool prefetched) = 0;
  // The unit's first use after its gather: the compute stream joins it.
  virtual void join(std::size_t unit) = 0;
  // The unit's gathered copy is given up. `joined`: the compute stream used it (else only the gather did:
  // a prefetch the window never reached).
  virtual void free(std::size_t unit, bool joined) = 0;
};

class GatherSchedule {
 public:
  // `whole_here_all`: every unit is whole on this rank (world size 1, in place). `stats` takes the gather
  // counts (all_gather_elems, gathered_elems and its peak, trace_rebuilds).
  GatherSchedule(const Layout& layout, const config::ZeroConfig& zero, bool whole_here_all, EngineStats& stats,
                 GatherActions& actions);

  void acquire(std::size_t unit);
  // One scope of the unit closed: when none remains open, frees it unless its next use is near enough.
  void release(std::size_t unit);
  // The accumulation window ended: the trace is complete (or checked), and every kept or prefetched unit
  // is freed, since the optimizer step makes their gathered copies stale. No scope may be open.
  void end_window();
  // false: acquires neither follow nor extend the trace, nothing is prefetched, and released units are
  // freed at once (Engine::untraced()).
  void set_traced(bool traced) { traced_ = traced; }
  bool traced() const { return traced_; }
  // The units the next acquires will gather, in trace order, at most `count` and each once (empty while the
  // trace is recorded or outside it): what a slower store of the shards should fetch ahead (nvme_params.hpp).
  std::vector<std::size_t> gathers_ahead(std::size_t count) const;
  // The unit's full params are this rank's shard (persistent units; every unit in place).
  bool whole_here(std::size_t unit) const { return whole_here_all_ || layout_.units[unit].persistent; }

 private:
  enum class State : std::uint8_t { released, in_flight, available };
  struct UnitState {
    State state = State::released;
    bool prefetched = false;   // in flight because of a prefetch (counts against prefetch_bucket_size)
    int open = 0;              // open scopes
    std::size_t last_pos = 0;  // trace position of the most recent acquire
  };

  void check_trace(std::size_t unit);
  void prefetch();
  void gather(std::size_t unit, bool prefetched);
  void free_unit(std::size_t unit);
  void finish_trace();
  bool keep_for_reuse(std::size_t unit) const;

  const Layout& layout_;
  bool whole_here_all_;
  EngineStats& stats_;
  GatherActions& actions_;
  std::uint64_t prefetch_bucket_;
  std::uint64_t max_live_;
  std::uint64_t max_reuse_;

  std::vector<UnitState> units_;
  std::uint64_t prefetch_inflight_ = 0;  // elements prefetched and not yet acquired

  // The trace: non-persistent units in acquire order over one accumulation window.
  std::vector<std::size_t> trace_;
  bool recording_ = true;                    // this window (re)records the trace
  bool traced_ = true;                       // false inside Engine::untraced()
  std::size_t pos_ = 0;                      // acquires so far in this window
  std::vector<std::size_t> next_use_;        // per trace position: the next position of the same unit, or npos
  std::vector<std::uint64_t> prefix_elems_;  // per trace position k: numel of trace[0, k)
};

}  // namespace zero3::engine
