// Where a step's time goes, measured when wall_clock_breakdown is set. Under CPU offload: the intervals in
// which the host<->device copies ran (from timestamps taken in stream order, by host functions enqueued
// around each copy), and those in which other work ran (compute-stream work between a scope's opening and
// its closing, the gradient worker's accumulation, the CPU optimizer). A copy's time is "hidden" where it
// overlaps other work. Always: the compute stream's stalls on gathers. Recording is thread-safe (stream workers, CUDA
// callback threads, the engine thread); summarize() is called by the engine thread once the recorded work has
// completed.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "zero3/device/device.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

class Timeline {
 public:
  enum class Lane : std::uint8_t { d2h, h2d, compute, cpu, gather_wait };
  using Clock = std::chrono::steady_clock;

  explicit Timeline(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // An interval on `stream`: begin() enqueues its start stamp, end(id) its end stamp (after the work in
  // between). Both are no-ops returning 0 when disabled.
  std::uint64_t begin(Stream& stream, Lane lane);
  void end(Stream& stream, std::uint64_t id);
  // An interval measured on a host thread.
  void host(Lane lane, Clock::time_point start, Clock::time_point end);
  // Bytes moved by the copies of a lane (always counted).
  void add_bytes(Lane lane, std::uint64_t bytes);
  // Disk traffic and waits of NVMe offload (always counted).
  void add_disk(const DiskTimes& disk);

  struct Summary {
    OffloadTimes offload;
    DiskTimes disk;
    double gather_wait_ms = 0.0;
  };
  // Totals of the intervals completed since the last call (both stamps taken), which it forgets;
  // intervals still in flight count in a later call.
  Summary summarize();

 private:
  struct Interval {
    Lane lane = Lane::cpu;
    Clock::time_point start;
    Clock::time_point end;
    bool started = false;
    bool ended = false;
  };
  bool enabled_;
  std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Interval> intervals_;
  std::uint64_t d2h_bytes_ = 0;
  std::uint64_t h2d_bytes_ = 0;
  DiskTimes disk_;
};

}  // namespace zero3::engine
