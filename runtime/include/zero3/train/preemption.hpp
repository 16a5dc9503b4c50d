// Stopping a run cleanly on request: a scheduler's SIGTERM, SLURM's --signal USR1 (which mpirun forwards),
// or a call from the embedding program. The request is one process-wide flag; StopSignals installs the
// handlers (they only store into atomics, or _exit on a repeated signal) and restores the previous ones
// when it goes away. The Trainer marks each accumulation window with the flag (Engine::mark_stop_request,
// carried by the step's all-reduce), so all ranks stop after the same step, learn who asked
// (agree_on_stop), save, and report TrainSummary::preempted.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "zero3/comm/communicator.hpp"

namespace zero3::train {

// The exit status of `zero3 train` stopped on request: EX_TEMPFAIL of sysexits.h ("temporary failure;
// retry later"). Not 0 (the run did not reach its steps), not 1/2 (errors), below 128 (a process killed
// by a signal reads 128 + N): a job script can requeue on exactly this code.
inline constexpr int kExitPreempted = 75;

// The reason stored by request_stop() called from code rather than from a signal handler.
inline constexpr int kStopRequestedByCall = -1;

// Asks the run to stop after the current optimizer step. Async-signal-safe; the first request wins (its
// reason is kept). `reason`: a signal number, or kStopRequestedByCall.
void request_stop(int reason = kStopRequestedByCall) noexcept;
// 0 when no stop is requested, else the first request's reason.
int stop_requested() noexcept;
// Forgets the request (a second run in the same process; tests).
void clear_stop_request() noexcept;

// "SIGTERM", "SIGUSR1", ..., or "a stop request" for kStopRequestedByCall.
std::string stop_reason_name(int reason);

struct StopSignalOptions {
  std::vector<int> signals = {SIGTERM, SIGUSR1};
  // A signal repeated within this window after the first is the same request delivered twice (a
  // scheduler that signals every process while the launcher forwards to its children); one after it
  // ends the process at once with status 128 + signal.
  std::chrono::milliseconds repeat_window{1000};
  int rank = -1;  // named in the handler's notice on stderr ("zero3 rank 1: SIGTERM received: ..."); -1: none
};

// Installs the stop handlers for the process (SA_RESTART, so blocked system calls resume). One at a time
// (UsageError for a second while one lives); the destructor restores the handlers that were there.
// Install it after MPI is initialized: an MPI library may install handlers of its own at start-up.
class StopSignals {
 public:
  explicit StopSignals(const StopSignalOptions& options = {});
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Leaves the handlers installed when this object goes away, until the process exits: a program whose
  // run ends with the trainer (`zero3 train`) still tears down the engine and MPI after it, and a stop
  // signal in that window must not turn a finished run into one killed by SIGTERM (a scheduler that
  // signals at the time limit, as the last step ends). After the run a request only sets the flag; a
  // signal repeated after the repeat window still ends the process at once. No second StopSignals can
  // be installed afterwards.
  void keep_until_exit() noexcept;

 private:
  struct Saved;
  std::vector<Saved> saved_;
  bool kept_until_exit_ = false;
};

// What the ranks agreed on after a step.
struct StopAgreement {
  bool stop = false;
  int reason = 0;                  // the lowest-numbered requesting rank's reason
  std::vector<int> ranks_asked{};  // the ranks whose flag was set
};

// Collective over `bootstrap` (one all-gather of 4 bytes per rank): every rank returns the same answer,
// stop when any rank's flag is set, with the ranks that asked and the first one's reason.
StopAgreement agree_on_stop(comm::Bootstrap& bootstrap);

// How a run stopped on request ended (TrainSummary::preempted).
struct Preemption {
  int reason = 0;                                     // signal number, or kStopRequestedByCall
  std::int64_t step = 0;                              // optimizer steps done: the checkpoint holds this state
  std::vector<int> ranks_asked{};                     // the ranks the request reached first
  std::optional<std::filesystem::path> checkpoint{};  // nullopt: nothing saved (no save_dir)
  double save_s = 0.0;                                // the synchronous save's time
};

// The run's events of a preemption (zero3/core/events.hpp), emitted on rank 0 only (what they say is the
// same on every rank): "preempt_requested" when the ranks agreed to stop, then "preempt_checkpoint" (the
// path and the save's seconds) or "preempt_nothing_saved".
void emit_stop_agreed(const StopAgreement& agreement, std::int64_t step, int rank);
void emit_preemption_outcome(const Preemption& preemption, int rank);

}  // namespace zero3::train
