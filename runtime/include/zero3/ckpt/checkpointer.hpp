// Saving and loading an Engine's state through the checkpoint format (zero3/ckpt/checkpoint.hpp), for
// `zero3 train` and for trainers that embed the engine. Every call here is collective: all ranks call it
// in the same order.
//
// Usage (the tests in tests/mpi/checkpointer/ do this at 1-4 ranks):
//
//   zero3::ckpt::Checkpointer ckpt(engine);            // the engine's bootstrap; async, 256 MiB staging
//   if (resuming) ckpt.load("ckpt");                   // ROOT/latest; before the first micro-batch
//   for (std::int64_t step = start; step < steps; ++step) {
//     for (int m = 0; m < gas; ++m) { forward_backward(m); engine.step(); }   // the last one: a boundary
//     for (const auto& r : ckpt.poll()) if (!r.ok) report(r.error);         // commits finished saves
//     if (step % 500 == 0) ckpt.save("ckpt", fmt::format("global_step{}", step), step, trainer_state);
//   }
//   for (const auto& r : ckpt.wait()) if (!r.ok) report(r.error);  // before the Checkpointer goes away
//
// save() and load() only at an accumulation boundary (after the window's last step(), or before the first
// micro-batch) with no scope open: elsewhere they throw UsageError on every rank, before anything is
// written or read.
//
// A save writes, on every rank, only the rank's own slices (engine.state().local_slices(owned)) of the params,
// master weights and optimizer moments (each in the dtype the optimizer stores it), plus a manifest (rank 0)
// holding the engine's training state (step counters, lr schedule, loss scaler), the resolved config and its
// hash, and the trainer's own state (an opaque JSON object: data-sampler position, RNG seed, ...). It commits by atomic
// rename after fsync; ROOT/latest moves only after the commit, so it always names a complete checkpoint.
//
// Async saves: save() copies the state into a staging area of at most `staging_bytes` (pageable host
// memory, reported to the engine's memory tracker as staging) and returns as soon as the last byte is in
// it; a background thread writes the rank's file meanwhile (when the state is larger than the staging
// area, save() waits for the writer to drain before copying more, so the state never changes under it).
// The commit happens in the first poll() (call it once per step) after every rank's writer finished; a
// failed write (disk full, ...) is reported there, and the previous checkpoint stays intact. A second
// save() first waits for the one in flight.
//
// Destruction never communicates: a destructor may run on one rank only, while an exception unwinds, and
// a collective there would hang the job. So a save still in flight (no poll() or wait() completed it) is
// not committed: the destructor waits for this rank's writer, logs an error naming the tag and what
// ROOT/latest still names (the previous, complete checkpoint), and leaves ROOT/.tmp.TAG for the next save
// of that tag to remove. Call wait() on every rank before destroying a Checkpointer.
//
// A load works at any world size: each rank reads only the byte ranges of the slices it keeps, a bounded
// block at a time, verifying each chunk's checksum. Into a job whose optimizer stores its master or moments in
// other dtypes than the checkpoint's, the values are converted (rounded to nearest even when narrowing) and
// LoadResult::notes says so. A checkpoint whose params (names, shapes) or
// optimizer type conflict with the job is refused with CheckpointError naming the conflict, before
// anything is written into the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::ckpt {

struct CheckpointerOptions {
  bool async = true;
  std::size_t staging_bytes = std::size_t{256} << 20;  // per rank
};

// The outcome of a save, as poll()/wait() report it (the same on every rank).
struct SaveReport {
  std::string tag;
  std::filesystem::path dir;  // ROOT/TAG
  bool ok = false;
  std::string error;        // when !ok: what failed, on which rank
  std::uint64_t bytes = 0;  // all ranks' data files
  double snapshot_s = 0.0;  // rank 0: time save() blocked the caller
  double total_s = 0.0;     // rank 0: from save() to the commit
};

struct LoadResult {
  std::string tag;
  std::int64_t step = 0;
  int saved_world_size = 1;
  nlohmann::json trainer_state;  // what the saver passed as trainer_state
  std::string manifest;          // the manifest's path, for messages about the trainer state's fields
  std::uint64_t bytes_read = 0;  // by this rank
  // What the load converted, one line each, the same on every rank (rank 0 also emits each as an event):
  // optimizer storage dtypes that differ from the job's ("checkpoint_storage_converted").
  std::vector<std::string> notes;
};

class Checkpointer {
 public:
  // Collective over the engine's bootstrap (Engine::bootstrap()).
  explicit Checkpointer(Engine& engine, CheckpointerOptions options = {});
  // `bootstrap`: the job's, the one the engine was made with (UsageError when null).
  Checkpointer(Engine& engine, std::shared_ptr<comm::Bootstrap> bootstrap, CheckpointerOptions options = {});
  // Rank-local (see above): waits for this rank's writer; a save no poll() or wait() completed is not
  // committed, and an error naming its tag is logged. Destroy a Checkpointer before its Engine.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // At an accumulation boundary with no scope open (UsageError on every rank otherwise). `step`: the
  // optimizer steps the state holds (the manifest's "step").
  // Synchronous (options.async false): returns after the commit; the next poll() or wait() reports it.
  void save(const std::filesystem::path& root, const std::string& tag, std::int64_t step,
            const nlohmann::json& trainer_state);
  // Completes an async save whose writers have finished on every rank, and returns the reports of the
  // saves completed since the last poll()/wait() (a synchronous save, or one a later save() waited for).
  // Cheap when no save is in flight.
  std::vector<SaveReport> poll();
  // Waits for the save in flight (if any), completes it, and returns the reports as poll() does.
  std::vector<SaveReport> wait();
  bool in_flight() const;

  // `path`: a checkpoint directory, or a root (then `tag`, or ROOT/latest). At an accumulation boundary
  // before training (or between steps), with no scope open (UsageError on every rank otherwise).
  LoadResult load(const std::filesystem::path& path, std::string_view tag = {});

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero3::ckpt
