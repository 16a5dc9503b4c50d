#include "zero3/comm/world.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "zero3/core/error.hpp"

namespace zero3::comm {
namespace {

// rank, size, local rank, local size: the order of every array below.
using Values = std::array<int, 4>;

enum class LauncherKind { mpirun, hydra, srun, generic };

// A complete world read from one launcher's variables.
struct Launch {
  LauncherKind kind = LauncherKind::generic;
  Values values{};
  std::array<std::string, 4> names;  // the variable each value came from, for messages
  std::string launcher;              // "mpirun", "srun", ...: for what-to-do hints
  std::string source;                // World::source
};

// A launcher whose four variables give the whole world.
struct Family {
  LauncherKind kind;
  std::string_view launcher;
  std::string_view source;
  std::array<std::string_view, 4> names;
  std::string_view incomplete_hint;  // what to do when only some of the four are set
};

constexpr Family kOpenMpi{
    LauncherKind::mpirun,
    "mpirun",
    "mpirun (OMPI_COMM_WORLD_*)",
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    "Set all four of OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, "
    "OMPI_COMM_WORLD_LOCAL_SIZE (or none of them), or start the job with mpirun"};
constexpr Family kGeneric{LauncherKind::generic,
                          "torchrun-style variables",
                          "environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)",
                          {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                          "Set all four of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (or none of them), or "
                          "start the job with mpirun"};
// MPICH's (and Intel MPI's) Hydra mpiexec. MPI_LOCALRANKID/MPI_LOCALNRANKS are Hydra's own, so they say
// that Hydra started the process; PMI_RANK/PMI_SIZE alone are also set by srun --mpi=pmi2.
constexpr Family kHydra{LauncherKind::hydra,
                        "mpiexec (Hydra)",
                        "mpiexec (Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS)",
                        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                        "Hydra's mpiexec sets all four, except with -pmi-port (then PMI_ID and PMI_PORT, which "
                        "give no world size): start it without -pmi-port, or start the job with mpirun or srun"};

// The variables srun sets for every task of a step (and slurmstepd's SLURM_STEP_ID).
constexpr std::array<std::string_view, 5> kSrunNames{"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                                                     "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE"};
// Slurm's step ids at and above this are its special steps (batch script, interactive, extern).
constexpr long long kSlurmMaxNormalStepId = 0xfffffff0LL;

std::string show(std::string_view name, const std::optional<std::string>& value) {
  return value ? fmt::format("{}='{}'", name, *value) : fmt::format("{} unset", name);
}

int parse_int(std::string_view name, const std::string& text) {
  int v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec != std::errc() || ptr != last) {
    throw ConfigError(fmt::format("launcher variable {}='{}' is not a decimal integer{}", name, text,
                                  ec == std::errc::result_out_of_range ? " in range" : ""));
  }
  return v;
}

// Sizes at least 1, ranks inside them.
void check_world(const Values& values, const std::array<std::string, 4>& name) {
  const auto [rank, size, local_rank, local_size] = values;
  if (size < 1) throw ConfigError(fmt::format("launcher variable {}={} must be at least 1", name[1], size));
  if (local_size < 1) {
    throw ConfigError(fmt::format("launcher variable {}={} must be at least 1", name[3], local_size));
  }
  if (rank < 0 || rank >= size) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: {}={} must be in [0, {}={})", name[0], rank, name[1], size));
  }
  if (local_rank < 0 || local_rank >= local_size) {
    throw ConfigError(fmt::format("launcher variables are inconsistent: {}={} must be in [0, {}={})", name[2],
                                  local_rank, name[3], local_size));
  }
  if (local_size > size) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: {}={} exceeds {}={}", name[3], local_size, name[1], size));
  }
}

// The family's world, or nullopt when none of its variables is set.
std::optional<Launch> read_family(const Family& family, const World::EnvLookup& lookup) {
  std::array<std::optional<std::string>, 4> raw;
  int set = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    raw[i] = lookup(family.names[i]);
    if (raw[i]) ++set;
  }
  if (set == 0) return std::nullopt;
  if (set != 4) {
    std::vector<std::string> parts;
    for (std::size_t i = 0; i < 4; ++i) parts.push_back(show(family.names[i], raw[i]));
    throw ConfigError(
        fmt::format("incomplete launcher environment: {}. {}", fmt::join(parts, ", "), family.incomplete_hint));
  }
  Launch launch;
  for (std::size_t i = 0; i < 4; ++i) {
    launch.values[i] = parse_int(family.names[i], *raw[i]);
    launch.names[i] = std::string(family.names[i]);
  }
  check_world(launch.values, launch.names);
  launch.kind = family.kind;
  launch.launcher = std::string(family.launcher);
  launch.source = std::string(family.source);
  return launch;
}

