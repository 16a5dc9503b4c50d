// `zero3`: the command-line front end. This is the one top-level failure policy of the program:
// library code throws, and here an error becomes a message and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"zero3: ZeRO-3 sharded training with CPU offload, configured by DeepSpeed JSON", "zero3"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "zero3 " + std::string(zero3::kVersionString));
  zero3::tools::add_config_command(app);
  zero3::tools::add_demo_command(app);
  zero3::tools::add_info_command(app);
  zero3::tools::add_bench_command(app);
  zero3::tools::add_train_command(app);
  zero3::tools::add_mem_command(app);
  zero3::tools::add_ckpt_command(app);
  zero3::tools::add_debug_command(app);
  // A rank of a multi-rank job that fails alone brings the job down (report, flight record, abort)
  // instead of leaving the other ranks hanging in their next collective.
  zero3::comm::arm_fatal_error_handler(true);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const zero3::ConfigError& e) {
    zero3::log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    zero3::log::error("{}", e.what());
    return 1;
  }
  return 0;
}
