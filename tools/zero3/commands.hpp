// The subcommands of the `zero3` program. Each add_*_command registers itself on the top-level app;
// a command that must end with a particular exit status throws CLI::RuntimeError(status), and main()
// turns that into the process's exit code. No command calls exit().
#pragma once

#include <CLI/CLI.hpp>

namespace zero3::tools {

void add_config_command(CLI::App& app);  // zero3 config check, keys, lr-schedule
void add_demo_command(CLI::App& app);    // zero3 demo: sharded collectives over the ranks of the job
void add_info_command(CLI::App& app);    // zero3 info: build, backends, devices, topology
void add_bench_command(CLI::App& app);   // zero3 bench engine: zero3 vs plain buffers, side by side
void add_train_command(CLI::App& app);   // zero3 train: the GPT of a config through the engine
void add_mem_command(CLI::App& app);     // zero3 mem plan, report: a job's memory per rank, by kind and category
// zero3 mem report, fit (registered by add_mem_command on its `mem` subcommand)
void add_mem_report_command(CLI::App& group);
void add_mem_fit_command(CLI::App& group);
void add_ckpt_command(CLI::App& app);   // zero3 ckpt info, export: inspect, verify, export checkpoints
void add_debug_command(CLI::App& app);  // zero3 debug flight: the first divergence in the ranks' flight records
// zero3 bench cpu-optimizer (registered by add_bench_command on its `bench` subcommand)
void add_bench_cpu_optimizer_command(CLI::App& group);
// zero3 bench offload: step time with and without CPU offload, and the copies hidden behind other work
void add_bench_offload_command(CLI::App& group);
// zero3 bench train: tokens/s and step-time split of a zero3 train job, world sizes x offload
void add_bench_train_command(CLI::App& group);
// zero3 bench checkpoint: save/load GB/s vs plain I/O, async save cost per step
void add_bench_checkpoint_command(CLI::App& group);
// zero3 bench stop-agreement: per-step cost of the ranks' agreement on a stop request
void add_bench_stop_command(CLI::App& group);
// zero3 bench grad-check: the non-finite check vs the norm (registered by add_bench_command)
void add_bench_grad_check_command(CLI::App& group);
// zero3 bench desync-guard: step time with and without zero3.comm.desync_check
void add_bench_desync_command(CLI::App& group);

}  // namespace zero3::tools
