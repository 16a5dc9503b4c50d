// `zero3 debug flight DIR`: placeholder until the merge of the ranks' records lands.
#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace zero3::tools {
void add_debug_command(CLI::App& app) {
  CLI::App* debug = app.add_subcommand("debug", "Post-mortem tools: merge the ranks' flight records");
  debug->require_subcommand(1);
}
}  // namespace zero3::tools
