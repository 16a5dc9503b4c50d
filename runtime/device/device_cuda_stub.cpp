// The CUDA entry points of a build without nvcc: they say so instead of failing to link.
#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"

namespace zero3 {

std::unique_ptr<Device> make_cuda_device(int /*ordinal*/) {
  throw Error("zero3 was built without CUDA (nvcc not found at configure time): use the host device");
}
int cuda_device_count() {
  return 0;
}
bool built_with_cuda() {
  return false;
}

}  // namespace zero3
