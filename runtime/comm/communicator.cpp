#include "zero3/comm/communicator.hpp"

#include <fmt/format.h>

#include "communicator_base.hpp"
#include "flight_recorder.hpp"

namespace zero3::comm {

// ---------------------------------------------------------------- CommunicatorBase

void CommunicatorBase::usage_error(std::string_view op, std::string_view detail) const {
  throw UsageError(fmt::format("{} ({} communicator) on rank {} of {}: {}", op, backend_name(), rank_, size_, detail));
}

std::string collective_failure_message(const CollectiveInfo& info, int rank, int size, std::string_view backend,
                                       std::string_view detail) {
  return fmt::format("{} failed on rank {} of {} ({} communicator): {}", describe(info), rank, size, backend, detail);
}

std::string CommunicatorBase::failure_message(const CollectiveInfo& info, std::string_view detail) const {
  return collective_failure_message(info, rank_, size_, backend_name(), detail);
}

std::uint64_t CommunicatorBase::last_seq() const {
  std::lock_guard lock(issue_mutex_);
  return last_seq_;
}

void CommunicatorBase::check_view(std::string_view op, std::string_view what, const void* data, std::size_t count,
                                  MemoryKind kind) const {
  if (count > max_count()) {
    usage_error(
        op, fmt::format("{} has {} elements per rank, more than this backend's limit of {}", what, count, max_count()));
  }
  if (count > 0 && data == nullptr) usage_error(op, fmt::format("{} has {} elements but a null pointer", what, count));
  if (count > 0) check_memory(op, what, kind);
}

void CommunicatorBase::check_common(std::string_view op, Stream& stream) const {
  if (&stream.device() != &device_) {
    usage_error(op, fmt::format("stream '{}' belongs to another device than the communicator's ({})", stream.name(),
                                device_.description()));
  }
  check_stream(op, stream);
}

namespace {
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
}  // namespace

template <typename Enqueue>
std::shared_ptr<Work> CommunicatorBase::issue(CollectiveInfo info, Enqueue&& enqueue) {
  std::lock_guard lock(issue_mutex_);
  flight::Recorder& recorder = flight::Recorder::instance();
  if (!flight_registered_) {
    flight_lane_ = recorder.register_lane(backend_name());
    flight_registered_ = true;
  }
  info.seq = last_seq_ + 1;
  const bool per_rank = info.op == "all_gather" || info.op == "reduce_scatter";
  const std::uint64_t bytes = info.count * size_of(info.dtype) * (per_rank ? static_cast<std::uint64_t>(size_) : 1);
  // Recorded before the enqueue: the MPI thread may start the collective before enqueue() returns.
  recorder.issued(flight_lane_, info, bytes, "");
  std::shared_ptr<Work> work;
  try {
    work = enqueue(info);
  } catch (...) {
    recorder.completed(flight_lane_, info.seq, /*failed=*/true);
    throw;
  }
  last_seq_ = info.seq;  // only once enqueued: a failed enqueue must not desynchronize the ranks' numbers
  return work;
}

std::shared_ptr<Work> CommunicatorBase::all_gather(ConstBufferView send, BufferView recv, Stream& stream) {
  constexpr std::string_view op = "all_gather";
  if (send.dtype != recv.dtype) {
    usage_error(op, fmt::format("send is {} but recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype)));
  }
  if (recv.count != send.count * static_cast<std::size_t>(size_)) {
    usage_error(op, fmt::format("recv has {} elements but must have size() * send.count = {} * {} = {}", recv.count,
                                size_, send.count, send.count * static_cast<std::size_t>(size_)));
  }
  check_view(op, "send", send.data, send.count, send.kind);
  check_view(op, "recv", recv.data, send.count, recv.kind);
  if (overlaps(send.data, send.size_bytes(), recv.data, recv.size_bytes()) &&
      send.data != recv.slice(static_cast<std::size_t>(rank_) * send.count, send.count).data) {
    usage_error(op, "send overlaps recv but is not exactly this rank's block of recv (the in-place form)");
  }
  check_common(op, stream);
  CollectiveInfo info;
  info.op = op;
  info.dtype = send.dtype;
  info.count = send.count;
  return issue(std::move(info), [&](const CollectiveInfo& i) { return enqueue_all_gather(i, send, recv, stream); });
}

std::shared_ptr<Work> CommunicatorBase::reduce_scatter(ConstBufferView send, BufferView recv, ReduceOp rop,
                                                       Stream& stream) {
  constexpr std::string_view op = "reduce_scatter";
  if (send.dtype != recv.dtype) {
    usage_error(op, fmt::format("send is {} but recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype)));
  }
  if (send.count != recv.count * static_cast<std::size_t>(size_)) {
    usage_error(op, fmt::format("send has {} elements but must have size() * recv.count = {} * {} = {}", send.count,
                                size_, recv.count, recv.count * static_cast<std::size_t>(size_)));
  }
  check_view(op, "send", send.data, recv.count, send.kind);
  check_view(op, "recv", recv.data, recv.count, recv.kind);
  if (overlaps(send.data, send.size_bytes(), recv.data, recv.size_bytes()) &&
      recv.data != send.slice(static_cast<std::size_t>(rank_) * recv.count, recv.count).data) {
    usage_error(op, "recv overlaps send but is not exactly this rank's block of send (the in-place form)");
  }
  check_common(op, stream);
  CollectiveInfo info;
  info.op = op;
  info.dtype = recv.dtype;
  info.count = recv.count;
  info.reduce_op = rop;
  return issue(std::move(info), [&](const CollectiveInfo& i) { return enqueue_reduce_scatter(i, send, recv, stream); });
}

std::shared_ptr<Work> CommunicatorBase::all_reduce(BufferView data, ReduceOp rop, Stream& stream) {
  constexpr std::string_view op = "all_reduce";
  check_view(op, "data", data.data, data.count, data.kind);
  check_common(op, stream);
  CollectiveInfo info;
  info.op = op;
  info.dtype = data.dtype;
  info.count = data.count;
  info.reduce_op = rop;
  return issue(std::move(info), [&](const CollectiveInfo& i) { return enqueue_all_reduce(i, data, stream); });
}

std::shared_ptr<Work> CommunicatorBase::broadcast(BufferView data, int root, Stream& stream) {
  constexpr std::string_view op = "broadcast";
  if (root < 0 || root >= size_) usage_error(op, fmt::format("root {} is not a rank in [0, {})", root, size_));
  check_view(op, "data", data.data, data.count, data.kind);
  check_common(op, stream);
  CollectiveInfo info;
  info.op = op;
  info.dtype = data.dtype;
  info.count = data.count;
  info.root = root;
  return issue(std::move(info), [&](const CollectiveInfo& i) { return enqueue_broadcast(i, data, stream); });
}

std::shared_ptr<Work> CommunicatorBase::barrier(Stream& stream) {
  constexpr std::string_view op = "barrier";
  check_common(op, stream);
  CollectiveInfo info;
  info.op = op;
  return issue(std::move(info), [&](const CollectiveInfo& i) { return enqueue_barrier(i, stream); });
}

}  // namespace zero3::comm
