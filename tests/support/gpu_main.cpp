// Catch2 entry point for tests that need a CUDA device: without one (or in a build without CUDA) the
// program says so and exits 77 (skip.hpp), which ctest reports as "Skipped" rather than passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.hpp"
#include "zero3/device/device.hpp"

int main(int argc, char** argv) {
  if (!zero3::built_with_cuda()) zero3::test::skip("this build has no CUDA backend");
  if (zero3::cuda_device_count() == 0) zero3::test::skip("no CUDA device visible");
  return Catch::Session().run(argc, argv);
}