// ---------------------------------------------------------------- Slurm

struct StepId {
  std::string_view name;  // SLURM_STEP_ID, or the older SLURM_STEPID
  std::string text;
  long long id = 0;  // slurmstepd prints the special steps' ids as negative numbers (-5: batch script)
};

std::optional<StepId> read_step_id(const World::EnvLookup& lookup) {
  const auto current = lookup("SLURM_STEP_ID");
  const auto legacy = lookup("SLURM_STEPID");
  if (current && legacy && *current != *legacy) {
    throw ConfigError(fmt::format(
        "launcher environments disagree: SLURM_STEP_ID='{}' but SLURM_STEPID='{}'. Slurm sets both to the step "
        "of the task it starts; one was inherited or set by hand: unset it",
        *current, *legacy));
  }
  if (!current && !legacy) return std::nullopt;
  StepId step{current ? "SLURM_STEP_ID" : "SLURM_STEPID", current ? *current : *legacy};
  const char* last = step.text.data() + step.text.size();
  auto [ptr, ec] = std::from_chars(step.text.data(), last, step.id);
  if (step.text.empty() || ec != std::errc() || ptr != last || step.id < INT32_MIN || step.id > UINT32_MAX) {
    throw ConfigError(
        fmt::format("launcher variable {}='{}' is not a Slurm step id (a decimal integer)", step.name, step.text));
  }
  return step;
}

bool is_srun_step(const StepId& step) {
  return step.id >= 0 && step.id < kSlurmMaxNormalStepId;
}

std::string_view special_step_name(const StepId& step) {
  switch (step.id < 0 ? step.id + (1LL << 32) : step.id) {
    case 0xfffffffbLL:
      return "batch script";
    case 0xfffffffaLL:
      return "interactive step";
    case 0xfffffffcLL:
      return "extern step";
    default:
      return "special step";
  }
}

struct TasksPerNode {
  long long nodes = 0;
  long long tasks = 0;
  long long at_node = -1;  // the count of the node asked for; -1 when the list is shorter
};

// Slurm's compressed list, "2(x3),1": counts separated by commas, count(xN) for N nodes in a row.
TasksPerNode parse_tasks_per_node(std::string_view name, std::string_view text, int node) {
  auto bad = [&] {
    return ConfigError(fmt::format(
        "launcher variable {}='{}' is not a tasks-per-node list (counts separated by commas, count(xN) for N "
        "nodes in a row, e.g. '2(x3),1')",
        name, text));
  };
  std::size_t i = 0;
  auto number = [&](long long& v) {
    const std::size_t start = i;
    v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && v <= INT_MAX) v = v * 10 + (text[i++] - '0');
    return i > start && v <= INT_MAX;
  };
  TasksPerNode out;
  for (;;) {
    long long count = 0;
    long long repeat = 1;
    if (!number(count)) throw bad();
    if (i < text.size() && text[i] == '(') {
      if (text.substr(i, 2) != "(x") throw bad();
      i += 2;
      if (!number(repeat) || repeat < 1 || i >= text.size() || text[i] != ')') throw bad();
      ++i;
    }
    if (node >= out.nodes && node < out.nodes + repeat) out.at_node = count;
    out.nodes += repeat;
    out.tasks += count * repeat;
    if (out.nodes > INT_MAX || out.tasks > INT_MAX) {
      throw ConfigError(
          fmt::format("launcher variable {}='{}' lists more than {} nodes or tasks", name, text, INT_MAX));
    }
    if (i == text.size()) return out;
    if (text[i++] != ',') throw bad();
  }
}

