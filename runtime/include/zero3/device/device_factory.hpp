// Picks and makes the device a rank runs on, from what the build and the machine offer: the one place
// that chooses a device backend (the engine asks here when its caller brings no device of its own).
#pragma once

#include <memory>
#include <optional>

#include "zero3/device/device.hpp"

namespace zero3 {

struct DeviceOptions {
  // The backend asked for (zero3.device); nullopt: cuda when a CUDA device is usable, else host.
  std::optional<DeviceKind> kind;
  // The rank's index on its node: ranks share a node's CUDA devices round-robin.
  int local_rank = 0;
};

// Throws ConfigError naming zero3.device when cuda is asked for and no CUDA device is usable (or the build
// has no CUDA backend).
std::shared_ptr<Device> make_device(const DeviceOptions& options);

}  // namespace zero3
