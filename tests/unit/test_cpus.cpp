// zero3/core/cpus.hpp: the process's CPU mask and the compute threads taken from it, checked against
// masks this test sets itself (sched_setaffinity on the calling thread, which sched_getaffinity(0) reads).
#include <sched.h>

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "zero3/core/cpus.hpp"

namespace {

std::vector<int> mask_of_kernel() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Restricts the calling thread to `cpus` for the scope, then restores the mask it had.
class ScopedMask {
 public:
  explicit ScopedMask(const std::vector<int>& cpus) {
    REQUIRE(sched_getaffinity(0, sizeof saved_, &saved_) == 0);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int cpu : cpus) CPU_SET(cpu, &set);
    REQUIRE(sched_setaffinity(0, sizeof set, &set) == 0);
  }
  ~ScopedMask() { sched_setaffinity(0, sizeof saved_, &saved_); }
  ScopedMask(const ScopedMask&) = delete;
  ScopedMask& operator=(const ScopedMask&) = delete;

 private:
  cpu_set_t saved_{};
};

}  // namespace

TEST_CASE("process_cpus is the kernel's CPU mask of the process") {
  const std::vector<int> cpus = zero3::process_cpus();
  CHECK(cpus == mask_of_kernel());
  CHECK(!cpus.empty());
}

TEST_CASE("compute threads divide the mask among the node's ranks, never below one") {
  const int cpus = static_cast<int>(zero3::process_cpus().size());
  CHECK(zero3::compute_threads(1) == cpus);
  CHECK(zero3::compute_threads(0) == cpus);
  CHECK(zero3::compute_threads(cpus) == 1);
  CHECK(zero3::compute_threads(cpus + 1) == 1);
  if (cpus >= 2) CHECK(zero3::compute_threads(2) == cpus / 2);
}

TEST_CASE("a mask of one CPU (a rank bound to a core) gives one thread, whatever the machine has") {
  const std::vector<int> before = zero3::process_cpus();
  {
    const ScopedMask one({before.back()});
    CHECK(zero3::process_cpus() == std::vector<int>{before.back()});
    CHECK(zero3::compute_threads(1) == 1);
    CHECK(zero3::compute_threads(4) == 1);
    // What the pools used to be sized from: the machine, not the mask.
    if (std::thread::hardware_concurrency() > 1)
      CHECK(zero3::compute_threads(1) < int(std::thread::hardware_concurrency()));
  }
  CHECK(zero3::process_cpus() == before);
}
