// The run's structured event log. Every warning and error of the failure handling (a collective past its
// deadline, a skipped non-finite step, a loss spike and the action taken, a preemption) is one JSON line in
// <run dir>/events.jsonl (time, level, rank, step, kind, message, figures, fields) and a log line; warnings
// and errors also run the user's alert command (zero3.alerts.command) with the line on its stdin, so a user
// can page themselves. Process-wide and thread-safe; before configure() events go to the log only.
//
//   zero3::events::configure({.run_dir = "runs/a", .rank = 1, .alert_command = "notify-me.sh"});
//   zero3::events::emit({.level = zero3::log::Level::warning, .kind = "nonfinite_skip", .step = 17,
//                        .message = "step 17 skipped: grad of 'blocks.3.mlp.w1' is not finite",
//                        .figures = {{"grad_norm", grad_norm}}});
//   zero3::events::flush(std::chrono::seconds(5));  // before the process ends on an error
//
// Ranks of one job append to the same file (one write() per line, O_APPEND); each line names its rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "zero3/core/log.hpp"

namespace zero3::events {

struct Event {
  log::Level level = log::Level::info;
  std::string kind{};      // snake_case, stable: "collective_timeout", "nonfinite_skip", "preempted", ...
  std::int64_t step = -1;  // optimizer steps done when it happened; -1: not known or not in a step
  std::string message{};   // one line, complete on its own (it is also the log line)
  std::vector<std::pair<std::string, double>> figures{};      // named numbers ("loss", "ratio", "timeout_s")
  std::vector<std::pair<std::string, std::string>> fields{};  // named texts ("op", "unit", "missing_ranks")
};

struct Options {
  std::filesystem::path run_dir{};  // empty: no events.jsonl (log lines only)
  int rank = 0;
  std::string alert_command{};                   // run by /bin/sh -c with the event's JSON line on stdin; empty: none
  log::Level alert_level = log::Level::warning;  // the least level that runs the alert command
};

// Replaces the options (thread-safe). The run directory is created at the first event written to it.
void configure(Options options);
// The run directory configured (empty when none): where failure dumps (flight records) go too.
std::filesystem::path run_dir();

// Logs the event's message at its level, appends its line to events.jsonl and, at alert_level or above,
// starts the alert command (without waiting for it). Never throws: a failure to write or to start the
// command is logged.
void emit(const Event& event);

// The JSON line emit() writes for `event` on this rank (no trailing newline).
std::string to_json_line(const Event& event);

// Waits up to `timeout` for the alert commands still running; logs those that did not finish. Returns
// true when none is left.
bool flush(std::chrono::milliseconds timeout);

}  // namespace zero3::events
