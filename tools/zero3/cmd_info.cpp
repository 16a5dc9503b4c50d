// `zero3 info`: what this build contains and what this machine offers (devices, NUMA topology).
#include <fmt/format.h>

#include <exception>
#include <thread>

#include "commands.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/cpus.hpp"
#include "zero3/core/version.hpp"
#include "zero3/device/device.hpp"
#include "zero3/offload/numa.hpp"

namespace zero3::tools {
namespace {

// The NUMA nodes and their CPUs as CPU offload sees them (offload::HostTopology), and this process's CPU set.
std::string topology_summary() {
  try {
    return fmt::format("{}; the process may run on {} CPU(s)", offload::HostTopology::from_system().describe(),
                       process_cpus().size());
  } catch (const std::exception& e) {
    return fmt::format("unavailable ({})", e.what());
  }
}

void run_info() {
  fmt::print("zero3 {}\n", kVersionString);
  fmt::print("backends: device host{}, comm mpi{}\n", built_with_cuda() ? " cuda" : "",
             comm::built_with_nccl() ? " nccl" : "");
  fmt::print("cuda devices: {}\n", cuda_device_count());
  fmt::print("topology: {}\n", topology_summary());
  fmt::print("std::thread::hardware_concurrency: {}\n", std::thread::hardware_concurrency());
}

}  // namespace

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Show the backends of this build and the machine's devices and topology");
  cmd->callback([] { run_info(); });
}

}  // namespace zero3::tools
