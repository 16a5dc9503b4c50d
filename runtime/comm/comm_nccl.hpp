// The NCCL backend: collectives on CUDA device buffers, enqueued by NCCL on the caller's cudaStream_t
// (so stream order is CUDA's own). Each Work records a CUDA event after its collective; wait() blocks on
// it and then asks NCCL for asynchronous errors. The ncclComm_t is shared by the communicator and its
// outstanding Works, so a Work may outlive the communicator. Private to comm/; built only with CUDA.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <utility>

#include "communicator_base.hpp"

namespace zero3::comm {

// Owns one ncclComm_t and the device memory its collectives use; destroys the communicator (NCCL
// flushes outstanding work first), then the memory, when the last holder goes.
class NcclCommHandle {
 public:
  NcclCommHandle(ncclComm_t comm, int cuda_device, Buffer barrier_buffer)
      : barrier_buffer_(std::move(barrier_buffer)), comm_(comm), cuda_device_(cuda_device) {}
  ~NcclCommHandle();
  NcclCommHandle(const NcclCommHandle&) = delete;
  NcclCommHandle& operator=(const NcclCommHandle&) = delete;
  ncclComm_t get() const { return comm_; }
  int cuda_device() const { return cuda_device_; }
  // One fp32 element of device memory: barrier is an all-reduce of it.
  const Buffer& barrier_buffer() const { return barrier_buffer_; }

 private:
  Buffer barrier_buffer_;  // declared first: freed after the communicator that uses it is destroyed
  ncclComm_t comm_;
  int cuda_device_;
};

class NcclCommunicator final : public CommunicatorBase {
 public:
  NcclCommunicator(std::shared_ptr<Bootstrap> bootstrap, Device& device);
  ~NcclCommunicator() override;

  std::string_view backend_name() const override { return "nccl"; }

 protected:
  std::shared_ptr<Work> enqueue_all_gather(const CollectiveInfo& info, ConstBufferView send, BufferView recv,
                                           Stream& stream) override;
  std::shared_ptr<Work> enqueue_reduce_scatter(const CollectiveInfo& info, ConstBufferView send, BufferView recv,
                                               Stream& stream) override;
  std::shared_ptr<Work> enqueue_all_reduce(const CollectiveInfo& info, BufferView data, Stream& stream) override;
  std::shared_ptr<Work> enqueue_broadcast(const CollectiveInfo& info, BufferView data, Stream& stream) override;
  std::shared_ptr<Work> enqueue_barrier(const CollectiveInfo& info, Stream& stream) override;

  void check_memory(std::string_view op, std::string_view what, MemoryKind kind) const override;
  void check_stream(std::string_view op, Stream& stream) const override;
  std::size_t max_count() const override;

 private:
  // Creates the Work's event, runs `collective(stream)` (NCCL calls) and records the event after it.
  template <typename Collective>
  std::shared_ptr<Work> launch(const CollectiveInfo& info, Stream& stream, Collective&& collective);

  std::shared_ptr<Bootstrap> bootstrap_;  // kept for the communicator's life, like the MPI backend's
  std::shared_ptr<NcclCommHandle> comm_;  // shared with outstanding Works
  std::uint64_t abort_hook_ = 0;          // ncclCommAbort for the failure policy
};

}  // namespace zero3::comm
