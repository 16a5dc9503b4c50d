// What every Communicator backend shares: argument checks at the boundary (so backends trust their
// arguments), sequence numbers and CollectiveInfo. The public collectives validate, then call the
// backend's enqueue_* hook under one issue lock, so a sequence number and its enqueue are atomic with
// respect to other host threads: seq order is enqueue order on every stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "zero3/comm/communicator.hpp"

namespace zero3::comm {

// "<describe(info)> failed on rank r of n (<backend> communicator): <detail>": what Work::wait() throws
// as CommError.
std::string collective_failure_message(const CollectiveInfo& info, int rank, int size, std::string_view backend,
                                       std::string_view detail);

class CommunicatorBase : public Communicator {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }

  std::shared_ptr<Work> all_gather(ConstBufferView send, BufferView recv, Stream& stream) final;
  std::shared_ptr<Work> reduce_scatter(ConstBufferView send, BufferView recv, ReduceOp op, Stream& stream) final;
  std::shared_ptr<Work> all_reduce(BufferView data, ReduceOp op, Stream& stream) final;
  std::shared_ptr<Work> broadcast(BufferView data, int root, Stream& stream) final;
  std::shared_ptr<Work> barrier(Stream& stream) final;

 protected:
  CommunicatorBase(int rank, int size, Device& device) : rank_(rank), size_(size), device_(device) {}

  // Enqueue hooks: called after validation with the issue lock held; `info.seq` is this call's number.
  // An exception from a hook gives the number back (nothing was enqueued).
  virtual std::shared_ptr<Work> enqueue_all_gather(const CollectiveInfo& info, ConstBufferView send, BufferView recv,
                                                   Stream& stream) = 0;
  virtual std::shared_ptr<Work> enqueue_reduce_scatter(const CollectiveInfo& info, ConstBufferView send,
                                                       BufferView recv, Stream& stream) = 0;
  virtual std::shared_ptr<Work> enqueue_all_reduce(const CollectiveInfo& info, BufferView data, Stream& stream) = 0;
  virtual std::shared_ptr<Work> enqueue_broadcast(const CollectiveInfo& info, BufferView data, Stream& stream) = 0;
  virtual std::shared_ptr<Work> enqueue_barrier(const CollectiveInfo& info, Stream& stream) = 0;

  // Backend limits, checked with the rest of the arguments: throw UsageError via usage_error().
  // `what` names the buffer ("send", "recv", "data").
  virtual void check_memory(std::string_view op, std::string_view what, MemoryKind kind) const = 0;
  virtual void check_stream(std::string_view op, Stream& stream) const = 0;
  // The largest element count one rank may contribute.
  virtual std::size_t max_count() const = 0;

  // "<op> on rank r of n: <detail>" as a UsageError.
  [[noreturn]] void usage_error(std::string_view op, std::string_view detail) const;
  // collective_failure_message for this communicator.
  std::string failure_message(const CollectiveInfo& info, std::string_view detail) const;

  Device& device() const { return device_; }
  // Highest sequence number handed out so far (0 before the first collective).
  std::uint64_t last_seq() const;
  // This communicator's lane in the flight recorder: backends stamp started/completed on it.
  std::uint32_t flight_lane() const { return flight_lane_; }

 private:
  void check_view(std::string_view op, std::string_view what, const void* data, std::size_t count,
                  MemoryKind kind) const;
  void check_common(std::string_view op, Stream& stream) const;
  template <typename Enqueue>
  std::shared_ptr<Work> issue(CollectiveInfo info, Enqueue&& enqueue);

  const int rank_;
  const int size_;
  Device& device_;
  mutable std::mutex issue_mutex_;
  std::uint64_t last_seq_ = 0;  // guarded by issue_mutex_
  std::uint32_t flight_lane_ = 0;
  bool flight_registered_ = false;  // guarded by issue_mutex_
};

}  // namespace zero3::comm
