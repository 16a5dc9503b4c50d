// The host models' thread pool: one oneTBB arena whose size the trainer sets to its rank's share of the
// cores (set_threads), and loops over fixed chunks of an index range. The chunk bounds depend only on the
// range and the chunk size, never on the thread count, so a loop whose chunks write disjoint outputs
// (or whose per-chunk partials are folded in chunk order) gives the same bits on 1 thread as on 16.
// set_threads must not race with running loops; the loops may be called from any thread.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstddef>

// oneTBB's own library is not built with ThreadSanitizer, which then reports its workers' writes as
// races; under TSan the loops run their chunks in order on the calling thread (the same results).
#if defined(__SANITIZE_THREAD__)
#define ZERO3_MODELS_USE_TBB 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZERO3_MODELS_USE_TBB 0
#endif
#endif
#ifndef ZERO3_MODELS_USE_TBB
#define ZERO3_MODELS_USE_TBB 1
#endif

namespace zero3::models::par {

using Index = std::size_t;

// The arena's concurrency (>= 1; the calling thread counts as one). Before the first call: the machine's
// core count. Throws UsageError for n < 1.
void set_threads(int n);
int threads();
tbb::task_arena& arena();

inline Index num_chunks(Index n, Index chunk) {
  return chunk == 0 ? 0 : (n + chunk - 1) / chunk;
}

// fn(c, begin, end) for each chunk c = [c * chunk, min(n, (c + 1) * chunk)) of [0, n), in parallel on the
// arena when there are two chunks or more and more than one thread. fn must write only what its chunk owns.
template <typename Fn>
void for_chunks(Index n, Index chunk, const Fn& fn) {
  const Index chunks = num_chunks(n, chunk);
  auto run = [&](Index c) { fn(c, c * chunk, std::min(n, (c + 1) * chunk)); };
  if (!ZERO3_MODELS_USE_TBB || chunks < 2 || threads() < 2) {
    for (Index c = 0; c < chunks; ++c) run(c);
    return;
  }
  arena().execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<Index>(0, chunks, 1),
        [&](const tbb::blocked_range<Index>& r) {
          for (Index c = r.begin(); c != r.end(); ++c) run(c);
        },
        tbb::simple_partitioner());
  });
}

}  // namespace zero3::models::par
