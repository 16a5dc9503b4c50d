// Which units are gathered, when, and for how long. acquire() makes a unit's full params available to the
// compute stream (joining a prefetched all-gather through its event, or gathering on demand), release()
// frees them unless the unit is used again soon (max_reuse_distance). The order of acquires in the first
// accumulation window is recorded as a trace; in later windows each acquire is checked against it, and
// upcoming units are prefetched on the communication stream within prefetch_bucket_size and
// max_live_parameters. A changed order is reported and the trace re-recorded.
// At world size 1 with the shards on the device (Wiring::single_rank_in_place) every unit is used from its
// shard in place, as persistent units always are: nothing is gathered, traced or prefetched.
// Every decision depends only on the sequence of calls (never on timing), so all ranks issue the same
// collectives. Engine thread only; all-gathers go on the comm stream, joins are stream waits on events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "deferred_free.hpp"
#include "layout.hpp"
#include "timeline.hpp"
#include "wiring.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

class GatherCoordinator {
 public:
  // `param_shards`: the rank's flat param-shard buffer (layout.param_shard_count elements). In host memory
  // (offload_param), each gather first copies the rank's shard to the device, and persistent units keep a
  // device copy (made here, on the comm stream).
  GatherCoordinator(const Wiring& wiring, BufferView param_shards);

  // Work enqueued on the compute stream after this call sees the unit's full params. Non-blocking, except
  // that a new gathered buffer may first wait for released ones to be freed (to respect the live budget).
  void acquire(std::size_t unit);
  // One scope of the unit closed: when none remains open, frees its gathered buffer (after the work
  // enqueued on the compute stream so far) unless its next use is near enough to keep it.
  void release(std::size_t unit);
  // The full param, in the gathered buffer (or the persistent shard). The unit must be acquired.
  BufferView param(std::size_t param_index) const;
  // The accumulation window ended: the trace is complete (or checked), and every kept or prefetched unit
  // is released, since the optimizer step makes their gathered copies stale. No scope may be open.
  void end_window();
  // After a step wrote new params into host-memory shards: refreshes the persistent units' device copies
  // (on the comm stream). A no-op when the shards are in device memory. A step changes only trainable
  // params; `frozen_too` for writes that may change frozen ones as well (Engine::write_state).
  void refresh_persistent(bool frozen_too = false);
  // Frees released buffers whose last use has completed (non-blocking).
  void reclaim() { frees_.reclaim(); }
  // false: acquires neither follow nor extend the trace, nothing is prefetched, and released units are
  // freed at once (Engine::untraced()).
  void set_traced(bool traced) { traced_ = traced; }

 private:
  enum class State : std::uint8_t { released, in_flight, available };
  struct UnitState {
    Buffer buffer;                 // the full padded params (non-persistent units)
    std::unique_ptr<Event> ready;  // recorded on the comm stream after the unit's all-gathers
    State state = State::released;
    bool prefetched = false;   // in flight because of a prefetch (counts against prefetch_bucket_size)
    int open = 0;              // open scopes
    std::size_t last_pos = 0;  // trace position of the most recent acquire
  };

  // The unit's full params are this rank's shard (persistent units; every unit in place at world size 1).
  bool whole_here(std::size_t unit) const { return in_place_ || layout_.units[unit].persistent; }
  void check_trace(std::size_t unit);
  void prefetch();
  void gather(std::size_t unit, bool prefetched);
  void free_unit(std::size_t unit, Stream& last_user);
  void finish_trace();
  bool keep_for_reuse(std::size_t unit) const;
  void add_gathered(std::size_t elems);
  void copy_persistent_group(std::size_t unit, Group g);

  const Layout& layout_;
  Device& device_;
  comm::Communicator& comm_;
  Stream& compute_;
  Stream& comm_stream_;
  EventPool& events_;
  DType dtype_;
  EngineStats& stats_;
  Timeline& timeline_;
  BufferView param_shards_;
  std::uint64_t prefetch_bucket_;
  std::uint64_t max_live_;
  std::uint64_t max_reuse_;

  bool offloaded_ = false;                 // param_shards_ in host memory
  bool in_place_ = false;                  // world size 1, shards on the device: no unit is gathered
  std::vector<Buffer> persistent_copies_;  // offloaded: device copies of persistent units (gathered layout)
  std::vector<UnitState> units_;
  DeferredFrees frees_;
  std::size_t live_padded_ = 0;          // elements of allocated gathered buffers not yet released
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
