// World::from_lookup over maps: the launcher families, their agreement, and every inconsistency the
// environment can hold, each an error naming the variables and values. The Slurm, PMIx and Hydra
// environments are what those launchers set (Slurm's env.c and srun(1), Hydra's proxy), written out
// by hand here, not taken from the code under test.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "zero3/comm/world.hpp"
#include "zero3/core/error.hpp"

using Catch::Matchers::Contains;
using zero3::ConfigError;
using zero3::comm::World;
using Env = std::map<std::string, std::string>;

namespace {

World from(const Env& env) {
  return World::from_lookup([&](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

Env ompi(const std::string& rank, const std::string& size, const std::string& local_rank,
         const std::string& local_size) {
  return {{"OMPI_COMM_WORLD_RANK", rank},
          {"OMPI_COMM_WORLD_SIZE", size},
          {"OMPI_COMM_WORLD_LOCAL_RANK", local_rank},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", local_size}};
}

Env generic(const std::string& rank, const std::string& size, const std::string& local_rank,
            const std::string& local_size) {
  return {{"RANK", rank}, {"WORLD_SIZE", size}, {"LOCAL_RANK", local_rank}, {"LOCAL_WORLD_SIZE", local_size}};
}

Env merge(Env a, const Env& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// b's values replace a's.
Env overlay(Env a, const Env& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

Env without(Env a, const std::string& name) {
  a.erase(name);
  return a;
}

// What a task of an srun step sees: srun's step variables, slurmstepd's per-task ones, and the job's.
Env srun_task(int rank, int size, int local_rank, int node, const std::string& tasks_per_node, int nodes) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_JOBID", "4242"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_STEPID", "3"},
          {"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_LOCALID", std::to_string(local_rank)},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(size)},
          {"SLURM_STEP_NUM_NODES", std::to_string(nodes)},
          {"SLURM_STEP_TASKS_PER_NODE", tasks_per_node},
          {"SLURM_NTASKS", std::to_string(size)},
          {"SLURM_NPROCS", std::to_string(size)},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_TASKS_PER_NODE", tasks_per_node},
          {"SLURM_STEP_NODELIST", "node[01-04]"},
          {"SLURM_CPUS_ON_NODE", "16"}};
}

// The batch script of `sbatch -N2 -n8`: slurmstepd starts it as the one task of the batch step, whose
// id it prints as -5 (SLURM_BATCH_SCRIPT, 0xfffffffb, through %d).
Env sbatch_script() {
  return {{"SLURM_JOB_ID", "4242"},     {"SLURM_JOBID", "4242"},
          {"SLURM_STEP_ID", "-5"},      {"SLURM_STEPID", "-5"},
          {"SLURM_PROCID", "0"},        {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "0"},        {"SLURM_NTASKS", "8"},
          {"SLURM_NPROCS", "8"},        {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_CPUS_ON_NODE", "16"}, {"SLURM_JOB_CPUS_PER_NODE", "16(x2)"},
          {"ENVIRONMENT", "BATCH"}};
}

}  // namespace

TEST_CASE("no launcher variables: a single process") {
  const World w = from({{"PATH", "/usr/bin"}});
  CHECK(w.rank == 0);
  CHECK(w.size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.local_size == 1);
  CHECK_THAT(w.source, Contains("single process"));
}

TEST_CASE("Open MPI's variables") {
  const World w = from(ompi("5", "8", "1", "4"));
  CHECK(w.rank == 5);
  CHECK(w.size == 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 4);
  CHECK_THAT(w.source, Contains("mpirun"));
}

TEST_CASE("torchrun-style variables") {
  const World w = from(generic("2", "3", "2", "3"));
  CHECK(w.rank == 2);
  CHECK(w.size == 3);
  CHECK(w.local_rank == 2);
  CHECK(w.local_size == 3);
  CHECK_THAT(w.source, Contains("RANK, WORLD_SIZE"));
}

TEST_CASE("both families present and agreeing: mpirun wins the label") {
  const World w = from(merge(ompi("1", "2", "1", "2"), generic("1", "2", "1", "2")));
  CHECK(w.rank == 1);
  CHECK(w.size == 2);
  CHECK_THAT(w.source, Contains("mpirun"));
}

TEST_CASE("both families present and disagreeing") {
  const Env env = merge(ompi("1", "2", "1", "2"), generic("0", "2", "0", "2"));
  CHECK_THROWS_AS(from(env), ConfigError);
  CHECK_THROWS_WITH(from(env), Contains("OMPI_COMM_WORLD_RANK=1 but RANK=0") &&
                                   Contains("OMPI_COMM_WORLD_LOCAL_RANK=1 but LOCAL_RANK=0") &&
                                   !Contains("WORLD_SIZE=2 but"));
}

TEST_CASE("rank out of range") {
  CHECK_THROWS_WITH(from(generic("4", "4", "0", "1")), Contains("RANK=4") && Contains("WORLD_SIZE=4"));
  CHECK_THROWS_WITH(from(generic("-1", "4", "0", "1")), Contains("RANK=-1"));
  CHECK_THROWS_WITH(from(ompi("7", "2", "0", "1")), Contains("OMPI_COMM_WORLD_RANK=7"));
}

TEST_CASE("sizes below one") {
  CHECK_THROWS_WITH(from(generic("0", "0", "0", "1")), Contains("WORLD_SIZE=0") && Contains("at least 1"));
  CHECK_THROWS_WITH(from(generic("0", "2", "0", "0")), Contains("LOCAL_WORLD_SIZE=0"));
}

TEST_CASE("local rank out of range, local size above size") {
  CHECK_THROWS_WITH(from(generic("1", "4", "2", "2")), Contains("LOCAL_RANK=2") && Contains("LOCAL_WORLD_SIZE=2"));
  CHECK_THROWS_WITH(from(ompi("0", "2", "-3", "2")), Contains("OMPI_COMM_WORLD_LOCAL_RANK=-3"));
  CHECK_THROWS_WITH(from(generic("0", "2", "0", "3")), Contains("LOCAL_WORLD_SIZE=3") && Contains("WORLD_SIZE=2"));
}

TEST_CASE("values that are not decimal integers") {
  for (const std::string bad : {"abc", "", "1.5", " 1", "1 ", "+1", "0x2", "99999999999999999999"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_AS(from(generic(bad, "4", "0", "1")), ConfigError);
    CHECK_THROWS_WITH(from(generic("0", bad, "0", "1")),
                      Contains("WORLD_SIZE='" + bad + "'") && Contains("not a decimal integer"));
  }
}

TEST_CASE("only some variables of a family set") {
  CHECK_THROWS_WITH(from({{"RANK", "0"}}), Contains("RANK='0'") && Contains("WORLD_SIZE unset") &&
                                               Contains("LOCAL_RANK unset") && Contains("LOCAL_WORLD_SIZE unset"));
  CHECK_THROWS_WITH(from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), Contains("incomplete") && Contains("LOCAL_RANK unset"));
  CHECK_THROWS_WITH(from({{"OMPI_COMM_WORLD_SIZE", "2"}}), Contains("OMPI_COMM_WORLD_RANK unset"));
  // Even when the other family is complete, a partial one is a mistake worth reporting.
  CHECK_THROWS_AS(from(merge(ompi("0", "1", "0", "1"), {{"LOCAL_RANK", "0"}})), ConfigError);
}

TEST_CASE("from_environment reads the process environment") {
  // ctest runs unit tests without a launcher, so this is either a single process or a consistent world.
  const World w = World::from_environment();
  CHECK(w.size >= 1);
  CHECK(w.rank < w.size);
  CHECK(w.local_rank < w.local_size);
}

// ---------------------------------------------------------------- srun

TEST_CASE("srun on one node: every task of srun -n 4") {
  for (int rank = 0; rank < 4; ++rank) {
    INFO("task " << rank);
    const World w = from(srun_task(rank, 4, rank, 0, "4", 1));
    CHECK(w.rank == rank);
    CHECK(w.size == 4);
    CHECK(w.local_rank == rank);
    CHECK(w.local_size == 4);
    CHECK_THAT(w.source, Contains("srun") && Contains("SLURM_PROCID") && Contains("SLURM_STEP_TASKS_PER_NODE='4'"));
  }
}

TEST_CASE("srun over four nodes with a compressed tasks-per-node list") {
  // srun -N4 -n7, block distribution: Slurm writes the counts {2, 2, 2, 1} as "2(x3),1".
  const std::vector<int> per_node{2, 2, 2, 1};
  int rank = 0;
  for (int node = 0; node < 4; ++node) {
    for (int local = 0; local < per_node[static_cast<std::size_t>(node)]; ++local, ++rank) {
      INFO("task " << rank << " on node " << node);
      const World w = from(srun_task(rank, 7, local, node, "2(x3),1", 4));
      CHECK(w.rank == rank);
      CHECK(w.size == 7);
      CHECK(w.local_rank == local);
      CHECK(w.local_size == per_node[static_cast<std::size_t>(node)]);
    }
  }
  CHECK(rank == 7);
  // A list that starts with the odd node: "1,3(x2)" is {1, 3, 3}.
  const World last = from(srun_task(6, 7, 2, 2, "1,3(x2)", 3));
  CHECK(last.local_size == 3);
  CHECK(last.local_rank == 2);
  const World first = from(srun_task(0, 7, 0, 0, "1,3(x2)", 3));
  CHECK(first.local_size == 1);
}

TEST_CASE("srun with a cyclic distribution: ranks alternate nodes, local ids count per node") {
  // srun -N2 -n5 -m cyclic: node 0 holds tasks 0, 2, 4 and node 1 holds 1, 3; SLURM_STEP_TASKS_PER_NODE=3,2.
  const World w = from(srun_task(3, 5, 1, 1, "3,2", 2));
  CHECK(w.rank == 3);
  CHECK(w.size == 5);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 2);
  CHECK(from(srun_task(4, 5, 2, 0, "3,2", 2)).local_size == 3);
}

TEST_CASE("srun --preserve-env: SLURM_NTASKS keeps the allocation's count, the step's is SLURM_STEP_NUM_TASKS") {
  const Env env = overlay(srun_task(1, 2, 1, 0, "2", 1), {{"SLURM_NTASKS", "8"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}});
  const World w = from(env);
  CHECK(w.size == 2);
  CHECK(w.local_size == 2);
}

TEST_CASE("srun task with only the older SLURM_STEPID") {
  const World w = from(without(srun_task(1, 2, 1, 0, "2", 1), "SLURM_STEP_ID"));
  CHECK(w.rank == 1);
  CHECK(w.size == 2);
}

TEST_CASE("srun task that was given torchrun-style variables too") {
  const Env task = srun_task(5, 8, 1, 1, "4(x2)", 2);
  const World agree = from(merge(task, generic("5", "8", "1", "4")));
  CHECK(agree.rank == 5);
  CHECK_THAT(agree.source, Contains("srun"));
  // WORLD_SIZE exported in the batch script and inherited by every task, RANK set once for all of them.
  CHECK_THROWS_WITH(from(merge(task, generic("0", "8", "0", "4"))), Contains("SLURM_PROCID=5 but RANK=0") &&
                                                                        Contains("SLURM_LOCALID=1 but LOCAL_RANK=0") &&
                                                                        Contains("when starting with srun"));
  CHECK_THROWS_WITH(from(merge(task, generic("5", "8", "1", "8"))),
                    Contains("SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID=1]=4 but LOCAL_WORLD_SIZE=8"));
}

// ---------------------------------------------------------------- sbatch, salloc: Slurm without srun

TEST_CASE("sbatch batch script without srun: one process, not the 8 tasks of the allocation") {
  const World w = from(sbatch_script());
  CHECK(w.rank == 0);
  CHECK(w.size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.local_size == 1);
  CHECK_THAT(w.source, Contains("single process") && Contains("batch script") && Contains("SLURM_STEP_ID='-5'") &&
                           Contains("SLURM_NTASKS='8'"));
  // The same id printed unsigned (0xfffffffb), as some Slurm versions do.
  CHECK(from(overlay(sbatch_script(), {{"SLURM_STEP_ID", "4294967291"}, {"SLURM_STEPID", "4294967291"}})).size == 1);
}

TEST_CASE("sbatch submitted from inside an srun step: inherited step variables do not make it a task") {
  // sbatch exports the submitter's environment; slurmstepd then sets the batch step's own id.
  const Env env =
      overlay(sbatch_script(),
              {{"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}, {"SLURM_STEP_NUM_NODES", "2"}});
  const World w = from(env);
  CHECK(w.size == 1);
  CHECK_THAT(w.source, Contains("batch script"));
}

TEST_CASE("salloc's interactive step and the allocation's shell are single processes") {
  Env interactive = overlay(sbatch_script(), {{"SLURM_STEP_ID", "-6"},
                                              {"SLURM_STEPID", "-6"},
                                              {"SLURM_STEP_NUM_TASKS", "1"},
                                              {"SLURM_STEP_TASKS_PER_NODE", "1"}});
  const World i = from(interactive);
  CHECK(i.size == 1);
  CHECK_THAT(i.source, Contains("interactive step"));
  // salloc -n 8 on the login node: job variables only, no task variables.
  const World shell = from({{"SLURM_JOB_ID", "4242"}, {"SLURM_NTASKS", "8"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}});
  CHECK(shell.size == 1);
  CHECK_THAT(shell.source, Contains("not started by srun") && Contains("SLURM_JOB_ID='4242'"));
  // A batch script of a Slurm that set no step id for it (SLURM_PROCID=0 and the job's SLURM_NTASKS).
  const World old_batch = from(without(without(sbatch_script(), "SLURM_STEP_ID"), "SLURM_STEPID"));
  CHECK(old_batch.size == 1);
}

TEST_CASE("torchrun-style variables in a batch script are the world") {
  const World w = from(merge(sbatch_script(), generic("0", "1", "0", "1")));
  CHECK(w.size == 1);
  CHECK_THAT(w.source, Contains("RANK, WORLD_SIZE"));
}

// ---------------------------------------------------------------- mpirun inside an allocation

TEST_CASE("mpirun inside a Slurm allocation: Open MPI's variables win over the inherited SLURM_*") {
  // On the first node mpirun runs in the batch script; its processes inherit the batch step.
  const Env node0 = merge(merge(ompi("1", "8", "1", "4"), {{"PMIX_RANK", "1"}}), sbatch_script());
  const World w0 = from(node0);
  CHECK(w0.rank == 1);
  CHECK(w0.size == 8);
  CHECK(w0.local_size == 4);
  CHECK_THAT(w0.source, Contains("mpirun"));
  // On the second node the processes descend from an orted that mpirun started with `srun -N1 -n1`
  // (MpiDefault=pmi2 gave it PMI_RANK/PMI_SIZE); mpirun's PMIx server set PMIX_RANK for each process.
  const Env daemon_step = merge(srun_task(0, 1, 0, 0, "1", 1), {{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}});
  const World w1 = from(merge(merge(ompi("5", "8", "1", "4"), {{"PMIX_RANK", "5"}}), daemon_step));
  CHECK(w1.rank == 5);
  CHECK(w1.size == 8);
  CHECK(w1.local_rank == 1);
  // Whatever the inherited Slurm variables hold, they are not read.
  CHECK(from(merge(ompi("5", "8", "1", "4"), without(daemon_step, "SLURM_LOCALID"))).rank == 5);
}

TEST_CASE("mpirun's PMIX_RANK must be its OMPI_COMM_WORLD_RANK") {
  CHECK_THROWS_AS(from(merge(ompi("5", "8", "1", "4"), {{"PMIX_RANK", "3"}})), ConfigError);
  CHECK_THROWS_WITH(from(merge(ompi("5", "8", "1", "4"), {{"PMIX_RANK", "3"}})),
                    Contains("PMIX_RANK=3 but OMPI_COMM_WORLD_RANK=5") && Contains("mpirun"));
}

// ---------------------------------------------------------------- PMIx, PMI

TEST_CASE("srun --mpi=pmix: PMIX_RANK agrees with SLURM_PROCID") {
  const Env task =
      merge(srun_task(6, 8, 2, 1, "4(x2)", 2), {{"PMIX_RANK", "6"}, {"PMIX_NAMESPACE", "slurm.pmix.4242.3"}});
  const World w = from(task);
  CHECK(w.rank == 6);
  CHECK(w.local_rank == 2);
  CHECK(w.local_size == 4);
  CHECK_THROWS_WITH(from(overlay(task, {{"PMIX_RANK", "2"}})),
                    Contains("PMIX_RANK=2 but SLURM_PROCID=6") && Contains("srun"));
}

TEST_CASE("PMIX_RANK with no world size is refused") {
  CHECK_THROWS_AS(from({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "prterun-host-123@1"}}), ConfigError);
  CHECK_THROWS_WITH(
      from({{"PMIX_RANK", "3"}, {"PMIX_NAMESPACE", "prterun-host-123@1"}}),
      Contains("refusing to start as a single process") && Contains("PMIX_RANK=3") && Contains("mpirun or srun"));
  // A batch script says nothing about a PMIx launch.
  CHECK_THROWS_WITH(from(merge(sbatch_script(), {{"PMIX_RANK", "2"}})), Contains("PMIX_RANK=2"));
}

TEST_CASE("srun --mpi=pmi2: PMI_RANK and PMI_SIZE agree with the step") {
  const Env task = merge(srun_task(2, 4, 0, 1, "2(x2)", 2), {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"PMI_FD", "7"}});
  const World w = from(task);
  CHECK(w.rank == 2);
  CHECK(w.size == 4);
  CHECK(w.local_size == 2);
  CHECK_THROWS_WITH(from(overlay(task, {{"PMI_SIZE", "8"}})), Contains("PMI_SIZE=8 but SLURM_STEP_NUM_TASKS=4"));
}

TEST_CASE("srun --mpi=none: the world is read, with a warning that names the PMI variables and --mpi=pmix") {
  const World w = from(srun_task(1, 2, 1, 0, "2", 1));
  CHECK(w.rank == 1);
  CHECK(w.size == 2);
  CHECK_THAT(w.warning, Contains("rank 1 of 2 (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2) without a PMI") &&
                            Contains("PMIX_RANK, PMI_RANK, PMI_FD are unset") && Contains("srun --mpi=pmix"));
  // A PMI of any kind, or a step of one task, needs no warning.
  CHECK(from(merge(srun_task(1, 2, 1, 0, "2", 1), {{"PMIX_RANK", "1"}})).warning.empty());
  CHECK(from(merge(srun_task(1, 2, 1, 0, "2", 1), {{"PMI_FD", "7"}})).warning.empty());
  CHECK(from(srun_task(0, 1, 0, 0, "1", 1)).warning.empty());
  CHECK(from(ompi("1", "2", "1", "2")).warning.empty());
}

TEST_CASE("PMI_RANK and PMI_SIZE alone: one task is a single process, more are refused") {
  CHECK(from({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}).size == 1);
  CHECK_THROWS_WITH(from({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}}),
                    Contains("refusing") && Contains("PMI_RANK=1") && Contains("PMI_SIZE=4"));
  CHECK_THROWS_WITH(from({{"PMI_RANK", "0"}}), Contains("refusing") && Contains("PMI_RANK=0"));
  CHECK_THROWS_WITH(from({{"PMI_SIZE", "x"}}), Contains("PMI_SIZE='x'") && Contains("not a decimal integer"));
}

// ---------------------------------------------------------------- Hydra

namespace {

Env hydra(const std::string& rank, const std::string& size, const std::string& local_rank,
          const std::string& local_size) {
  return {{"PMI_RANK", rank},
          {"PMI_SIZE", size},
          {"PMI_FD", "6"},
          {"MPI_LOCALRANKID", local_rank},
          {"MPI_LOCALNRANKS", local_size}};
}

}  // namespace

TEST_CASE("MPICH's Hydra mpiexec") {
  const World w = from(hydra("3", "4", "1", "2"));
  CHECK(w.rank == 3);
  CHECK(w.size == 4);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 2);
  CHECK_THAT(w.source, Contains("Hydra"));
  CHECK_THROWS_WITH(from(hydra("3", "4", "2", "2")), Contains("MPI_LOCALRANKID=2") && Contains("MPI_LOCALNRANKS=2"));
}

TEST_CASE("Hydra inside an allocation: its proxies' srun step and PMIx rank are not read") {
  // mpiexec starts one hydra_pmi_proxy per node with srun; the MPI processes inherit the proxy's step.
  const Env proxy = merge(srun_task(1, 2, 0, 1, "1(x2)", 2), {{"PMIX_RANK", "1"}});
  const World w = from(merge(hydra("6", "8", "2", "4"), proxy));
  CHECK(w.rank == 6);
  CHECK(w.size == 8);
  CHECK(w.local_size == 4);
  CHECK_THAT(w.source, Contains("Hydra"));
}

TEST_CASE("Hydra with -pmi-port gives no world size: refused, naming what is missing") {
  const Env env{{"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}, {"PMI_ID", "3"}, {"PMI_PORT", "host:4000"}};
  CHECK_THROWS_WITH(from(env), Contains("PMI_RANK unset") && Contains("PMI_SIZE unset") &&
                                   Contains("MPI_LOCALNRANKS='2'") && Contains("-pmi-port"));
}

// ---------------------------------------------------------------- ambiguous and incomplete Slurm environments

TEST_CASE("an srun task with a task variable missing is refused, naming every variable") {
  const Env task = srun_task(3, 8, 3, 0, "4(x2)", 2);
  for (const std::string missing :
       {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE"}) {
    INFO("without " << missing);
    CHECK_THROWS_AS(from(without(task, missing)), ConfigError);
    CHECK_THROWS_WITH(from(without(task, missing)), Contains("incomplete srun environment") &&
                                                        Contains("SLURM_STEP_ID='3'") && Contains(missing + " unset"));
  }
  CHECK_THROWS_WITH(from(without(task, "SLURM_LOCALID")),
                    Contains("SLURM_PROCID='3'") && Contains("SLURM_STEP_TASKS_PER_NODE='4(x2)'"));
}

TEST_CASE("srun step variables without a step id are refused when they show several tasks") {
  const Env env = without(without(srun_task(3, 8, 3, 0, "4(x2)", 2), "SLURM_STEP_ID"), "SLURM_STEPID");
  CHECK_THROWS_WITH(from(env), Contains("refusing") && Contains("SLURM_STEP_NUM_TASKS='8'") &&
                                   Contains("SLURM_STEP_ID and SLURM_STEPID are unset"));
  // One task: nothing to be confused about.
  const Env one = without(without(srun_task(0, 1, 0, 0, "1", 1), "SLURM_STEP_ID"), "SLURM_STEPID");
  CHECK(from(one).size == 1);
}

TEST_CASE("srun variables that contradict each other") {
  // The list adds up to 7 tasks, the step has 8.
  CHECK_THROWS_WITH(from(srun_task(0, 8, 0, 0, "2(x3),1", 4)),
                    Contains("SLURM_STEP_TASKS_PER_NODE='2(x3),1' adds up to 7") && Contains("SLURM_STEP_NUM_TASKS=8"));
  // Node 4 of a list of four nodes.
  CHECK_THROWS_WITH(from(srun_task(6, 7, 0, 4, "2(x3),1", 4)), Contains("SLURM_NODEID=4") && Contains("[0, 4)"));
  CHECK_THROWS_WITH(from(srun_task(6, 7, 0, -1, "2(x3),1", 4)), Contains("SLURM_NODEID=-1"));
  // The step's node count against the list.
  CHECK_THROWS_WITH(from(srun_task(6, 7, 0, 3, "2(x3),1", 3)),
                    Contains("SLURM_STEP_NUM_NODES=3") && Contains("lists 4 nodes"));
  // Local id beyond the node's count (node 3 holds one task).
  CHECK_THROWS_WITH(from(srun_task(6, 7, 1, 3, "2(x3),1", 4)),
                    Contains("SLURM_LOCALID=1") && Contains("SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID=3]=1"));
  CHECK_THROWS_WITH(from(srun_task(7, 7, 0, 3, "2(x3),1", 4)),
                    Contains("SLURM_PROCID=7") && Contains("SLURM_STEP_NUM_TASKS=7"));
  CHECK_THROWS_WITH(from(overlay(srun_task(1, 2, 1, 0, "2", 1), {{"SLURM_STEPID", "4"}})),
                    Contains("SLURM_STEP_ID='3' but SLURM_STEPID='4'"));
  CHECK_THROWS_WITH(from(overlay(srun_task(1, 2, 1, 0, "2", 1), {{"SLURM_STEP_ID", "x"}, {"SLURM_STEPID", "x"}})),
                    Contains("SLURM_STEP_ID='x'") && Contains("not a Slurm step id"));
}

TEST_CASE("tasks-per-node lists that are not Slurm's syntax") {
  for (const std::string bad : {"", "2(x3", "2(3)", "2(x)", "2(x0)", "2,,1", ",2", "2,", "a", " 2", "2 ", "2(x3)1",
                                "2(x3),", "+2", "-1", "2(x3))", "99999999999"}) {
    INFO("SLURM_STEP_TASKS_PER_NODE='" << bad << "'");
    CHECK_THROWS_AS(from(srun_task(0, 2, 0, 0, bad, 1)), ConfigError);
    CHECK_THROWS_WITH(from(srun_task(0, 2, 0, 0, bad, 1)), Contains("SLURM_STEP_TASKS_PER_NODE='" + bad + "'"));
  }
  // More nodes than an int counts.
  CHECK_THROWS_WITH(from(srun_task(0, 2, 0, 0, "1(x2147483647),1", 1)), Contains("more than"));
}
