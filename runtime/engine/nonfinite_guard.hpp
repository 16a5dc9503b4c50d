// Non-finite optimizer steps for every dtype: where the Inf/NaN is (found only on the rare failing path,
// by a per-param scan of this rank's gradient shard, then agreed over the ranks), and the zero3.nonfinite
// policy (skip with a warning event, or abort; abort after max_consecutive skips in a row). The step's
// usual check costs nothing extra: the squared norm the step already all-reduces is non-finite whenever an
// element is. Engine thread only; locate_nonfinite() is collective over the bootstrap.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layout.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"

namespace zero3::engine {

class ShardOptimizer;  // optimizer_step.hpp

// The first non-finite gradient element in layout order (units in declaration order, their params in
// order), over all ranks.
struct NonfiniteSite {
  std::string unit;
  std::string param;
  std::uint64_t element = 0;  // flattened index in the param
  int rank = 0;               // the lowest rank holding that element's gradient
  float value = 0.0f;         // the accumulated gradient there (Inf or NaN)
};

struct NonfiniteReport {
  std::int64_t step = 0;              // the optimizer step (global, 1-based) that was not applied
  std::vector<int> grad_ranks;        // ranks whose gradient shard holds a non-finite element
  std::vector<int> loss_ranks;        // ranks that reported a non-finite loss (Engine::discard_window)
  std::uint64_t nonfinite_elems = 0;  // over all ranks (a persistent param's once per rank: each holds it)
  std::optional<NonfiniteSite> first;
  double grad_norm = 0.0;  // what the step's norm came to (Inf or NaN)
  // One line: "step 17: non-finite gradient in 'blocks.3.w1' (unit 'blocks.3', element 5, rank 1: nan); ...".
  std::string describe() const;
};

// Collective: scans this rank's accumulators (after the window's reductions, before clear_grads) and
// agrees with the other ranks on the report. Blocks the host (synchronizes `stream`).
NonfiniteReport locate_nonfinite(const Layout& layout, ShardOptimizer& optimizer, Device& device, Stream& stream,
                                 comm::Bootstrap& bootstrap, bool loss_nonfinite, std::int64_t step, double grad_norm);

// The policy. skipped() emits the warning event (rank 0; the report is the same on every rank) and throws
// NonFiniteError on every rank under "abort" or at the max_consecutive-th skip in a row; applied() ends a run
// of skips. fp16 overflows the loss scaler handles are neither: the scaler has its own end (an overflow at
// the minimum scale), and its skips at the start of a run are normal.
class NonfiniteGuard {
 public:
  NonfiniteGuard(const config::NonfiniteSettings& settings, int rank) : settings_(settings), rank_(rank) {}
  void skipped(const NonfiniteReport& report);
  void applied() { consecutive_ = 0; }
  std::int64_t consecutive() const { return consecutive_; }

 private:
  config::NonfiniteSettings settings_;
  int rank_ = 0;
  std::int64_t consecutive_ = 0;
};

}  // namespace zero3::engine
