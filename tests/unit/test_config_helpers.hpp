// Small helpers shared by the config tests: parse inline JSON at a given world size and look for a
// diagnostic by JSON path.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/config/parse.hpp"

namespace zero3::config::testing {

inline ParseResult parse(std::string_view json, int world_size = 1, std::string source = "--world-size") {
  ParseOptions opts;
  opts.world_size = world_size;
  opts.world_size_source = std::move(source);
  return parse_config_text(json, opts);
}

inline bool has(const std::vector<Diagnostic>& ds, std::string_view path, std::string_view text = "") {
  return std::any_of(ds.begin(), ds.end(),
                     [&](const Diagnostic& d) { return d.path == path && d.message.find(text) != std::string::npos; });
}

inline const Resolution* resolution(const ParseResult& r, std::string_view path) {
  auto it = std::find_if(r.resolved.begin(), r.resolved.end(), [&](const Resolution& x) { return x.path == path; });
  return it == r.resolved.end() ? nullptr : &*it;
}

// Every diagnostic of a result, one per line, for failure messages.
inline std::string dump(const ParseResult& r) {
  std::string s;
  for (const auto& d : r.errors) s += format_diagnostic("error", d) + "\n";
  for (const auto& d : r.warnings) s += format_diagnostic("warning", d) + "\n";
  for (const auto& d : r.not_implemented) s += format_diagnostic("not implemented", d) + "\n";
  for (const auto& x : r.resolved) s += format_resolution(x) + "\n";
  return s;
}

}  // namespace zero3::config::testing
