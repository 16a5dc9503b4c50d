// Buffers whose last use is still queued on a stream. Each waits for an event recorded right after that
// use and is freed once the event has completed: reclaim() polls (never blocks), reclaim_oldest() blocks
// on one event when memory must come back now. Events come from a pool, so steady state creates none.
// Used from the engine's thread only.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "zero3/device/device.hpp"

namespace zero3::engine {

class EventPool {
 public:
  explicit EventPool(Device& device) : device_(device) {}
  std::unique_ptr<Event> acquire();
  void give_back(std::unique_ptr<Event> event);

 private:
  Device& device_;
  std::vector<std::unique_ptr<Event>> free_;
};

class DeferredFrees {
 public:
  explicit DeferredFrees(EventPool& events) : events_(events) {}
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;
  ~DeferredFrees();  // blocks until every pending buffer may be freed

  // Non-blocking: `buffer` is freed once everything enqueued on `stream` so far has completed.
  void release(Buffer buffer, Stream& stream);
  // Non-blocking: frees every buffer whose event has completed.
  void reclaim();
  // Blocks until the oldest pending buffer's event completes and frees it; false when none is pending.
  bool reclaim_oldest();
  // Elements and number of the buffers still pending.
  std::size_t pending_elems() const { return pending_elems_; }
  std::size_t pending_count() const { return pending_.size(); }

 private:
  struct Pending {
    Buffer buffer;
    std::unique_ptr<Event> done;
  };
  void free_front();
  EventPool& events_;
  std::deque<Pending> pending_;
  std::size_t pending_elems_ = 0;
};

}  // namespace zero3::engine