// The world of a task that srun started: every variable of kSrunNames, consistent with each other.
Launch read_srun_task(const World::EnvLookup& lookup, const StepId& step) {
  std::array<std::optional<std::string>, 5> raw;
  bool complete = true;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    raw[i] = lookup(kSrunNames[i]);
    complete = complete && raw[i].has_value();
  }
  if (!complete) {
    std::vector<std::string> parts;
    for (std::size_t i = 0; i < raw.size(); ++i) parts.push_back(show(kSrunNames[i], raw[i]));
    throw ConfigError(fmt::format(
        "incomplete srun environment: {}='{}' says srun started this process, but {}. srun sets all of them for "
        "every task: start the program with srun directly (not through something that unsets them), or with mpirun",
        step.name, step.text, fmt::join(parts, ", ")));
  }
  const int rank = parse_int(kSrunNames[0], *raw[0]);
  const int size = parse_int(kSrunNames[1], *raw[1]);
  const int local_rank = parse_int(kSrunNames[2], *raw[2]);
  const int node = parse_int(kSrunNames[3], *raw[3]);
  const std::string& list = *raw[4];
  const TasksPerNode tpn = parse_tasks_per_node(kSrunNames[4], list, node);
  if (node < 0 || node >= tpn.nodes) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: SLURM_NODEID={} must be in [0, {}), the nodes of "
                    "SLURM_STEP_TASKS_PER_NODE='{}'",
                    node, tpn.nodes, list));
  }
  if (tpn.tasks != size) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: SLURM_STEP_TASKS_PER_NODE='{}' adds up to {} tasks but "
                    "SLURM_STEP_NUM_TASKS={}",
                    list, tpn.tasks, size));
  }
  if (const auto nodes = lookup("SLURM_STEP_NUM_NODES");
      nodes && parse_int("SLURM_STEP_NUM_NODES", *nodes) != tpn.nodes) {
    throw ConfigError(fmt::format(
        "launcher variables are inconsistent: SLURM_STEP_NUM_NODES={} but SLURM_STEP_TASKS_PER_NODE='{}' lists {} "
        "nodes",
        *nodes, list, tpn.nodes));
  }
  Launch launch;
  launch.values = {rank, size, local_rank, static_cast<int>(tpn.at_node)};
  launch.names = {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                  fmt::format("SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID={}]", node)};
  check_world(launch.values, launch.names);
  launch.kind = LauncherKind::srun;
  launch.launcher = "srun";
  launch.source = fmt::format(
      "srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and the local size from "
      "SLURM_STEP_TASKS_PER_NODE='{}' at SLURM_NODEID={}; {}={})",
      list, node, step.name, step.text);
  return launch;
}

struct SlurmReading {
  std::optional<Launch> launch;  // set for a task of an srun step
  std::string claim;             // Slurm shows several tasks but gives no world for this process
  std::string note;              // why Slurm's variables are not this process's world, for World::source
};

