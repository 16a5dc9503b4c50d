// The process-wide MPI setup of an MPI test program (tests/support/mpi_main.cpp builds it before Catch
// runs and tears it down before MPI is finalized). Every rank runs the same test cases in the same
// order, so collectives in a test match up across ranks: keep each test's collectives unconditional and
// check results with CHECK (not REQUIRE) after them, so a failure on one rank cannot leave the others
// waiting in a collective.
#pragma once

#include <unistd.h>  // getpid

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/device/device.hpp"

namespace zero3::test {

struct MpiTestEnv {
  comm::World world;
  std::shared_ptr<comm::Bootstrap> bootstrap;  // declared before its users: destroyed after them
  std::unique_ptr<Device> host_device;
  std::unique_ptr<comm::Communicator> comm;  // an mpi communicator on host_device
};

// The environment of this process; only valid while tests run.
MpiTestEnv& mpi_env();

// How many ranks report failure (collective over all ranks): a test job fails when any rank failed.
inline std::uint32_t count_failed_ranks(comm::Bootstrap& bootstrap, bool failed_here) {
  const std::uint32_t mine_value = failed_here ? 1 : 0;
  std::vector<std::byte> mine(sizeof mine_value);
  std::memcpy(mine.data(), &mine_value, sizeof mine_value);
  const std::vector<std::byte> all = bootstrap.all_gather(mine);
  std::uint32_t failed = 0;
  for (std::size_t offset = 0; offset < all.size(); offset += sizeof mine_value) {
    std::uint32_t v = 0;
    std::memcpy(&v, all.data() + offset, sizeof v);
    failed += v;
  }
  return failed;
}

// A directory every rank agrees on (temp/<prefix>-<name>-<rank 0's pid>), empty (collective).
inline std::filesystem::path shared_empty_dir(comm::Bootstrap& bootstrap, const std::string& prefix,
                                              const std::string& name) {
  std::int64_t pid = ::getpid();
  std::vector<std::byte> bytes(sizeof pid);
  std::memcpy(bytes.data(), &pid, sizeof pid);
  bootstrap.broadcast(bytes, 0);
  std::memcpy(&pid, bytes.data(), sizeof pid);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "-" + name + "-" + std::to_string(pid));
  bootstrap.barrier();
  if (bootstrap.rank() == 0) std::filesystem::remove_all(dir);
  bootstrap.barrier();
  return dir;
}

}  // namespace zero3::test
