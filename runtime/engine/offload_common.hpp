// What the two host-side optimizers share (CPU offload, offload_optimizer.cpp; NVMe offload,
// nvme_optimizer.cpp): the host region's chunking, the window's record of gradient arrivals, the
// device-to-host gradient staging slots, the worker thread that accumulates arrivals, and the fused CPU step
// of one span. Internal to the engine.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "layout.hpp"
#include "optimizer_step.hpp"
#include "timeline.hpp"
#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"
#include "zero3/offload/cpu_optimizer.hpp"
#include "zero3/offload/pinned_budget.hpp"

namespace zero3::engine {

// Largest host chunk: the state is pinned in registrations of at most this many fp32 elements.
inline constexpr std::size_t kChunkElems = offload::kPinnedChunkBytes / sizeof(float);
// Gradient staging: this many slots of at most kSlotElems elements each, so a copy can land while the
// worker accumulates the previous ones.
inline constexpr std::size_t kSlots = 4;
inline constexpr std::size_t kSlotElems = std::size_t{1} << 22;
// Gradient accumulation tiles (reduce_tiles: the statistics are summed per tile, in tile order).
inline constexpr std::size_t kGradTileElems = std::size_t{1} << 15;

// zero_optimization.sub_group_size in elements (<= 0: the whole state is one sub-group).
std::size_t sub_group_elems(const config::Config& config, std::size_t state_count);
// Moment tensors the optimizer keeps: Adam/AdamW 2, Lion and Adagrad 1.
int state_tensors(config::OptimizerType type);
// The largest piece a reduction hands over: a sharded group's slice or a persistent group whole.
std::size_t largest_arrival(const Layout& layout);
// The staging slot's elements: the largest arrival, at most kSlotElems (at least 1).
std::size_t staging_slot_elems(const Layout& layout);

// The host region [begin, end) of the state order cut at every sub-group boundary and into pieces of at most
// kChunkElems: {offset, count} in order. Arriving gradients are split at these bounds (and at the staging
// slot's size), so the statistics are summed over the same pieces however the state is held.
std::vector<std::pair<std::size_t, std::size_t>> host_chunk_bounds(const config::Config& config, std::size_t begin,
                                                                   std::size_t end);

// A gradient piece of the current window, keyed by its first element (NVMe offload adds what its logs hold).
struct GradArrival {
  std::size_t count = 0;
  std::size_t stats = 0;  // index into the window's statistics
  // Its last arrival was in the window's last micro-batch: the statistics taken then are the final values'.
  bool final = false;
};

// What record_arrival hands back: the window's entry for the piece, whether this is the piece's first arrival
// in the window (CPU offload overwrites its accumulator then, rather than adding), and the statistics slot the
// worker fills for this arrival.
template <class A>
struct ArrivalRecord {
  A& arrival;
  bool first;
  offload::GradStats* stats;
};

// The entry's part of record_arrival: a piece arriving again must have the same count (the window's pieces are
// cut the same way every micro-batch), and each arrival gets a statistics slot of its own, appended to `stats`.
// A deque, so the slot stays put while later arrivals append theirs and the worker writes it.
offload::GradStats* note_arrival(GradArrival& a, bool first, std::size_t count, bool final,
                                 std::deque<offload::GradStats>& stats);

// Records an arrival of `count` elements at `at` in the window (`final`: in the last micro-batch). A is
// GradArrival or derives from it; a map's entries stay put too, so the worker may hold on to the reference.
template <class A>
ArrivalRecord<A> record_arrival(std::map<std::size_t, A>& window, std::deque<offload::GradStats>& stats, std::size_t at,
                                std::size_t count, bool final) {
  const auto [it, first] = window.try_emplace(at);
  return {it->second, first, note_arrival(it->second, first, count, final, stats)};
}

// One task at a time, in submission order, on its own thread: the host side of the gradient pipeline.
class HostWorker {
 public:
  HostWorker();
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  void submit(std::function<void()> task);
  // Blocks until every submitted task has run; rethrows the first error a task raised (sticky).
  void drain();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started after every member it uses exists
};

// kSlots host buffers (comm dtype) the reduced gradient pieces are copied into on the comm stream, each with
// the event of its copy; a slot is taken in turn and handed back by the worker once it has read it.
class StagingSlots {
 public:
  struct Slot {
    Buffer buffer;
    std::unique_ptr<Event> copied;
    bool busy = false;
  };
  // allocate(count, dtype): the slot buffers (host memory the device can copy into).
  StagingSlots(Device& device, std::size_t elems, DType dtype,
               const std::function<Buffer(std::size_t, DType)>& allocate);
  std::size_t elems() const { return slots_.front().buffer.count(); }
  // The next slot in turn, once the worker released it (blocks while it is busy).
  Slot& acquire();
  // acquire(), then the device-to-host copy of `piece` into the slot enqueued on `stream` (timed on the
  // timeline's d2h lane) and the slot's event recorded after it.
  Slot& stage(Device& device, Timeline& timeline, ConstBufferView piece, Stream& stream);
  // Worker side: the slot may be refilled.
  void release(Slot& slot);

 private:
  std::vector<Slot> slots_;
  std::size_t next_ = 0;
  std::mutex mutex_;
  std::condition_variable free_;
};

// The fused step of `span` for the optimizer type, with seg's lr scale and weight decay.
void step_span(offload::SimdPath simd, const config::OptimizerConfig& config, const OptimizerStepArgs& args,
               const StateSegment& seg, const offload::StepSpan& span);

}  // namespace zero3::engine
