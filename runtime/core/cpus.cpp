#include "zero3/core/cpus.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "zero3/core/error.hpp"

namespace zero3 {

std::vector<int> process_cpus() {
  // Grow the mask until the kernel's fits: machines with more than CPU_SETSIZE (1024) CPUs exist.
  for (int capacity = 1024; capacity <= (1 << 20); capacity *= 2) {
    cpu_set_t* set = CPU_ALLOC(capacity);
    if (set == nullptr) throw OutOfMemory("CPU_ALLOC failed");
    const std::size_t size = CPU_ALLOC_SIZE(capacity);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      std::vector<int> cpus;
      for (int cpu = 0; cpu < capacity; ++cpu) {
        if (CPU_ISSET_S(cpu, size, set)) cpus.push_back(cpu);
      }
      CPU_FREE(set);
      if (cpus.empty()) throw Error("sched_getaffinity returned an empty CPU mask");
      return cpus;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) throw Error(fmt::format("sched_getaffinity failed: {}", std::generic_category().message(err)));
  }
  throw Error("sched_getaffinity failed: CPU mask larger than 2^20 CPUs");
}

int compute_threads(int ranks_on_node) {
  const int cpus = static_cast<int>(process_cpus().size());
  return std::max(1, cpus / std::max(1, ranks_on_node));
}

}  // namespace zero3
