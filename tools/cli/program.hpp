// What the `zero3` and `zero3-bench` programs share around their commands: the --version flag and the one
// top-level failure policy. Library code throws; here an error becomes a message and a non-zero exit
// status, and a rank that fails alone brings its job down instead of leaving the other ranks hanging.
#pragma once

#include <CLI/CLI.hpp>

namespace zero3::tools {

// Adds --version ("<program> <version>"), arms the fatal-error handler of comm/watchdog.hpp (report, flight
// record, abort: a rank of a multi-rank job that fails alone does not leave the others waiting in their
// next collective), parses `argv` and runs the chosen command. Returns the exit status: the one a command
// asked for with CLI::RuntimeError(status), CLI11's for a usage error or --help, 2 for a ConfigError and 1
// for any other exception, each with its message on stderr; 0 when the command succeeded.
int run_program(CLI::App& app, int argc, char** argv);

}  // namespace zero3::tools
