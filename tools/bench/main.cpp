// `zero3-bench`: zero3's benchmarks (bench_commands.hpp), a program of their own beside `zero3`, built with
// the tests and never installed. Its failure policy is tools/cli/program.hpp's, as the `zero3` program's.
#include <CLI/CLI.hpp>

#include "bench_commands.hpp"
#include "program.hpp"

int main(int argc, char** argv) {
  CLI::App app{"zero3-bench: zero3's benchmarks (step time, offload, CPU optimizer, checkpoints, collectives)",
               "zero3-bench"};
  app.require_subcommand(1);
  zero3::tools::add_bench_train_command(app);
  zero3::tools::add_bench_engine_command(app);
  zero3::tools::add_bench_offload_command(app);
  zero3::tools::add_bench_cpu_optimizer_command(app);
  zero3::tools::add_bench_checkpoint_command(app);
  zero3::tools::add_bench_stop_command(app);
  zero3::tools::add_bench_grad_check_command(app);
  zero3::tools::add_bench_desync_command(app);
  zero3::tools::add_bench_host_gemm_command(app);
  zero3::tools::add_bench_attention_command(app);
  return zero3::tools::run_program(app, argc, argv);
}
