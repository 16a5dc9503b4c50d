#include "deferred_free.hpp"

#include <exception>

#include "zero3/core/log.hpp"

namespace zero3::engine {

std::unique_ptr<Event> EventPool::acquire() {
  if (free_.empty()) return device_.create_event();
  std::unique_ptr<Event> e = std::move(free_.back());
  free_.pop_back();
  return e;
}

void EventPool::give_back(std::unique_ptr<Event> event) {
  if (event) free_.push_back(std::move(event));
}

DeferredFrees::~DeferredFrees() {
  try {
    while (reclaim_oldest()) {
    }
  } catch (const std::exception& e) {  // destructors never throw
    log::error("freeing engine buffers: {}", e.what());
  }
}

void DeferredFrees::release(Buffer buffer, Stream& stream) {
  if (buffer.empty()) return;
  std::unique_ptr<Event> done = events_.acquire();
  stream.record(*done);
  pending_elems_ += buffer.count();
  pending_.push_back({std::move(buffer), std::move(done)});
}

void DeferredFrees::free_front() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  pending_elems_ -= p.buffer.count();
  p.buffer.reset();
  events_.give_back(std::move(p.done));
}

void DeferredFrees::reclaim() {
  // In order: events of one stream complete in order, and the streams involved drain quickly, so stopping
  // at the first incomplete one loses little and keeps this O(completed).
  while (!pending_.empty() && pending_.front().done->query()) free_front();
}

bool DeferredFrees::reclaim_oldest() {
  if (pending_.empty()) return false;
  pending_.front().done->synchronize();
  free_front();
  return true;
}

}  // namespace zero3::engine
