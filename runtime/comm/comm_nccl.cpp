#include "comm_nccl.hpp"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "nccl_check.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/log.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::comm {
namespace {

// Makes `device` current for the scope; NCCL and CUDA calls act on the current device.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    ZERO3_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) ZERO3_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~CudaDeviceScope() {
    if (changed_) ZERO3_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

cudaStream_t cuda_stream(Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

class NcclWork final : public Work {
 public:
  NcclWork(CollectiveInfo info, cudaEvent_t event, std::shared_ptr<NcclCommHandle> comm, int rank, int size)
      : info_(std::move(info)), event_(event), comm_(std::move(comm)), rank_(rank), size_(size) {}
  ~NcclWork() override { ZERO3_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_)); }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  // The event is created with cudaEventBlockingSync, so the host sleeps instead of spinning.
  void wait() override {
    const cudaError_t waited = cudaEventSynchronize(event_);
    if (waited != cudaSuccess) fail(fmt::format("cudaEventSynchronize: {}", cudaGetErrorString(waited)));
    check_async_error();
  }

  bool is_completed() override {
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) {
      check_async_error();  // a peer's failure can leave the collective pending forever
      return false;
    }
    if (state != cudaSuccess) fail(fmt::format("cudaEventQuery: {}", cudaGetErrorString(state)));
    check_async_error();
    return true;
  }

  const CollectiveInfo& info() const override { return info_; }

 private:
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm_->get(), &async);
    if (got != ncclSuccess) fail(fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(got)));
    if (async != ncclSuccess && async != ncclInProgress) {
      const char* last = ncclGetLastError(comm_->get());
      fail(fmt::format("NCCL reported an asynchronous error: {}{}{}", ncclGetErrorString(async),
                       last != nullptr && *last != '\0' ? ": " : "", last != nullptr ? last : ""));
    }
  }
  [[noreturn]] void fail(std::string_view detail) const {
    throw CommError(collective_failure_message(info_, rank_, size_, "nccl", detail));
  }

  CollectiveInfo info_;
  cudaEvent_t event_;
  std::shared_ptr<NcclCommHandle> comm_;
  int rank_;
  int size_;
};

}  // namespace

NcclCommHandle::~NcclCommHandle() {
  try {
    CudaDeviceScope scope(cuda_device_);
    ZERO3_NCCL_CHECK_NOTHROW(ncclCommDestroy(comm_));
  } catch (const std::exception& e) {
    log::error("destroying the NCCL communicator: {}", e.what());
  }
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Bootstrap> bootstrap, Device& device)
    : CommunicatorBase(bootstrap->rank(), bootstrap->size(), device), bootstrap_(std::move(bootstrap)) {
  if (device.kind() != DeviceKind::cuda) {
    throw UsageError(fmt::format("make_nccl_communicator needs a CUDA device, not {}: use make_mpi_communicator",
                                 device.description()));
  }
  // Device has no ordinal accessor; one of its streams knows which GPU it belongs to.
  int cuda_device = 0;
  {
    std::unique_ptr<Stream> probe = device.create_stream("zero3-nccl-init");
    ZERO3_CUDA_CHECK(cudaStreamGetDevice(cuda_stream(*probe), &cuda_device));
  }
  CudaDeviceScope scope(cuda_device);

  // Rank 0 makes the id; everyone gets it through the bootstrap (collective over all ranks).
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank() == 0) ZERO3_NCCL_CHECK(ncclGetUniqueId(&id));
  id = broadcast_value(*bootstrap_, id, 0);

  Buffer barrier_buffer = device.allocate(1, DType::f32, MemoryKind::device, MemCategory::comm_buffer);
  ncclComm_t comm = nullptr;
  ZERO3_NCCL_CHECK(ncclCommInitRank(&comm, size(), id, rank()));
  comm_ = std::make_shared<NcclCommHandle>(comm, cuda_device, std::move(barrier_buffer));
  // The failure policy aborts NCCL before MPI (hooks run newest first): kernels stuck waiting for a peer
  // that is gone never return otherwise.
  abort_hook_ = register_abort_hook([weak = std::weak_ptr<NcclCommHandle>(comm_)] {
    if (const auto handle = weak.lock()) ncclCommAbort(handle->get());
  });
}

