// Who this process is among the ranks of a job: rank, world size, local rank and local size, read
// from Open MPI's environment (mpirun), from RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (torchrun
// style), or a single process when neither is set. Inconsistent environments are errors that name
// the variables and their values. Plain data: copy it freely, from any thread.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace zero3::comm {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // Where the values came from, for messages: "mpirun (OMPI_COMM_WORLD_*)", "environment
  // (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)" or "single process (no launcher variables)".
  std::string source;

  using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
  // Reads the process environment.
  static World from_environment();
  // Reads variables through `lookup` (tests pass a map). A family of variables is used only when all
  // four of its variables are set; when both families are set they must agree. Throws ConfigError
  // naming the variables and values when a value is not a decimal integer, out of range (rank >= size,
  // negative, local_rank >= local_size, local_size > size), only part of a family is set, or the two
  // families disagree.
  static World from_lookup(const EnvLookup& lookup);
};

}  // namespace zero3::comm
