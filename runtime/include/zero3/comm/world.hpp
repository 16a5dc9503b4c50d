// Who this process is among the ranks of a job: rank, world size, local rank and local size, read
// from the launcher's environment: mpirun (OMPI_COMM_WORLD_*), Hydra's mpiexec (PMI_*, MPI_LOCAL*),
// srun (SLURM_PROCID, SLURM_STEP_*), or RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE; a single process
// when none of them describes one. Inconsistent or incomplete environments are errors that name the
// variables and their values. Plain data: copy it freely, from any thread. docs/comm.md, "Launchers".
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
  // Where the values came from, for messages: "mpirun (OMPI_COMM_WORLD_*)", "srun (SLURM_PROCID, ...)",
  // "mpiexec (Hydra: ...)", "environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)", or "single
  // process (...)" saying why, e.g. "Slurm batch script, SLURM_STEP_ID='-5', which Slurm runs once".
  std::string source;
  // What the launcher left out that MPI needs to join the other ranks, or empty: an srun task of a step
  // of several whose srun gave it no PMI (srun --mpi=none). An MPI without a PMI aborts in MPI_Init with a
  // message of its own (Open MPI) or starts alone, so make_mpi_bootstrap logs this before MPI starts.
  std::string warning;

  using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
  // Reads the process environment.
  static World from_environment();
  // Reads variables through `lookup` (tests pass a map). The innermost launcher wins: mpirun, then
  // Hydra (MPI_LOCALRANKID/MPI_LOCALNRANKS set), then an srun task (SLURM_STEP_ID a normal step id), so
  // the SLURM_* a process inherits from the srun step that started mpirun's or Hydra's daemons are not
  // read. A Slurm batch script (SLURM_STEP_ID -5) or an allocation's shell is one process whatever
  // SLURM_NTASKS says. Variables that the same launcher sets for the same process must agree
  // (PMIX_RANK with mpirun's or srun's rank, PMI_RANK/PMI_SIZE with srun's, RANK/... with any).
  // Throws ConfigError naming the variables and values when a value is not a decimal integer, out of
  // range, part of a family is missing, two sources disagree, or a launcher shows several tasks
  // (PMIX_RANK, PMI_SIZE > 1, SLURM_STEP_NUM_TASKS > 1 without a step id) but no complete world is set.
  static World from_lookup(const EnvLookup& lookup);
};

}  // namespace zero3::comm
