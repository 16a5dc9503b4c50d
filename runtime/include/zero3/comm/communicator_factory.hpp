// Picks and makes the communicator a rank's collectives go through, for the device its buffers live on:
// the one place that chooses a communicator backend (the engine asks here when its caller brings none).
#pragma once

#include <memory>
#include <optional>

#include "zero3/comm/communicator.hpp"

namespace zero3::comm {

enum class CommBackend { mpi, nccl };

struct CommunicatorOptions {
  // The backend asked for (zero3.comm.backend); nullopt: mpi where device memory is host memory, else nccl.
  std::optional<CommBackend> backend;
  // zero3.comm.desync_check (MpiCommunicatorOptions::desync_check); the nccl backend runs without it.
  bool desync_check = false;
};

// Throws ConfigError naming zero3.comm.backend when the backend cannot reach the device's buffers.
// Collective over all ranks.
std::shared_ptr<Communicator> make_communicator(const CommunicatorOptions& options, Device& device,
                                                const std::shared_ptr<Bootstrap>& bootstrap);

}  // namespace zero3::comm
