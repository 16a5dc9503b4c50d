// Gathered params on the device: executes the GatherSchedule's decisions (gather_schedule.hpp) with the
// device and the communicator. A gather allocates the unit's full buffer and all-gathers its shards into
// it on the comm stream, recording an event the compute stream waits on at the unit's first use; a freed
// unit's buffer goes back once the last stream that used it has passed it. In host memory (offload_param)
// each gather first copies the rank's shard to the device, and persistent units keep a device copy; on NVMe
// (nvme_params.hpp) the shard comes from the params' read buffers, and each gather queues the disk reads of
// the units the trace says come next. At
// world size 1 with the shards on the device (Wiring::single_rank_in_place) every unit is used from its
// shard in place, as persistent units always are: nothing is gathered, traced or prefetched.
// Engine thread only; all-gathers go on the comm stream, joins are stream waits on events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "deferred_free.hpp"
#include "gather_schedule.hpp"
#include "layout.hpp"
#include "timeline.hpp"
#include "wiring.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

class NvmeParams;  // nvme_params.hpp

class GatherCoordinator final : private GatherActions {
 public:
  // `param_shards`: the rank's flat param-shard buffer (layout.param_shard_count elements), or, with
  // `nvme_params`, none.
  GatherCoordinator(const Wiring& wiring, BufferView param_shards, NvmeParams* nvme_params = nullptr);

  // Work enqueued on the compute stream after this call sees the unit's full params. Non-blocking, except
  // that a new gathered buffer may first wait for released ones to be freed (to respect the live budget).
  void acquire(std::size_t unit) { schedule_.acquire(unit); }
  // One scope of the unit closed: when none remains open, frees its gathered buffer (after the work
  // enqueued on the compute stream so far) unless its next use is near enough to keep it.
  void release(std::size_t unit) { schedule_.release(unit); }
  // The full param, in the gathered buffer (or the shard). The unit must be acquired.
  BufferView param(std::size_t param_index) const;
  // The accumulation window ended (GatherSchedule::end_window); freed buffers are reclaimed as they can be.
  void end_window();
  // After a step wrote new params into host-memory shards: refreshes the persistent units' device copies
  // (on the comm stream). A no-op when the shards are in device memory. A step changes only trainable
  // params; `frozen_too` for writes that may change frozen ones as well (Engine::write_state).
  void refresh_persistent(bool frozen_too = false);
  // Frees released buffers whose last use has completed (non-blocking).
  void reclaim() { frees_.reclaim(); }
  void set_traced(bool traced) { schedule_.set_traced(traced); }

 private:
  struct Gathered {
    Buffer buffer;                 // the full padded params
    std::unique_ptr<Event> ready;  // recorded on the comm stream after the unit's all-gathers
    bool joined = false;           // the compute stream waited on `ready`
  };

  // GatherActions
  void gather(std::size_t unit, bool prefetched) override;
  void join(std::size_t unit) override;
  void free(std::size_t unit, bool joined) override;

  void copy_persistent_group(std::size_t unit, Group g);
  // Offloaded: the rank's shard of the unit's group in host memory.
  ConstBufferView host_shard(std::size_t unit, Group g);

  const Layout& layout_;
  Device& device_;
  comm::Communicator& comm_;
  Stream& compute_;
  Stream& comm_stream_;
  EventPool& events_;
  DType dtype_;
  Timeline& timeline_;
  const comm::LoopProgress& progress_;
  BufferView param_shards_;
  NvmeParams* nvme_params_;
  std::uint64_t max_live_;

  bool offloaded_ = false;                 // param_shards_ in host memory
  std::vector<Buffer> persistent_copies_;  // offloaded: device copies of persistent units (gathered layout)
  std::vector<Gathered> gathered_;
  DeferredFrees frees_;
  std::size_t live_padded_ = 0;  // elements of allocated gathered buffers not yet released
  GatherSchedule schedule_;      // last: its constructor reads nothing of the above, its calls use all of it
};

}  // namespace zero3::engine
