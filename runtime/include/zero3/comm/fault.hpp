// Test-only fault injection, so the failure handling can be exercised end to end: the environment
// variable ZERO3_FAULT="kind:rank=R:step=S[:unit=U]" is read once per process and parsed strictly (a
// malformed value is a ConfigError naming it). Each fault fires once, on its rank, at its step (optimizer
// steps done), where the runtime calls fire(). Unset: nothing is ever injected and fire() costs a load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zero3/core/env.hpp"

namespace zero3::comm::fault {

enum class Kind {
  none,
  stall,                // the rank stops itself (SIGSTOP) at the start of the step
  skip_gather,          // the rank does not issue unit U's all_gather (unit index in layout order)
  extra_micro_batch,    // the rank runs one micro-batch more in the step
  extra_collective,     // the rank issues an all_gather the others do not
  mpi_error,            // the rank's first collective of the step fails as an MPI error would
  kill_in_update,       // the rank kills itself (SIGKILL) in the middle of an NVMe-offloaded optimizer update,
                        // once the first slice's new state is on its way to the files
  stall_in_collective,  // the rank stops itself (SIGSTOP) inside its first collective of the step, once its
                        // progress says it entered it (a rank stopped from outside at a random moment)
};

struct Spec {
  Kind kind = Kind::none;
  int rank = -1;
  std::int64_t step = -1;
  std::optional<std::int64_t> unit;  // skip_gather only (required there)
};

std::string_view kind_name(Kind kind);
// "skip_gather:rank=1:step=3:unit=2" -> Spec; ConfigError naming `source` and the offending part.
Spec parse(std::string_view text, std::string_view source = env::kFault);
// The process's fault: ZERO3_FAULT, parsed on first use (ConfigError when malformed).
const Spec& active();
// True exactly once: the first call whose kind, rank, step (and unit, for skip_gather) match the active
// fault. The caller injects the fault right there.
bool fire(Kind kind, int rank, std::int64_t step, std::optional<std::int64_t> unit = std::nullopt);

}  // namespace zero3::comm::fault
