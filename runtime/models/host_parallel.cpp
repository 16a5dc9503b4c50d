#include "host_parallel.hpp"

#include <fmt/format.h>

#include <memory>

#include "zero3/core/cpus.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::par {
namespace {

// The process's CPU mask, not the machine: a rank bound to one core gets one thread, and oneTBB is never
// asked for more workers than the mask allows.
int default_threads() {
  return compute_threads(1);
}

struct Pool {
  int threads = default_threads();
  std::unique_ptr<tbb::task_arena> arena = std::make_unique<tbb::task_arena>(threads);
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_threads(int n) {
  if (n < 1) throw UsageError(fmt::format("host compute threads must be >= 1, got {}", n));
  Pool& p = pool();
  if (n == p.threads) return;
  p.arena = std::make_unique<tbb::task_arena>(n);
  p.threads = n;
}

int threads() {
  return pool().threads;
}

tbb::task_arena& arena() {
  return *pool().arena;
}

}  // namespace zero3::models::par
