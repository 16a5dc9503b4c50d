// `zero3 info`: what this build contains and what this machine offers (devices, NUMA topology).
#include <fmt/format.h>
#include <hwloc.h>

#include <thread>

#include "commands.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/device/device.hpp"

namespace zero3::tools {
namespace {

std::string topology_summary() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return "unavailable (hwloc_topology_init failed)";
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return "unavailable (hwloc_topology_load failed)";
  }
  const int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  const int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  const int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  const int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  hwloc_topology_destroy(topo);
  return fmt::format("{} NUMA node(s), {} package(s), {} core(s), {} hardware thread(s)", numa, packages, cores, pus);
}

void run_info() {
  fmt::print("zero3 0.1.0\n");
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
