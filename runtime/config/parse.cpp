// parse_config_text / parse_config_file / load_config_or_throw: read the document, run the block parsers
// in dependency order (zero3 settings and precision first: later "auto" values and checks use them), then
// reject the top-level keys nobody read. Never throws for bad input; a parser bug becomes an error line.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "parse_blocks.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::config {

namespace {

void parse_document(const detail::Json& root, const ParseOptions& options, detail::Sink& sink, ParseResult& result) {
  Config config;
  detail::Context cx{sink, options, config};
  detail::ObjectReader top(root, "", "", sink);
  detail::parse_zero3_block(top, cx);
  detail::parse_removed_keys(top, cx);
  detail::parse_precision(top, cx);
  detail::parse_zero_optimization(top, cx);
  detail::parse_top_scalars(top, cx);
  detail::parse_optimizer(top, cx);
  detail::check_optimizer_storage(top, cx);
  detail::parse_scheduler(top, cx);
  detail::parse_batch(top, cx);
  detail::parse_aio(top, cx);
  detail::parse_misc_blocks(top, cx);
  detail::parse_other_ds_blocks(top, cx);
  top.finish();
  if (options.strict) {
    sink.make_lint_errors("--strict");
  } else if (config.zero3.strict) {
    sink.make_lint_errors("zero3.strict");
  }
  if (result.errors.empty()) result.config = std::move(config);
}

}  // namespace

ParseResult parse_config_text(std::string_view json_text, const ParseOptions& options) {
  ParseResult result;
  const std::string name = options.source_name.empty() ? std::string("<config>") : options.source_name;
  try {
    detail::Sink sink(result);
    detail::Json root;
    // hjson syntax is lint: a warning, an error under --strict (read as plain JSON then) or zero3.strict.
    std::vector<Diagnostic> syntax;
    const auto mode = options.strict ? detail::SyntaxMode::strict_json : detail::SyntaxMode::deepspeed;
    const bool usable = detail::read_json_document(json_text, name, root, result.errors, syntax, mode);
    for (auto& w : syntax) sink.lint(std::move(w.path), std::move(w.message));
    if (usable) parse_document(root, options, sink, result);
  } catch (const std::exception& e) {
    result.config.reset();
    result.errors.push_back(
        {name, fmt::format("internal error while reading the config (please report): {}", e.what())});
  }
  return result;
}

ParseResult parse_config_file(const std::string& path, const ParseOptions& options) {
  ParseOptions named = options;
  named.source_name = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ParseResult result;
    result.errors.push_back({path, "is a directory, not a config file"});
    return result;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ParseResult result;
    result.errors.push_back({path, fmt::format("cannot open the file: {}", std::generic_category().message(errno))});
    return result;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    ParseResult result;
    result.errors.push_back({path, fmt::format("cannot read the file: {}", std::generic_category().message(errno))});
    return result;
  }
  return parse_config_text(text.str(), named);
}

std::string format_diagnostic(std::string_view kind, const Diagnostic& d) {
  return fmt::format("{}: {}: {}", kind, d.path.empty() ? "(top level)" : d.path, d.message);
}

std::string format_resolution(const Resolution& r) {
  return fmt::format("note: {} = {} ({})", r.path, r.value, r.reason);
}

namespace {

// Throws ConfigError listing every error (and not-implemented feature unless allowed); logs the warnings
// and resolutions of a config that can be used.
Config take_or_throw(ParseResult result, std::string_view name, const ParseOptions& options) {
  std::string problems;
  for (const auto& e : result.errors) problems += "\n  " + format_diagnostic("error", e);
  if (!options.allow_not_implemented) {
    for (const auto& n : result.not_implemented) problems += "\n  " + format_diagnostic("not implemented", n);
  }
  if (!problems.empty()) throw ConfigError(fmt::format("config {} cannot be used:{}", name, problems));
  for (const auto& w : result.warnings) log::warn("{}", format_diagnostic("config", w));
  for (const auto& r : result.resolved) log::info("config: {} = {} ({})", r.path, r.value, r.reason);
  return std::move(*result.config);
}

}  // namespace

Config load_config_or_throw(const std::string& path, const ParseOptions& options) {
  return take_or_throw(parse_config_file(path, options), path, options);
}

Config load_config_text_or_throw(std::string_view json_text, const ParseOptions& options) {
  return take_or_throw(parse_config_text(json_text, options), options.source_name, options);
}

}  // namespace zero3::config
