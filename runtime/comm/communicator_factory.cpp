#include "zero3/comm/communicator_factory.hpp"

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm {

std::shared_ptr<Communicator> make_communicator(const CommunicatorOptions& options, Device& device,
                                                const std::shared_ptr<Bootstrap>& bootstrap) {
  const bool host_memory = device.caps().device_memory_on_host;
  const CommBackend backend = options.backend.value_or(host_memory ? CommBackend::mpi : CommBackend::nccl);
  if (backend == CommBackend::mpi && !host_memory) {
    throw ConfigError(
        "zero3.comm.backend: \"mpi\" takes host memory, but the engine's buffers are on the CUDA device; use \"nccl\" "
        "or \"auto\"");
  }
  // NCCL is the CUDA device's own library: it is chosen by the kind of device, not by a capability.
  if (backend == CommBackend::nccl && device.kind() != DeviceKind::cuda) {
    throw ConfigError(
        "zero3.comm.backend: \"nccl\" needs the CUDA device (zero3.device is the host); use \"mpi\" or "
        "\"auto\"");
  }
  if (backend == CommBackend::nccl) {
    if (options.desync_check) {
      log::warn(
          "zero3.comm.desync_check: the desync guard runs on the mpi backend only; the nccl communicator "
          "runs without it");
    }
    return make_nccl_communicator(bootstrap, device);
  }
  return make_mpi_communicator(bootstrap, device, {.desync_check = options.desync_check});
}

}  // namespace zero3::comm
