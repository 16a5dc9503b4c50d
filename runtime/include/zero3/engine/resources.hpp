// Optional pieces a trainer can hand the Engine instead of letting it make them from the config.
#pragma once

#include <memory>

namespace zero3 {

class Device;  // zero3/device/device.hpp
namespace comm {
class Bootstrap;  // zero3/comm/communicator.hpp
class Communicator;
}  // namespace comm

struct EngineResources {
  std::shared_ptr<Device> device;
  std::shared_ptr<comm::Bootstrap> bootstrap;
  std::shared_ptr<comm::Communicator> communicator;  // on `device`; needs `bootstrap` too
};

}  // namespace zero3
