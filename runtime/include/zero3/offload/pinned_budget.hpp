// The pinned-memory budget of CPU offload: how much page-locked host memory a rank may take, checked at
// start-up against what the node has (available memory shared by the ranks on the node, and the memlock
// limit where pinning uses mlock) before anything is allocated. Pure functions over HostMemoryFacts, so
// every failure is testable with made-up numbers; read_host_memory_facts() reads the real ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zero3::offload {

struct HostMemoryFacts {
  std::uint64_t available_bytes = 0;           // MemAvailable (/proc/meminfo)
  std::uint64_t total_bytes = 0;               // MemTotal
  std::optional<std::uint64_t> memlock_limit;  // RLIMIT_MEMLOCK soft limit; nullopt: unlimited
  bool can_lock_beyond_limit = false;          // CAP_IPC_LOCK (root): mlock ignores the limit
};
// Throws zero3::Error when /proc/meminfo cannot be read. Limits of a memory cgroup (containers) are not
// folded in: MemAvailable is the whole machine's.
HostMemoryFacts read_host_memory_facts();
// Bytes the calling process may still allocate: MemAvailable (MemFree before Linux 3.14), capped by the room
// left under a cgroup v2 memory limit (/sys/fs/cgroup/memory.max less memory.current) when one is set.
// nullopt when neither can be read.
std::optional<std::uint64_t> read_allocatable_bytes();

struct PinnedRequest {
  std::uint64_t pinned_bytes = 0;    // this rank's page-locked host memory (pin_memory: true)
  std::uint64_t pageable_bytes = 0;  // this rank's pageable host memory (pin_memory: false)
  int ranks_on_node = 1;             // ranks sharing the node's memory (comm::World local size)
  bool pinning_uses_mlock = true;    // host backend: mlock; CUDA: cudaHostAlloc, not bound by RLIMIT_MEMLOCK
  std::optional<double> budget_gb;   // zero3.pinned_memory_budget_gb per rank, in GiB (2^30); nullopt = "auto"
};

struct PinnedBudget {
  std::uint64_t budget_bytes = 0;  // per rank, after resolving "auto"
  std::string source;              // "zero3.pinned_memory_budget_gb" or how auto was decided
};

// "auto": half of the available memory shared among the node's ranks, and no more than the memlock limit
// when pinning uses mlock without CAP_IPC_LOCK. An explicit budget is taken as given (ConfigError unless
// finite and > 0). UsageError when ranks_on_node < 1.
PinnedBudget resolve_pinned_budget(const PinnedRequest& request, const HostMemoryFacts& facts);

// Throws ConfigError (naming zero3.pinned_memory_budget_gb, the pin_memory keys, offload_optimizer.ratio or
// `ulimit -l`, with required vs available per rank and per node, in GiB and bytes) for the first of, in order:
//   an explicit budget > memlock limit;  an explicit budget x ranks_on_node > available;
//   (pinned + pageable) x ranks_on_node > available;  pinned_bytes > memlock limit;  pinned_bytes > budget
// (the memlock checks only when pinning uses mlock without CAP_IPC_LOCK). Returns the resolved budget
// otherwise.
PinnedBudget check_pinned_budget(const PinnedRequest& request, const HostMemoryFacts& facts);

// Largest single pinned registration: big state is pinned in chunks of at most this many bytes.
inline constexpr std::uint64_t kPinnedChunkBytes = std::uint64_t{256} << 20;

}  // namespace zero3::offload
