#include "offload_common.hpp"

#include <algorithm>

#include "zero3/core/error.hpp"

namespace zero3::engine {

using config::OptimizerType;

std::size_t sub_group_elems(const config::Config& config, std::size_t state_count) {
  const std::int64_t s = config.zero.sub_group_size;
  return s <= 0 ? std::max<std::size_t>(state_count, 1) : static_cast<std::size_t>(s);
}

int state_tensors(OptimizerType type) {
  return type == OptimizerType::adam || type == OptimizerType::adamw ? 2 : 1;
}

std::size_t largest_arrival(const Layout& layout) {
  std::size_t n = 0;
  for (const UnitLayout& u : layout.units) n = std::max(n, u.group(Group::trainable).shard);
  return n;
}

std::size_t staging_slot_elems(const Layout& layout) {
  return std::min(kSlotElems, std::max<std::size_t>(largest_arrival(layout), 1));
}

std::vector<std::pair<std::size_t, std::size_t>> host_chunk_bounds(const config::Config& config, std::size_t begin,
                                                                   std::size_t end) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  const std::size_t sub = sub_group_elems(config, end);
  for (std::size_t a = begin; a < end;) {
    const std::size_t sub_end = std::min(end, (a / sub + 1) * sub);
    const std::size_t n = std::min(sub_end - a, kChunkElems);
    out.emplace_back(a, n);
    a += n;
  }
  return out;
}

offload::GradStats* note_arrival(GradArrival& a, bool first, std::size_t count, bool final,
                                 std::deque<offload::GradStats>& stats) {
  ZERO3_CHECK(first || a.count == count, "offload: gradient pieces changed shape within a window");
  a.count = count;
  a.final = final;
  a.stats = stats.size();
  return &stats.emplace_back();
}

HostWorker::HostWorker() : thread_([this] { run(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HostWorker::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_all();
}

void HostWorker::drain() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  if (error_) std::rethrow_exception(error_);
}

void HostWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_ with nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    try {
      if (!error_) task();  // after an error the accumulators are garbage: skip, report at drain()
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    busy_ = false;
    if (tasks_.empty()) idle_.notify_all();
  }
}

StagingSlots::StagingSlots(Device& device, std::size_t elems, DType dtype,
                           const std::function<Buffer(std::size_t, DType)>& allocate) {
  for (std::size_t i = 0; i < kSlots; ++i) slots_.push_back({allocate(elems, dtype), device.create_event(), false});
}

StagingSlots::Slot& StagingSlots::acquire() {
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  std::unique_lock lock(mutex_);
  free_.wait(lock, [&] { return !s.busy; });
  s.busy = true;
  return s;
}

StagingSlots::Slot& StagingSlots::stage(Device& device, Timeline& timeline, ConstBufferView piece, Stream& stream) {
  Slot& slot = acquire();
  const std::uint64_t copy = timeline.begin(stream, Timeline::Lane::d2h);
  device.copy_async(slot.buffer.view().slice(0, piece.count), piece, stream);
  timeline.end(stream, copy);
  timeline.add_bytes(Timeline::Lane::d2h, piece.size_bytes());
  stream.record(*slot.copied);
  return slot;
}

void StagingSlots::release(Slot& slot) {
  {
    std::lock_guard lock(mutex_);
    slot.busy = false;
  }
  free_.notify_all();
}

void step_span(offload::SimdPath simd, const config::OptimizerConfig& config, const OptimizerStepArgs& args,
               const StateSegment& seg, const offload::StepSpan& span) {
  const auto lr = static_cast<float>(args.lr * seg.lr_scale);
  const auto wd = static_cast<float>(seg.weight_decay ? config.weight_decay : 0.0);
  switch (config.type) {
    case OptimizerType::adam:
    case OptimizerType::adamw:
      offload::adam_range(simd, adam_args(config, args, lr, wd), span);
      break;
    case OptimizerType::lion:
      offload::lion_range(simd, lion_args(args, lr, wd), span);
      break;
    case OptimizerType::adagrad:
      offload::adagrad_range(simd, adagrad_args(config, args, lr, wd), span);
      break;
  }
}

}  // namespace zero3::engine
