// The peak memory of a job, per rank: bytes by (memory kind, category) and each kind's total, as the
// engine's MemoryTracker measured them, gathered from every rank. Collective (one all-gather).
#pragma once

#include <string>

#include "zero3/comm/communicator.hpp"
#include "zero3/core/memory.hpp"

namespace zero3::train {

// A table (MiB, one column per rank, rows with a non-zero peak on some rank) on every rank.
std::string peak_memory_table(comm::Bootstrap& bootstrap, const MemoryTracker& memory);

}  // namespace zero3::train
