#include "json_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "hjson_reader.hpp"

namespace zero3::config::detail {

namespace {

constexpr std::size_t kNone = std::string_view::npos;

bool plain_key(std::string_view key) {
  if (key.empty()) return false;
  return std::none_of(key.begin(), key.end(), [](char c) {
    return c == '.' || c == '[' || c == ']' || c == '"' || c == ' ' || c == '\t' || c == '\n';
  });
}

std::string_view kind_of(const Json& j) {
  switch (j.type()) {
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

// ---- text preparation

std::string at(std::string_view s, std::size_t offset) {
  const LineColumn lc = line_column(s, offset);
  return fmt::format("line {}, column {}: ", lc.line, lc.column);
}

void report_findings(std::string_view s, const Reading& r, const std::string& source_name, SyntaxMode mode,
                     std::vector<Diagnostic>& errors, std::vector<Diagnostic>& warnings) {
  const bool strict = mode == SyntaxMode::strict_json;
  std::vector<Diagnostic>& sink = strict ? errors : warnings;
  std::vector<const Finding*> sorted;
  for (const Finding& f : r.findings) sorted.push_back(&f);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Finding* a, const Finding* b) { return a->offset < b->offset; });
  for (const Finding* f : sorted) {
    sink.push_back({source_name, strict ? fmt::format("{}{} is not strict JSON (RFC 8259); DeepSpeed's hjson reader "
                                                      "would accept it",
                                                      at(s, f->offset), f->what)
                                        : fmt::format("{}accepted {}, as DeepSpeed's hjson reader does (strict JSON "
                                                      "does not)",
                                                      at(s, f->offset), f->what)});
  }
  if (r.findings_left_out > 0) {
    sink.push_back({source_name, fmt::format("{}and {} more uses of hjson syntax, not listed one by one",
                                             at(s, r.first_left_out), r.findings_left_out)});
  }
}

}  // namespace

LineColumn line_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  LineColumn lc;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++lc.line;
      lc.column = 1;
    } else {
      ++lc.column;
    }
  }
  return lc;
}

std::string join_path(std::string_view parent, std::string_view key) {
  std::string k = plain_key(key) ? std::string(key) : fmt::format("[\"{}\"]", key);
  if (parent.empty()) return k;
  if (k.front() == '[') return fmt::format("{}{}", parent, k);
  return fmt::format("{}.{}", parent, k);
}

std::string index_path(std::string_view parent, std::size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

bool read_json_document(std::string_view text, const std::string& source_name, Json& out,
                        std::vector<Diagnostic>& errors, std::vector<Diagnostic>& warnings, SyntaxMode mode) {
  const std::string normalized = normalize_line_ends(text);
  const std::string_view s = normalized;
  if (const std::size_t bad = invalid_utf8_at(s); bad != kNone) {
    errors.push_back({source_name, fmt::format("not valid UTF-8 text: {}byte 0x{:02X} (DeepSpeed reads a config "
                                               "file as UTF-8)",
                                               at(s, bad), static_cast<unsigned char>(s[bad]))});
    return false;
  }
  const std::size_t start = s.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;  // a byte order mark, ignored
  bool only_comments = false;
  const std::optional<std::size_t> first = first_content(s, start, only_comments);
  if (!first) {
    errors.push_back({source_name, fmt::format("empty file{}: a DeepSpeed config is a JSON object, e.g. "
                                               "{{\"train_batch_size\": 8}}",
                                               only_comments ? " (only comments)" : "")});
    return false;
  }
  Reading r = read_text(s, start, *first);
  report_findings(s, r, source_name, mode, errors, warnings);
  if (r.failure) {
    errors.push_back({source_name, fmt::format("not valid JSON: {}{}", at(s, r.failure->offset), r.failure->message)});
    return false;
  }
  errors.insert(errors.end(), r.duplicates.begin(), r.duplicates.end());
  if (r.duplicates_left_out > 0) {
    errors.push_back({source_name, fmt::format("and {} more duplicate keys", r.duplicates_left_out)});
  }
  out = std::move(r.value);
  if (!out.is_object()) {
    errors.push_back({source_name, fmt::format("the top level is {}; a DeepSpeed config must be a JSON object "
                                               "({{...}})",
                                               kind_of(out))});
    return false;
  }
  return mode == SyntaxMode::deepspeed || r.findings.empty();
}

}  // namespace zero3::config::detail