// SLURM_STEP_ID tells an srun task from the batch script: slurmstepd sets it, for every process it
// starts, to that process's own step, so it is right even where the other SLURM_* were inherited.
SlurmReading read_slurm(const World::EnvLookup& lookup) {
  SlurmReading r;
  const auto step = read_step_id(lookup);
  if (step && is_srun_step(*step)) {
    r.launch = read_srun_task(lookup, *step);
    return r;
  }
  const auto ntasks = lookup("SLURM_NTASKS");
  const std::string tasks_note =
      ntasks && *ntasks != "1"
          ? fmt::format("; SLURM_NTASKS='{}' counts the allocation's tasks, which srun starts", *ntasks)
          : "";
  if (step) {
    r.note = fmt::format("Slurm {}, {}='{}', which Slurm runs once{}", special_step_name(*step), step->name, step->text,
                         tasks_note);
    return r;
  }
  if (const auto step_tasks = lookup("SLURM_STEP_NUM_TASKS");
      step_tasks && parse_int("SLURM_STEP_NUM_TASKS", *step_tasks) > 1) {
    r.claim = fmt::format(
        "SLURM_STEP_NUM_TASKS='{}' shows an srun step of several tasks, but SLURM_STEP_ID and SLURM_STEPID are "
        "unset, so which task this is cannot be read",
        *step_tasks);
    return r;
  }
  if (const auto job = lookup("SLURM_JOB_ID")) {
    r.note =
        fmt::format("in Slurm job SLURM_JOB_ID='{}' but not started by srun (no SLURM_STEP_ID){}", *job, tasks_note);
  }
  return r;
}

// ---------------------------------------------------------------- partial worlds: PMIx, PMI

// A variable that gives part of a world: PMIx's rank (its size is only in the PMIx API), PMI's rank
// and size (srun --mpi=pmi2 sets them, without a local rank).
struct Part {
  std::string_view name;
  std::size_t index;  // into Values
  std::optional<int> value;
};

std::vector<Part> read_parts(const World::EnvLookup& lookup, std::vector<Part> parts) {
  std::vector<Part> set;
  for (Part& p : parts) {
    if (const auto raw = lookup(p.name)) {
      p.value = parse_int(p.name, *raw);
      set.push_back(p);
    }
  }
  return set;
}

// `parts` were set by the launcher that set `launch`, for the same process, so they must agree.
void check_same_launcher(const std::vector<Part>& parts, const Launch& launch) {
  std::vector<std::string> diffs;
  std::vector<std::string_view> names;
  for (const Part& p : parts) {
    names.push_back(p.name);
    if (*p.value != launch.values[p.index]) {
      diffs.push_back(fmt::format("{}={} but {}={}", p.name, *p.value, launch.names[p.index], launch.values[p.index]));
    }
  }
  if (diffs.empty()) return;
  throw ConfigError(fmt::format(
      "launcher environments disagree: {}. {} and the {} ({}) describe the same process, so one of them was "
      "inherited from another launch or set by hand: unset it",
      fmt::join(diffs, "; "), fmt::join(names, ", "), launch.launcher, launch.source));
}

// What a part that no world explains says, or "" when it shows one task only.
std::string claim_of(const std::vector<Part>& parts) {
  if (parts.empty()) return "";
  int size = -1;
  int rank = 0;
  std::vector<std::string> shown;
  for (const Part& p : parts) {
    shown.push_back(fmt::format("{}={}", p.name, *p.value));
    if (p.index == 1) size = *p.value;
    if (p.index == 0) rank = *p.value;
  }
  if (size == 1 && rank == 0) return "";
  return fmt::format(
      "{} ({})", fmt::join(shown, ", "),
      size < 0 ? "a task of a launcher that gives no world size in the environment" : "a task of a job of several");
}

void check_generic(const Launch& launch, const Launch& generic) {
  std::vector<std::string> diffs;
  for (std::size_t i = 0; i < 4; ++i) {
    if (launch.values[i] != generic.values[i]) {
      diffs.push_back(
          fmt::format("{}={} but {}={}", launch.names[i], launch.values[i], generic.names[i], generic.values[i]));
    }
  }
  if (diffs.empty()) return;
  throw ConfigError(fmt::format(
      "launcher environments disagree: {}. Unset RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE when starting with {}",
      fmt::join(diffs, "; "), launch.launcher));
}

