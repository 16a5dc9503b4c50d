// The subcommands of the `zero3` program. Each add_*_command registers itself on the top-level app;
// a command that must end with a particular exit status throws CLI::RuntimeError(status), and run_program
// (tools/cli/program.hpp) turns that into the process's exit code. No command calls exit().
#pragma once

#include <CLI/CLI.hpp>

namespace zero3::tools {

void add_config_command(CLI::App& app);  // zero3 config check, keys, lr-schedule
void add_demo_command(CLI::App& app);    // zero3 demo: sharded collectives over the ranks of the job
void add_info_command(CLI::App& app);    // zero3 info: build, backends, devices, topology
void add_train_command(CLI::App& app);   // zero3 train: the GPT of a config through the engine
void add_mem_command(CLI::App& app);     // zero3 mem plan, report: a job's memory per rank, by kind and category
// zero3 mem report, fit (registered by add_mem_command on its `mem` subcommand)
void add_mem_report_command(CLI::App& group);
void add_mem_fit_command(CLI::App& group);
void add_ckpt_command(CLI::App& app);   // zero3 ckpt info, export: inspect, verify, export checkpoints
void add_debug_command(CLI::App& app);  // zero3 debug flight: the first divergence in the ranks' flight records

}  // namespace zero3::tools
