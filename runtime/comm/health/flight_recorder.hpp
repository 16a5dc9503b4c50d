// The process's flight recorder: a fixed ring of the last N collective records (fixed-size fields, so
// recording allocates nothing), written at issue time by CommunicatorBase and the bootstrap and stamped
// started/completed by the thread that runs the collective; read by the watchdog and dumped as JSON on
// failure. One mutex guards the ring (each call holds it for a few hundred bytes of copying). Private to comm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/watchdog.hpp"

namespace zero3::comm::flight {

// Fixed-size text: truncated, always NUL-terminated.
template <std::size_t N>
struct FixedText {
  char text[N] = {};
  void set(std::string_view s);
  std::string_view view() const;
};

struct Record {
  std::uint64_t ticket = 0;  // position in the process's record stream, from 1; 0: empty slot
  std::uint32_t lane = 0;    // which communicator (or the bootstrap) issued it
  std::uint64_t seq = 0;
  FixedText<16> op;
  FixedText<16> phase;
  FixedText<64> unit;
  DType dtype = DType::f32;
  std::uint64_t count = 0;
  std::uint64_t size_bytes = 0;
  std::int8_t reduce_op = -1;  // ReduceOp, or -1
  std::int32_t root = -1;
  std::int64_t step = -1;         // optimizer steps done when issued
  std::int64_t micro_batch = -1;  // within the accumulation window
  bool first_step = true;         // issued before the first step completed (its longer deadline)
  std::uint64_t fingerprint = 0;  // fingerprint(info) mixed with the unit, step and micro-batch
  std::int64_t enqueued_ns = 0;   // system clock, ns since the epoch; 0: not yet
  std::int64_t started_ns = 0;
  std::int64_t completed_ns = 0;
  bool failed = false;
};

struct LaneInfo {
  std::string name;  // "mpi", "nccl", "bootstrap"
  std::uint64_t last_started = 0;
  std::uint64_t last_completed = 0;
};

// "gather", "blocks.3" of the calling thread, step and micro-batch of the followed LoopProgress: what
// issued() stamps.
struct Context {
  std::string_view phase;
  std::string_view unit;
  std::int64_t step = -1;
  std::int64_t micro_batch = -1;
  bool first_step = true;
};

std::int64_t now_ns();

class Recorder {
 public:
  static Recorder& instance();

  std::uint32_t register_lane(std::string_view name);
  void set_capacity(std::size_t records);
  // The loop progress stamped on records from now on: the newest running watchdog's. unfollow() stops
  // following `progress` when it is still the one followed. Records issued while none is followed carry
  // no step and the first step's deadline.
  void follow(std::shared_ptr<const LoopProgress> progress);
  void unfollow(const LoopProgress* progress);
  // At issue: a new record for `info` on `lane` with the calling thread's context; `default_phase`
  // when the thread set none.
  void issued(std::uint32_t lane, const CollectiveInfo& info, std::uint64_t size_bytes, std::string_view default_phase);
  void started(std::uint32_t lane, std::uint64_t seq);
  void completed(std::uint32_t lane, std::uint64_t seq, bool failed);
  // The record of (lane, seq) when still in the ring.
  std::optional<Record> find(std::uint32_t lane, std::uint64_t seq) const;

  // The started-but-unfinished record that started first, if any.
  std::optional<Record> oldest_in_flight() const;
  // The newest started record and the newest completed one (progress reports).
  std::optional<Record> last_started() const;
  std::optional<Record> last_completed() const;
  std::vector<LaneInfo> lanes() const;
  std::vector<Record> snapshot() const;  // oldest first

 private:
  Record* find_locked(std::uint32_t lane, std::uint64_t seq);
  Context context_locked() const;
  mutable std::mutex mutex_;
  std::shared_ptr<const LoopProgress> progress_;  // guarded by mutex_
  std::vector<Record> ring_;                      // guarded by mutex_, as is everything below
  std::uint64_t next_ticket_ = 1;
  std::vector<LaneInfo> lanes_;
  std::uint64_t last_started_ticket_ = 0;
  std::uint64_t last_completed_ticket_ = 0;
};

// Called by a communicator's thread when a collective failed on this rank (kind "collective_failed" or
// "desync"): the watchdog reports it and brings the job down. Non-blocking.
void report_collective_failure(std::string_view kind, std::uint32_t lane, std::uint64_t seq, std::string message);

// One record as a JSON object text (dumps, progress reports).
std::string record_json(const Record& r, const std::vector<LaneInfo>& lanes);
// "all_gather #12 (bf16 x 4096, 8 KiB; gather unit blocks.3, step 17, micro-batch 2)"
std::string describe_record(const Record& r, const std::vector<LaneInfo>& lanes);

}  // namespace zero3::comm::flight
