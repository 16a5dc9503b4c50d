// The pinned-memory budget: reading the node's memory facts (/proc, getrlimit) and the start-up checks that
// turn an impossible offload configuration into one ConfigError naming the numbers and the key to change.
#include "zero3/offload/pinned_budget.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "zero3/core/error.hpp"

namespace zero3::offload {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int kCapIpcLock = 14;  // linux/capability.h

constexpr std::string_view kBudgetKey = "zero3.pinned_memory_budget_gb";
constexpr std::string_view kPinKeys =
    "set pin_memory false (zero_optimization.offload_optimizer.pin_memory, zero_optimization.offload_param.pin_memory)";
constexpr std::string_view kRatioKey = "offload less (lower zero_optimization.offload_optimizer.ratio)";
constexpr std::string_view kUlimit =
    "raise the memlock limit (`ulimit -l unlimited`; memlock in /etc/security/limits.conf or the container's "
    "--ulimit memlock)";

// Sizes here come from configs and /proc: saturate rather than wrap on absurd products.
std::uint64_t mul_sat(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}
std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  return b > std::numeric_limits<std::uint64_t>::max() - a ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

// A suggested setting in GiB, rounded down so that the suggestion itself passes the check: 2 decimals, or
// 6 below 0.01 GiB (an 8 MiB memlock limit is 0.007812 GiB, not 0.00).
std::string gib_floor(std::uint64_t bytes) {
  const double gib = static_cast<double>(bytes) / kGiB;
  if (gib >= 0.01) return fmt::format("{:.2f}", std::floor(gib * 100.0) / 100.0);
  return fmt::format("{:.6f}", std::floor(gib * 1e6) / 1e6);
}

// "12.50 GiB (13421772800 bytes)"
std::string size_text(std::uint64_t bytes) {
  return fmt::format("{:.2f} GiB ({} bytes)", static_cast<double>(bytes) / kGiB, bytes);
}

bool memlock_applies(const PinnedRequest& request, const HostMemoryFacts& facts) {
  return request.pinning_uses_mlock && !facts.can_lock_beyond_limit && facts.memlock_limit.has_value();
}

std::uint64_t ranks_of(const PinnedRequest& request) {
  ZERO3_CHECK(request.ranks_on_node >= 1, "ranks_on_node must be >= 1");
  return static_cast<std::uint64_t>(request.ranks_on_node);
}

// Reads "Key:   123 kB" from /proc/meminfo; nullopt when absent.
std::optional<std::uint64_t> meminfo_bytes(const std::string& text, std::string_view key) {
  const std::string prefix = std::string(key) + ":";
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string_view line(text.data() + pos, (end == std::string::npos ? text.size() : end) - pos);
    if (line.substr(0, prefix.size()) == prefix) {
      const std::uint64_t kib = std::stoull(std::string(line.substr(prefix.size())));
      return mul_sat(kib, 1024);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return std::nullopt;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("cannot read {}", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool has_cap_ipc_lock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const std::uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
      return ((caps >> kCapIpcLock) & 1U) != 0;
    }
  }
  return false;
}

}  // namespace

HostMemoryFacts read_host_memory_facts() {
  HostMemoryFacts facts;
  const std::string meminfo = read_file("/proc/meminfo");
  const auto total = meminfo_bytes(meminfo, "MemTotal");
  if (!total) throw Error("/proc/meminfo has no MemTotal line");
  facts.total_bytes = *total;
  // MemAvailable exists since Linux 3.14; MemFree is the conservative stand-in before that.
  auto available = meminfo_bytes(meminfo, "MemAvailable");
  if (!available) available = meminfo_bytes(meminfo, "MemFree");
  facts.available_bytes = available.value_or(0);

  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    facts.memlock_limit = static_cast<std::uint64_t>(limit.rlim_cur);
  }
  facts.can_lock_beyond_limit = has_cap_ipc_lock();
  return facts;
}

