// Catch2 entry point for tests that need a CUDA device: without one (or in a build without CUDA) the
// program says so and exits 77, which ctest reports as "Skipped" rather than passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "zero3/device/device.hpp"

int main(int argc, char** argv) {
  if (!zero3::built_with_cuda()) {
    std::printf("SKIPPED: this build has no CUDA backend\n");
    return 77;
  }
  if (zero3::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
