// Reading a DeepSpeed JSON config strictly: every problem is collected in one pass and named by its JSON
// path ("zero_optimization.offload_param.device"), "auto" is resolved from what zero3 knows and each
// resolution is recorded, and DeepSpeed features zero3 does not implement are listed, not silently ignored.
// Pure functions of their inputs (no environment, no global state); callable from any thread.
// Rules and the key table: docs/config.md and configs/README.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/config/config.hpp"

namespace zero3::config {

struct ParseOptions {
  std::optional<int> world_size;       // data-parallel ranks for the batch rule; nullopt = 1
  std::string world_size_source;       // shown in messages: "--world-size", "OMPI_COMM_WORLD_SIZE", ...; "" = default
  std::string source_name;             // names the input in whole-document errors; parse_config_file sets the path
  bool allow_not_implemented = false;  // load_config_or_throw only: accept configs that are valid but not runnable
  // Lint mode (`zero3 config check --strict`, "zero3": {"strict": true}): every warning about something
  // DeepSpeed would ignore or its hjson loader relaxes becomes an error, and the syntax must be plain JSON.
  bool strict = false;
};

// One finding. `path` is a dotted JSON path ("optimizer.params.betas[1]"), or the input's name for problems
// with the document itself (unreadable, empty, not JSON).
struct Diagnostic {
  std::string path;
  std::string message;
};

// One value zero3 chose: "auto" resolved, an inferred batch key, a DeepSpeed default taken on purpose.
struct Resolution {
  std::string path;
  std::string value;   // as JSON text: 8, 0.0001, true, "cpu"
  std::string reason;  // why this value: "train_micro_batch_size_per_gpu (4) * ... * world size (2, ...)"
};

struct ParseResult {
  std::optional<Config> config;             // present exactly when errors is empty
  std::vector<Diagnostic> errors;           // the config is invalid
  std::vector<Diagnostic> warnings;         // deprecated keys, ignored settings, DeepSpeed quirks
  std::vector<Diagnostic> not_implemented;  // valid DeepSpeed, but asks for something zero3 cannot run
  std::vector<Resolution> resolved;

  bool ok() const { return errors.empty() && config.has_value(); }
  bool runnable() const { return ok() && not_implemented.empty(); }
};

ParseResult parse_config_text(std::string_view json_text, const ParseOptions& options = {});
// Reads the file (errors for a missing or unreadable file go into the result, nothing is thrown).
ParseResult parse_config_file(const std::string& path, const ParseOptions& options = {});

// The resolved config as DeepSpeed JSON with every field explicit, plus the "zero3" block. Parsing the
// output again yields the same Config.
std::string to_json(const Config& config, int indent = 2);

// For programs that just want a config: throws zero3::ConfigError listing every error (and, unless
// options.allow_not_implemented, every not-implemented feature). Warnings and resolutions are logged.
Config load_config_or_throw(const std::string& path, const ParseOptions& options = {});
// The same for config text already in hand (built in, or patched by overrides); options.source_name names it.
Config load_config_text_or_throw(std::string_view json_text, const ParseOptions& options = {});

// "error: <path>: <message>", "warning: ...", "not implemented: ..." (kind is the prefix without ": ").
std::string format_diagnostic(std::string_view kind, const Diagnostic& d);
// "note: <path> = <value> (<reason>)"
std::string format_resolution(const Resolution& r);

}  // namespace zero3::config
