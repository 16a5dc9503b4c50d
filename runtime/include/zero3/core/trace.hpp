// A timeline of what a process does, written as Chrome trace-event JSON (it opens in Perfetto and in
// chrome://tracing): spans on named tracks (the streams, the copies, the CPU optimizer, the checkpoint
// writer, the step's phases), counters (memory per category), and instants (step markers). Process-wide,
// off until start(); while off, every call returns after one relaxed load. Thread-safe.
//
//   zero3::trace::start();
//   { const zero3::trace::Scope s("cpu optimizer", "step slice 3"); ... }   // a span on a track
//   { const zero3::trace::Label op("reduce blocks.2"); stream.launch_host(...); }  // names the stream's span
//   zero3::trace::write_json("rank0.trace.json", /*process=*/0, "rank 0");
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero3::trace {

// Starts recording (dropping anything recorded before); stop() ends it.
void start();
void stop();
bool enabled();
// Microseconds on the trace's clock (steady, since start()).
std::int64_t now_us();

// A span of `track` from begin_us to end_us.
void span(std::string_view track, std::string name, std::int64_t begin_us, std::int64_t end_us);
// An instant on `track` (a step marker).
void instant(std::string_view track, std::string name);
// A counter sample: `name`'s series (e.g. memory categories) at their values now.
void counter(std::string_view name, const std::vector<std::pair<std::string_view, double>>& series);

// A span on `track` from construction to destruction (when recording at construction).
class Scope {
 public:
  Scope(std::string_view track, std::string name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string track_;
  std::string name_;
  std::int64_t begin_ = -1;
};

// While alive, the name of the work the calling thread enqueues on streams: a stream's span of a task is
// named by the labels live when the task was enqueued, outermost first ("optimizer step / adam_step").
class Label {
 public:
  explicit Label(std::string name);
  ~Label();
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  bool pushed_ = false;
};
// The calling thread's labels joined, or "" (when nothing is live or not recording).
std::string current_label();

// Everything recorded so far as one trace-event JSON document: `process` is the pid of every event (the
// rank), named `process_name`; each track a thread of it. Throws Error naming the file when it cannot write.
void write_json(const std::filesystem::path& path, int process, const std::string& process_name);
// Merges trace-event JSON files (each {"traceEvents": [...]}) into one; Error naming a file that cannot
// be read or parsed.
void merge_json(const std::vector<std::filesystem::path>& parts, const std::filesystem::path& out);

}  // namespace zero3::trace