std::optional<std::uint64_t> read_allocatable_bytes() {
  std::optional<std::uint64_t> bytes;
  if (std::ifstream in("/proc/meminfo"); in) {
    const std::string meminfo(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
    bytes = meminfo_bytes(meminfo, "MemAvailable");
    if (!bytes) bytes = meminfo_bytes(meminfo, "MemFree");
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::ifstream current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  std::uint64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    char* end = nullptr;
    const std::uint64_t limit = std::strtoull(max_text.c_str(), &end, 10);
    if (end != max_text.c_str() && *end == '\0') {
      const std::uint64_t room = limit > current ? limit - current : 0;
      bytes = bytes ? std::min(*bytes, room) : room;
    }
  }
  return bytes;
}

PinnedBudget resolve_pinned_budget(const PinnedRequest& request, const HostMemoryFacts& facts) {
  const std::uint64_t ranks = ranks_of(request);
  PinnedBudget budget;
  if (request.budget_gb) {
    const double gb = *request.budget_gb;
    if (!std::isfinite(gb) || gb <= 0.0) {
      throw ConfigError(fmt::format("{}: expected a number > 0 or \"auto\", got {}", kBudgetKey, gb));
    }
    const double bytes = gb * kGiB;
    budget.budget_bytes =
        bytes >= 18446744073709551615.0 ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(bytes);
    budget.source = std::string(kBudgetKey);
    return budget;
  }
  // Half of what is available leaves the other half to pageable state, activations and the OS.
  budget.budget_bytes = facts.available_bytes / 2 / ranks;
  budget.source =
      fmt::format("auto: half of the node's available {} over {} rank(s)", size_text(facts.available_bytes), ranks);
  if (memlock_applies(request, facts) && *facts.memlock_limit < budget.budget_bytes) {
    budget.budget_bytes = *facts.memlock_limit;
    budget.source = fmt::format("auto: the memlock limit (ulimit -l) {}", size_text(*facts.memlock_limit));
  }
  return budget;
}

PinnedBudget check_pinned_budget(const PinnedRequest& request, const HostMemoryFacts& facts) {
  PinnedBudget budget = resolve_pinned_budget(request, facts);
  const std::uint64_t ranks = ranks_of(request);
  const bool explicit_budget = request.budget_gb.has_value();
  const bool memlock = memlock_applies(request, facts);
  const std::uint64_t available_per_rank = facts.available_bytes / ranks;
  const std::string available_text =
      fmt::format("{} available on the node (MemAvailable), {} per rank for {} rank(s)",
                  size_text(facts.available_bytes), size_text(available_per_rank), ranks);

  // Most fundamental first: an explicit budget that cannot be honoured, then memory that does not fit at
  // all, then pinning beyond what mlock allows, then pinning beyond the budget.
  if (explicit_budget && memlock && budget.budget_bytes > *facts.memlock_limit) {
    throw ConfigError(fmt::format(
        "{} = {} asks for {} of pinned memory per rank, above the memlock limit {} (ulimit -l, per process; no "
        "CAP_IPC_LOCK); {}, or lower {} to at most {}",
        kBudgetKey, *request.budget_gb, size_text(budget.budget_bytes), size_text(*facts.memlock_limit), kUlimit,
        kBudgetKey, gib_floor(*facts.memlock_limit)));
  }
  if (explicit_budget && mul_sat(budget.budget_bytes, ranks) > facts.available_bytes) {
    throw ConfigError(fmt::format(
        "{} = {} asks for {} of pinned memory per rank x {} rank(s) on the node = {}, but only {}; lower {} to at "
        "most {} or set it to \"auto\"",
        kBudgetKey, *request.budget_gb, size_text(budget.budget_bytes), ranks,
        size_text(mul_sat(budget.budget_bytes, ranks)), available_text, kBudgetKey, gib_floor(available_per_rank)));
  }
  const std::uint64_t per_rank = add_sat(request.pinned_bytes, request.pageable_bytes);
  if (mul_sat(per_rank, ranks) > facts.available_bytes) {
    throw ConfigError(fmt::format(
        "CPU offload needs {} of host memory per rank (pinned {} + pageable {}) x {} rank(s) on the node = {}, but "
        "only {}; {}, run fewer ranks per node, or free host memory",
        size_text(per_rank), size_text(request.pinned_bytes), size_text(request.pageable_bytes), ranks,
        size_text(mul_sat(per_rank, ranks)), available_text, kRatioKey));
  }
  if (memlock && request.pinned_bytes > *facts.memlock_limit) {
    throw ConfigError(fmt::format(
        "CPU offload pins {} per rank, above the memlock limit {} (ulimit -l, per process; no CAP_IPC_LOCK); {}, "
        "{}, or {}",
        size_text(request.pinned_bytes), size_text(*facts.memlock_limit), kUlimit, kPinKeys, kRatioKey));
  }
  if (request.pinned_bytes > budget.budget_bytes) {
    throw ConfigError(fmt::format(
        "CPU offload pins {} per rank ({} for {} rank(s) on the node), above the pinned-memory budget {} per rank "
        "({} per node; {}); raise {}, {}, or {}",
        size_text(request.pinned_bytes), size_text(mul_sat(request.pinned_bytes, ranks)), ranks,
        size_text(budget.budget_bytes), size_text(mul_sat(budget.budget_bytes, ranks)), budget.source, kBudgetKey,
        kPinKeys, kRatioKey));
  }
  return budget;
}

}  // namespace zero3::offload
