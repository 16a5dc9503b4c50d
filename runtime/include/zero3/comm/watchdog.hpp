// The collective watchdog and flight recorder. Every collective a communicator issues (and every
// bootstrap exchange) is recorded per rank, with the context the caller annotated (phase, unit, step,
// micro-batch); a Watchdog thread checks the oldest started-but-unfinished one against its deadline and,
// on expiry or on a failed collective, reports who is missing, dumps the record to <run dir>/flight/ and
// brings the whole job down through one failure policy (default: MPI_Abort). Thread-safe throughout;
// annotations are per thread (set them on the thread that issues the collectives).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero3::comm {

class Bootstrap;

// The context of the collectives this thread issues while it lives: copied into each one's record when
// it is issued (so a prefetch issued for unit k+1 while unit k computes is named k+1). Nested scopes
// replace the outer one until they end. `phase` and `unit` must outlive the scope.
class ScopedOpAnnotation {
 public:
  ScopedOpAnnotation(std::string_view phase, std::string_view unit = {});
  ~ScopedOpAnnotation();
  ScopedOpAnnotation(const ScopedOpAnnotation&) = delete;
  ScopedOpAnnotation& operator=(const ScopedOpAnnotation&) = delete;

 private:
  std::string_view prev_phase_;
  std::string_view prev_unit_;
};

// Where the training loop is: optimizer steps done and the micro-batch within the current accumulation
// window (-1 before they are set), and whether the first optimizer step has completed. Owned by the
// Watchdog that judges deadlines by it (Watchdog::progress()); stamped on every record issued while that
// watchdog runs. Written by the engine and the training loop, read by any thread.
class LoopProgress {
 public:
  void set(std::int64_t steps_done, std::int64_t micro_batch) {
    steps_done_.store(steps_done, std::memory_order_relaxed);
    micro_batch_.store(micro_batch, std::memory_order_relaxed);
  }
  std::int64_t steps_done() const { return steps_done_.load(std::memory_order_relaxed); }
  std::int64_t micro_batch() const { return micro_batch_.load(std::memory_order_relaxed); }
  // Collectives issued from now on get the regular deadline instead of the first step's.
  void mark_first_step_done() { first_step_done_.store(true, std::memory_order_relaxed); }
  bool first_step_done() const { return first_step_done_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> steps_done_{-1};
  std::atomic<std::int64_t> micro_batch_{-1};
  std::atomic<bool> first_step_done_{false};
};

struct WatchdogOptions {
  // Deadline of a collective once this rank has entered it (zero3.comm.timeout_s).
  std::chrono::duration<double> timeout{300.0};
  // Deadline of collectives issued before the first optimizer step completed, and of checkpoint-phase
  // ones (zero3.comm.first_step_timeout_s): allocation, warm-up, NCCL init and a first checkpoint load or
  // a save to slow storage all happen there while the other ranks wait.
  std::chrono::duration<double> first_step_timeout{1200.0};
  // How often the thread checks deadlines and publishes this rank's progress.
  std::chrono::duration<double> poll_interval{0.5};
  // After posting a failure notice: how long the other ranks get to dump their records before the job
  // is brought down.
  std::chrono::duration<double> grace{3.0};
};

// The out-of-band channel to the other ranks (for example a small store on rank 0): it must not travel
// through the communicators it watches. Payloads are JSON texts; implementations bound every call.
class ProgressChannel {
 public:
  struct Peer {
    std::string progress;  // the last JSON a rank published
    double age_s = 0.0;    // seconds since it was published
  };
  virtual ~ProgressChannel() = default;
  // This rank's latest progress, replacing the previous one.
  virtual void publish(const std::string& progress) = 0;
  // Every rank's last published progress (nullopt for a rank that has published nothing); nullopt when
  // the channel itself does not answer (its server is down or stopped).
  virtual std::optional<std::vector<std::optional<Peer>>> fetch() = 0;
  // Tells every rank that the job is failing (the JSON names the reporting rank and why).
  virtual void post_failure(const std::string& notice) = 0;
  // A failure notice posted by any rank (the first one), or nullopt.
  virtual std::optional<std::string> poll_failure() = 0;
};

// The job's out-of-band channel: the progress store (a TCP server on rank 0 that admits only holders of
// the job's secret; runtime/comm/health/progress_store.hpp), its endpoint broadcast through the bootstrap.
// `single_host`: every rank runs on this host (the server binds the loopback address). Collective over
// all ranks; null with one rank. Throws CommError when rank 0 cannot listen.
std::shared_ptr<ProgressChannel> make_progress_channel(Bootstrap& bootstrap, bool single_host);

// A rank's one thread that watches this process's collectives while it lives. `channel` may be null
// (then a report cannot say what the other ranks did, and they learn of the failure only through the
// failure policy's abort).
class Watchdog {
 public:
  Watchdog(const WatchdogOptions& options, int rank, int size, std::shared_ptr<ProgressChannel> channel);
  ~Watchdog();  // stops the thread (waits for a failure being handled: that one ends the process)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The loop's position this watchdog publishes, stamps on the records and picks deadlines by.
  LoopProgress& progress();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What brought the job down, handed to the failure policy.
struct JobFailure {
  std::string kind;     // "collective_timeout", "collective_failed", "desync", "fatal_error", "peer_failed"
  std::string message;  // the report's first line
  int exit_code = 1;
};
using FailurePolicy = std::function<void(const JobFailure&)>;
// The policy that ends the job once the report is out. Default: abort the communicators (ncclCommAbort)
// and MPI_Abort(MPI_COMM_WORLD), so every rank exits non-zero; without MPI, _Exit. Tests replace it
// (the replacement may return). Returns the previous policy.
FailurePolicy set_failure_policy(FailurePolicy policy);
// Backends register how to abort themselves (ncclCommAbort, MPI_Abort); the default policy runs them
// newest first. The returned id unregisters.
std::uint64_t register_abort_hook(std::function<void()> hook);
void unregister_abort_hook(std::uint64_t id);

// A failed collective (an MPI error, a stream that skipped it, a desync) is reported by its communicator
// to the running watchdog, which brings the job down: the ranks no longer agree, and the others would
// hang. Without a watchdog the caller gets the CommError alone.
//
// The program's hook for any fatal error, armed by the program (arm_fatal_error_handler; unarmed it does
// nothing, so library users and tests keep their exceptions): dumps the flight record and, with more than
// one rank, reports, posts the failure notice and brings the job down as a timeout would (a rank exiting
// alone would leave the others hanging in their next collective). When a failure is already being
// handled it waits for that one. Returns only when the job is not brought down.
void handle_fatal_error(std::string_view what);
void arm_fatal_error_handler(bool armed);

// Records kept per rank (zero3.comm.flight_records); the oldest are overwritten. A new capacity clears
// the record; the same one keeps it.
void set_flight_capacity(std::size_t records);
// Writes this rank's record as JSON to <events::run_dir() or ./zero3-run>/flight/rank<R>.json; returns
// the path (empty when it could not be written: logged).
std::filesystem::path dump_flight_record(std::string_view reason, int rank);
// The same JSON as text (tests, the debug tool).
std::string flight_record_json(std::string_view reason, int rank);

}  // namespace zero3::comm