NcclCommunicator::~NcclCommunicator() {
  unregister_abort_hook(abort_hook_);
}

void NcclCommunicator::check_memory(std::string_view op, std::string_view what, MemoryKind kind) const {
  if (kind != MemoryKind::device) {
    usage_error(op, fmt::format("{} is {} memory, but the nccl backend takes CUDA device memory (copy it to the "
                                "device first, or use the mpi communicator for host buffers)",
                                what, memory_kind_name(kind)));
  }
}

void NcclCommunicator::check_stream(std::string_view op, Stream& stream) const {
  if (stream.native_handle() == nullptr) {
    usage_error(op, fmt::format("stream '{}' is not a CUDA stream", stream.name()));
  }
}

std::size_t NcclCommunicator::max_count() const {
  return std::numeric_limits<std::size_t>::max() / 4;
}

template <typename Collective>
std::shared_ptr<Work> NcclCommunicator::launch(const CollectiveInfo& info, Stream& stream, Collective&& collective) {
  CudaDeviceScope scope(comm_->cuda_device());
  cudaEvent_t event = nullptr;
  // Created before the collective, so a failure here leaves nothing enqueued.
  ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  auto work = std::make_shared<NcclWork>(info, event, comm_, rank(), size());
  collective(cuda_stream(stream));
  // A record failure after an enqueued collective cannot give the sequence number back; it is a CUDA
  // error of the whole context, which every later call reports too.
  ZERO3_CUDA_CHECK(cudaEventRecord(event, cuda_stream(stream)));
  return work;
}

std::shared_ptr<Work> NcclCommunicator::enqueue_all_gather(const CollectiveInfo& info, ConstBufferView send,
                                                           BufferView recv, Stream& stream) {
  return launch(info, stream, [&](cudaStream_t s) {
    ZERO3_NCCL_CHECK(ncclAllGather(send.data, recv.data, send.count, nccl_type(send.dtype), comm_->get(), s));
  });
}

std::shared_ptr<Work> NcclCommunicator::enqueue_reduce_scatter(const CollectiveInfo& info, ConstBufferView send,
                                                               BufferView recv, Stream& stream) {
  return launch(info, stream, [&](cudaStream_t s) {
    ZERO3_NCCL_CHECK(ncclReduceScatter(send.data, recv.data, recv.count, nccl_type(recv.dtype),
                                       nccl_op(*info.reduce_op), comm_->get(), s));
  });
}

std::shared_ptr<Work> NcclCommunicator::enqueue_all_reduce(const CollectiveInfo& info, BufferView data,
                                                           Stream& stream) {
  return launch(info, stream, [&](cudaStream_t s) {
    ZERO3_NCCL_CHECK(ncclAllReduce(data.data, data.data, data.count, nccl_type(data.dtype), nccl_op(*info.reduce_op),
                                   comm_->get(), s));
  });
}

std::shared_ptr<Work> NcclCommunicator::enqueue_broadcast(const CollectiveInfo& info, BufferView data, Stream& stream) {
  return launch(info, stream, [&](cudaStream_t s) {
    ZERO3_NCCL_CHECK(
        ncclBroadcast(data.data, data.data, data.count, nccl_type(data.dtype), info.root, comm_->get(), s));
  });
}

// NCCL has no barrier: a one-element all-reduce completes on no rank before every rank has joined it.
std::shared_ptr<Work> NcclCommunicator::enqueue_barrier(const CollectiveInfo& info, Stream& stream) {
  return launch(info, stream, [&](cudaStream_t s) {
    void* p = comm_->barrier_buffer().data();
    ZERO3_NCCL_CHECK(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm_->get(), s));
  });
}

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Bootstrap> bootstrap, Device& device) {
  if (bootstrap == nullptr) throw UsageError("make_nccl_communicator needs a bootstrap (make_mpi_bootstrap)");
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device);
}

bool built_with_nccl() {
  return true;
}

}  // namespace zero3::comm
