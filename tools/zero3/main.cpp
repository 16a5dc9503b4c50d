// `zero3`: the command-line front end of the library: configs, training, memory plans, checkpoints and
// the ranks' flight records (commands.hpp). Its failure policy is tools/cli/program.hpp's. The benchmarks
// are a program of their own, `zero3-bench` (tools/bench/), which is not installed.
#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "program.hpp"

int main(int argc, char** argv) {
  CLI::App app{"zero3: ZeRO-3 sharded training with CPU offload, configured by DeepSpeed JSON", "zero3"};
  app.require_subcommand(1);
  zero3::tools::add_config_command(app);
  zero3::tools::add_demo_command(app);
  zero3::tools::add_info_command(app);
  zero3::tools::add_train_command(app);
  zero3::tools::add_mem_command(app);
  zero3::tools::add_ckpt_command(app);
  zero3::tools::add_debug_command(app);
  return zero3::tools::run_program(app, argc, argv);
}
