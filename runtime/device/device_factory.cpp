#include "zero3/device/device_factory.hpp"

#include <fmt/format.h>

#include "zero3/core/error.hpp"

namespace zero3 {

std::shared_ptr<Device> make_device(const DeviceOptions& options) {
  const DeviceKind kind = options.kind.value_or(cuda_device_count() > 0 ? DeviceKind::cuda : DeviceKind::host);
  if (kind == DeviceKind::host) return make_host_device();
  const int count = cuda_device_count();
  if (count == 0) {
    throw ConfigError(fmt::format("zero3.device: \"cuda\" but {}",
                                  built_with_cuda() ? "no CUDA device is usable" : "zero3 was built without CUDA"));
  }
  return make_cuda_device(options.local_rank % count);
}

}  // namespace zero3
