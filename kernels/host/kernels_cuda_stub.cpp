// cuda_backend() of a build without nvcc: it says so instead of failing to link.
#include "zero3/core/error.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::kernels {

const KernelBackend& cuda_backend() {
  throw Error(
      "kernels::cuda_backend(): zero3 was built without CUDA (nvcc not found at configure time, or "
      "-DZERO3_ENABLE_CUDA=OFF); use the host device");
}

}  // namespace zero3::kernels
