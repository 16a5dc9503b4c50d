// The pinned-memory budget over made-up host memory facts: each failure the header lists (with the key to
// change and the numbers in the message), where the memlock limit does and does not apply, the "auto" budget,
// and plausible facts read from this machine.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/offload/pinned_budget.hpp"

using namespace zero3;
using namespace zero3::offload;

namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

HostMemoryFacts facts(std::uint64_t available_gib, std::optional<std::uint64_t> memlock = std::nullopt,
                      bool cap_ipc_lock = false) {
  HostMemoryFacts f;
  f.available_bytes = available_gib * kGiB;
  f.total_bytes = f.available_bytes + 16 * kGiB;
  f.memlock_limit = memlock;
  f.can_lock_beyond_limit = cap_ipc_lock;
  return f;
}

PinnedRequest request(std::uint64_t pinned, std::uint64_t pageable, int ranks,
                      std::optional<double> budget_gb = std::nullopt) {
  PinnedRequest r;
  r.pinned_bytes = pinned;
  r.pageable_bytes = pageable;
  r.ranks_on_node = ranks;
  r.budget_gb = budget_gb;
  return r;
}

// The ConfigError's message, which must hold every one of `needles`.
void check_error(const PinnedRequest& r, const HostMemoryFacts& f, const std::vector<std::string>& needles) {
  try {
    (void)check_pinned_budget(r, f);
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    INFO(message);
    for (const std::string& needle : needles) CHECK(message.find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("pinned bytes above an explicit budget") {
  // 6 GiB pinned per rank against a 4 GiB budget; 2 ranks: 12 GiB pinned vs 8 GiB per node.
  check_error(
      request(6 * kGiB, 1 * kGiB, 2, 4.0), facts(100),
      {"zero3.pinned_memory_budget_gb", "6.00 GiB (6442450944 bytes)", "4.00 GiB (4294967296 bytes)", "12.00 GiB",
       "8.00 GiB", "2 rank(s)", "set pin_memory false", "zero_optimization.offload_optimizer.pin_memory",
       "zero_optimization.offload_param.pin_memory", "zero_optimization.offload_optimizer.ratio"});
  // Exactly at the budget is fine.
  const PinnedBudget b = check_pinned_budget(request(4 * kGiB, 0, 2, 4.0), facts(100));
  CHECK(b.budget_bytes == 4 * kGiB);
  CHECK(b.source == "zero3.pinned_memory_budget_gb");
}

TEST_CASE("an explicit budget times the node's ranks above available memory") {
  // 16 GiB x 8 ranks = 128 GiB > 100 GiB available (12.50 GiB per rank).
  check_error(request(1 * kGiB, 0, 8, 16.0), facts(100),
              {"zero3.pinned_memory_budget_gb", "16.00 GiB (17179869184 bytes)", "8 rank(s)",
               "128.00 GiB (137438953472 bytes)", "100.00 GiB (107374182400 bytes)", "12.50 GiB", "\"auto\""});
}

TEST_CASE("pinned plus pageable times the node's ranks above available memory") {
  // (10 + 20) GiB x 4 ranks = 120 GiB > 100 GiB; the auto budget (12.5 GiB) alone would be fine.
  check_error(
      request(10 * kGiB, 20 * kGiB, 4), facts(100),
      {"30.00 GiB (32212254720 bytes)", "pinned 10.00 GiB", "pageable 20.00 GiB", "4 rank(s)",
       "120.00 GiB (128849018880 bytes)", "100.00 GiB", "25.00 GiB", "zero_optimization.offload_optimizer.ratio"});
  CHECK_NOTHROW(check_pinned_budget(request(10 * kGiB, 15 * kGiB, 4), facts(100)));
}

TEST_CASE("pinned bytes above the memlock limit without CAP_IPC_LOCK") {
  const std::uint64_t memlock = 8 * kMiB;
  check_error(request(1 * kGiB, 0, 1), facts(100, memlock),
              {"1.00 GiB (1073741824 bytes)", "0.01 GiB (8388608 bytes)", "ulimit -l", "set pin_memory false",
               "zero_optimization.offload_optimizer.pin_memory"});
  SECTION("CAP_IPC_LOCK lifts the limit") {
    const PinnedBudget b = check_pinned_budget(request(1 * kGiB, 0, 1), facts(100, memlock, true));
    CHECK(b.budget_bytes == 50 * kGiB);
  }
  SECTION("CUDA pinning (cudaHostAlloc) is not bound by RLIMIT_MEMLOCK") {
    PinnedRequest r = request(1 * kGiB, 0, 1);
    r.pinning_uses_mlock = false;
    CHECK(check_pinned_budget(r, facts(100, memlock)).budget_bytes == 50 * kGiB);
  }
  SECTION("an unlimited memlock limit") {
    CHECK(check_pinned_budget(request(1 * kGiB, 0, 1), facts(100)).budget_bytes == 50 * kGiB);
  }
}

TEST_CASE("an explicit budget above the memlock limit without CAP_IPC_LOCK") {
  check_error(request(kGiB / 2, 0, 1, 2.0), facts(100, kGiB),
              {"zero3.pinned_memory_budget_gb", "2.00 GiB (2147483648 bytes)", "1.00 GiB (1073741824 bytes)",
               "ulimit -l", "at most 1.00"});
  CHECK(check_pinned_budget(request(kGiB / 2, 0, 1, 2.0), facts(100, kGiB, true)).budget_bytes == 2 * kGiB);
  PinnedRequest cuda = request(kGiB / 2, 0, 1, 2.0);
  cuda.pinning_uses_mlock = false;
  CHECK(check_pinned_budget(cuda, facts(100, kGiB)).budget_bytes == 2 * kGiB);
}

TEST_CASE("auto budget: half of the available memory over the node's ranks, capped by memlock") {
  const PinnedRequest r = request(0, 0, 4);
  const PinnedBudget plain = resolve_pinned_budget(r, facts(64));
  CHECK(plain.budget_bytes == 8 * kGiB);
  CHECK(plain.source.find("auto") != std::string::npos);

  const PinnedBudget capped = resolve_pinned_budget(r, facts(64, 4 * kGiB));
  CHECK(capped.budget_bytes == 4 * kGiB);
  CHECK(capped.source.find("memlock") != std::string::npos);

  CHECK(resolve_pinned_budget(r, facts(64, 16 * kGiB)).budget_bytes == 8 * kGiB);  // limit above the share
  CHECK(resolve_pinned_budget(r, facts(64, 4 * kGiB, true)).budget_bytes == 8 * kGiB);
  PinnedRequest cuda = r;
  cuda.pinning_uses_mlock = false;
  CHECK(resolve_pinned_budget(cuda, facts(64, 4 * kGiB)).budget_bytes == 8 * kGiB);

  // An explicit budget is taken as given (GiB per rank).
  CHECK(resolve_pinned_budget(request(0, 0, 4, 1.5), facts(64)).budget_bytes == 3 * kGiB / 2);
}

TEST_CASE("an auto budget capped by memlock names the limit when pinned bytes exceed it") {
  // Pinned above both the memlock limit and so the auto budget: the memlock message, which says what to do.
  check_error(request(5 * kGiB, 0, 4), facts(64, 4 * kGiB), {"ulimit -l", "4.00 GiB (4294967296 bytes)", "5.00 GiB"});
  // Pinned above the auto budget (half of available over ranks) with no limit.
  check_error(request(9 * kGiB, 0, 4), facts(64),
              {"9.00 GiB", "8.00 GiB", "auto", "zero3.pinned_memory_budget_gb", "set pin_memory false"});
}

TEST_CASE("an explicit budget must be positive") {
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    CHECK_THROWS_AS(resolve_pinned_budget(request(0, 0, 1, bad), facts(64)), ConfigError);
  }
}

TEST_CASE("host memory facts of this machine are plausible") {
  const HostMemoryFacts f = read_host_memory_facts();
  CHECK(f.total_bytes > 0);
  CHECK(f.available_bytes > 0);
  CHECK(f.available_bytes <= f.total_bytes);
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_MEMLOCK, &limit) == 0);
  if (limit.rlim_cur == RLIM_INFINITY) {
    CHECK_FALSE(f.memlock_limit.has_value());
  } else {
    CHECK(f.memlock_limit == static_cast<std::uint64_t>(limit.rlim_cur));
  }
  // A default request fits the machine it runs on.
  CHECK_NOTHROW(check_pinned_budget(PinnedRequest{}, f));
  // What this process may allocate: some memory, no more than the machine has.
  const std::optional<std::uint64_t> allocatable = read_allocatable_bytes();
  REQUIRE(allocatable.has_value());
  CHECK(*allocatable > 0);
  CHECK(*allocatable <= f.total_bytes);
}
