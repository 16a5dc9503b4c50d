// The subcommands of the `zero3-bench` program, the benchmarks of zero3 (built with the tests, never
// installed). Each add_bench_*_command registers one on the top-level app; as in `zero3`, a command that
// must end with a particular exit status throws CLI::RuntimeError(status) and no command calls exit().
#pragma once

#include <CLI/CLI.hpp>

namespace zero3::tools {

// zero3-bench train: tokens/s and step-time split of a zero3 train job, world sizes x offload
void add_bench_train_command(CLI::App& app);
// zero3-bench engine: the host GPT's step time under the engine vs plain buffers, side by side
void add_bench_engine_command(CLI::App& app);
// zero3-bench offload: step time with and without CPU offload, and the copies hidden behind other work
void add_bench_offload_command(CLI::App& app);
// zero3-bench cpu-optimizer: the fused CPU optimizer vs the memory bound and unfused passes
void add_bench_cpu_optimizer_command(CLI::App& app);
// zero3-bench checkpoint: save/load GB/s vs plain I/O, async save cost per step
void add_bench_checkpoint_command(CLI::App& app);
// zero3-bench stop-agreement: per-step cost of the ranks' agreement on a stop request
void add_bench_stop_command(CLI::App& app);
// zero3-bench grad-check: the non-finite check vs the norm
void add_bench_grad_check_command(CLI::App& app);
// zero3-bench desync-guard: step time with and without zero3.comm.desync_check
void add_bench_desync_command(CLI::App& app);
// zero3-bench host-gemm: the host models' matrix-product backends at a GPT's shapes
void add_bench_host_gemm_command(CLI::App& app);
// zero3-bench attention: the host models' tiled attention beside torch's scaled_dot_product_attention
void add_bench_attention_command(CLI::App& app);

}  // namespace zero3::tools
