// This process's resident memory as the operating system counts it (Linux: /proc/self/status), for holding the
// memory plan against what a job really occupies: the resident set now (VmRSS) and its high-water mark since the
// process started (VmHWM, what getrusage's ru_maxrss reports). nullopt where the system does not say.
#pragma once

#include <cstdint>
#include <optional>

namespace zero3 {

std::optional<std::uint64_t> resident_bytes();
std::optional<std::uint64_t> resident_peak_bytes();

}  // namespace zero3
