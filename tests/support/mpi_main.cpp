// Entry point of MPI-launched test programs (ctest runs `mpirun -np N test_x`): initializes MPI through
// zero3's bootstrap, runs the Catch session on every rank, and returns non-zero when any test failed on
// ANY rank, so mpirun's exit status is meaningful. Everything that holds MPI is destroyed before the
// bootstrap, whose release finalizes MPI. When ZERO3_TEST_DEVICE asks for a CUDA device and none is usable,
// the program exits 77 (skip.hpp: ctest reports it as skipped) on every rank before starting MPI.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "device_staging.hpp"
#include "mpi_test_env.hpp"
#include "skip.hpp"
#include "zero3/core/log.hpp"

namespace zero3::test {
namespace {
MpiTestEnv* g_env = nullptr;
}
MpiTestEnv& mpi_env() {
  if (g_env == nullptr) throw Error("mpi_env() used outside the test session");
  return *g_env;
}
}  // namespace zero3::test

int main(int argc, char** argv) {
  using namespace zero3;
  try {
    // Every rank reads the same environment and devices, so all of them skip together (mpirun exits 77).
    if (test::test_device_unavailable()) {
      test::skip(built_with_cuda() ? "ZERO3_TEST_DEVICE=cuda, but no CUDA device is usable"
                                   : "ZERO3_TEST_DEVICE=cuda, but zero3 was built without CUDA");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  test::MpiTestEnv env;
  try {
    env.world = comm::World::from_environment();
    log::set_rank(env.world.rank, env.world.size);
    env.bootstrap = comm::make_mpi_bootstrap(env.world);
    env.host_device = make_host_device();
    env.comm = comm::make_mpi_communicator(env.bootstrap, *env.host_device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "MPI test set-up failed: %s\n", e.what());
    return 2;
  }
  test::g_env = &env;
  const int catch_status = Catch::Session().run(argc, argv);
  test::g_env = nullptr;

  std::uint32_t failed_ranks = 1;
  try {
    failed_ranks = test::count_failed_ranks(*env.bootstrap, catch_status != 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collecting the test verdicts failed: %s\n", e.what());
  }
  if (failed_ranks != 0 && env.world.rank == 0) {
    std::fprintf(stderr, "%u of %d ranks had failing tests\n", failed_ranks, env.world.size);
  }
  env.comm.reset();
  env.host_device.reset();
  env.bootstrap.reset();  // the last MPI holder: finalizes MPI
  return failed_ranks != 0 ? 1 : 0;
}
