#include "program.hpp"

#include <exception>
#include <string>

#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/version.hpp"

namespace zero3::tools {

int run_program(CLI::App& app, int argc, char** argv) {
  app.set_version_flag("--version", app.get_name() + " " + std::string(kVersionString));
  comm::arm_fatal_error_handler(true);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const ConfigError& e) {
    log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 1;
  }
  return 0;
}

}  // namespace zero3::tools
