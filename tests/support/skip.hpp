// Skipping a test program that cannot run here (no CUDA device, no NUMA binding, a SIMD path this CPU
// lacks): one line "SKIPPED: <reason>" on stderr and exit code 77, which ctest reports as skipped (every
// test sets SKIP_RETURN_CODE 77). Under mpirun every rank must reach the same decision, from what all ranks
// see alike, so that all of them exit 77 together; mpirun then exits 77 too.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace zero3::test {

// The exit code ctest reads as "skipped".
constexpr int kSkipExitCode = 77;

// Says why on stderr and ends the program with kSkipExitCode.
[[noreturn]] inline void skip(std::string_view reason) {
  std::fflush(stdout);
  std::fprintf(stderr, "SKIPPED: %.*s\n", static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
  std::exit(kSkipExitCode);
}

}  // namespace zero3::test
