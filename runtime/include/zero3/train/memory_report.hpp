// The peak memory of a job, per rank: bytes by (memory kind, category) and each kind's total, as the
// engine's MemoryTracker measured them, gathered from every rank (collective: one all-gather), as a table
// or as JSON in the shape `zero3 mem plan --json` also prints:
//   {"ranks": [{"rank": 0, "peak_bytes": {"device": {"param_shard": ..., ...}, "pinned_host": {...},
//                                         "pageable_host": {...}}, "total_peak_bytes": {"device": ...}}, ...]}
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/engine/memory_plan.hpp"

namespace zero3::train {

// One rank's peaks: each category's, and each kind's total (at its own peak, not the sum).
// And the process's resident memory as the operating system counts it (zero3/core/resident.hpp): its
// high-water mark so far, and the resident size when the job began (before it allocated; 0: not known).
struct RankPeaks {
  MemoryTable peak;
  std::array<std::uint64_t, kNumMemoryKinds> total_peak{};
  std::uint64_t resident_peak = 0;
  std::uint64_t resident_base = 0;
};

RankPeaks rank_peaks(const MemoryTracker& memory, std::uint64_t resident_base = 0);
// Collective: every rank's peaks, in rank order, on every rank.
std::vector<RankPeaks> gather_peaks(comm::Bootstrap& bootstrap, const MemoryTracker& memory,
                                    std::uint64_t resident_base = 0);

// A table (MiB, one column per rank, rows with a non-zero peak on some rank).
std::string peak_memory_table(const std::vector<RankPeaks>& ranks);
// Collective: gather_peaks, then the table, on every rank.
std::string peak_memory_table(comm::Bootstrap& bootstrap, const MemoryTracker& memory);

// memory_breakdown: the phase of the step each of this rank's non-zero categories peaked in, one line each
// ("  device param_gathered     3.02 MiB  in forward blocks.1").
std::string peak_phase_lines(const MemoryTracker& memory);

// {"device": {"param_shard": bytes, ... every category}, "pinned_host": {...}, "pageable_host": {...}}.
nlohmann::json memory_table_json(const MemoryTable& table);
// {"ranks": [{"rank": r, "peak_bytes": memory_table_json(...), "total_peak_bytes": {...},
//             "resident_bytes": {"base": ..., "peak": ...}}, ...]}.
nlohmann::json peaks_json(const std::vector<RankPeaks>& ranks);
// A memory plan in the same shape (every rank's peak_bytes alike), with "how" (what each category is made
// of), "world_size", "ranks_per_node" and "deepspeed_estimate".
nlohmann::json plan_json(const MemoryPlan& plan);

}  // namespace zero3::train
