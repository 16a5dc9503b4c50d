// The NCCL entry points of a build without CUDA: they say so instead of failing to link.
#include "zero3/comm/communicator.hpp"
#include "zero3/core/error.hpp"

namespace zero3::comm {

// NOLINTNEXTLINE(performance-unnecessary-value-param): the signature of the real backend, which keeps it
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Bootstrap> /*bootstrap*/, Device& /*device*/) {
  throw Error(
      "zero3 was built without CUDA (nvcc not found at configure time), so it has no NCCL communicator: use "
      "make_mpi_communicator with host buffers");
}

bool built_with_nccl() {
  return false;
}

}  // namespace zero3::comm