// srun gives each task a PMI only when asked (--mpi=pmix sets PMIX_RANK, --mpi=pmi2 PMI_RANK and PMI_FD);
// with --mpi=none, or MpiDefault=none in slurm.conf, an MPI has no way to find the step's other tasks.
std::string srun_without_pmi(const World& w, const World::EnvLookup& lookup) {
  constexpr std::array<std::string_view, 3> kPmiNames{"PMIX_RANK", "PMI_RANK", "PMI_FD"};
  if (w.size == 1) return "";
  for (std::string_view name : kPmiNames) {
    if (lookup(name)) return "";
  }
  return fmt::format(
      "srun started this task as rank {} of {} (SLURM_PROCID={}, SLURM_STEP_NUM_TASKS={}) without a PMI: {} are "
      "unset (srun --mpi=none, or MpiDefault=none in slurm.conf), so MPI cannot reach the other tasks and fails in "
      "MPI_Init or starts alone. zero3 needs srun --mpi=pmix (or the PMI its MPI library was built with: `srun "
      "--mpi=list`), or a start with mpirun",
      w.rank, w.size, w.rank, w.size, fmt::join(kPmiNames, ", "));
}

World to_world(const Launch& launch) {
  World w;
  w.rank = launch.values[0];
  w.size = launch.values[1];
  w.local_rank = launch.values[2];
  w.local_size = launch.values[3];
  w.source = launch.source;
  return w;
}

}  // namespace

// Innermost launcher first: mpirun and Hydra start their processes from daemons that srun may have
// started, so the SLURM_* (and PMIx) variables such a process inherits describe the daemons' step.
World World::from_lookup(const EnvLookup& lookup) {
  const auto generic = read_family(kGeneric, lookup);
  auto pmix = [&] { return read_parts(lookup, {{"PMIX_RANK", 0, {}}}); };
  auto pmi = [&] { return read_parts(lookup, {{"PMI_RANK", 0, {}}, {"PMI_SIZE", 1, {}}}); };
  std::optional<Launch> launch = read_family(kOpenMpi, lookup);
  std::vector<std::string> claims;
  std::string note;
  if (launch) {
    check_same_launcher(pmix(), *launch);  // mpirun's PMIx server sets PMIX_RANK for each of its processes
  } else if (lookup("MPI_LOCALRANKID") || lookup("MPI_LOCALNRANKS")) {
    launch = read_family(kHydra, lookup);  // Hydra speaks PMI only: a PMIX_RANK is its proxies' (srun's)
  } else {
    SlurmReading slurm = read_slurm(lookup);
    launch = std::move(slurm.launch);
    note = std::move(slurm.note);
    if (!slurm.claim.empty()) claims.push_back(std::move(slurm.claim));
  }
  if (launch && generic) check_generic(*launch, *generic);
  if (!launch) launch = generic;
  if (launch && (launch->kind == LauncherKind::srun || launch->kind == LauncherKind::generic)) {
    check_same_launcher(pmix(), *launch);  // srun --mpi=pmix
    check_same_launcher(pmi(), *launch);   // srun --mpi=pmi2
  }
  if (launch) {
    World w = to_world(*launch);
    if (launch->kind == LauncherKind::srun) w.warning = srun_without_pmi(w, lookup);
    return w;
  }
  for (const auto& parts : {pmix(), pmi()}) {
    if (std::string claim = claim_of(parts); !claim.empty()) claims.push_back(std::move(claim));
  }
  if (!claims.empty()) {
    throw ConfigError(fmt::format(
        "refusing to start as a single process: {}, but no complete world can be read (OMPI_COMM_WORLD_* from "
        "mpirun; PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS from Hydra's mpiexec; SLURM_STEP_ID, "
        "SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE from srun; or "
        "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). Start the job with mpirun or srun, or unset these "
        "variables to run one process",
        fmt::join(claims, "; ")));
  }
  World w;
  w.source = note.empty() ? "single process (no launcher variables)" : fmt::format("single process ({})", note);
  return w;
}

World World::from_environment() {
  return from_lookup([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());  // NOLINT(concurrency-mt-unsafe): read at start-up
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace zero3::comm
