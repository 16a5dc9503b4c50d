// Turning config text into a JSON document the way zero3 wants it read: key order kept (so diagnostics come
// in file order), // and /* */ comments allowed (DeepSpeed reads files with hjson), duplicate keys reported
// with their path (DeepSpeed rejects them), syntax errors reported as line and column. Internal to zero3_config.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/config/parse.hpp"

namespace zero3::config::detail {

using Json = nlohmann::ordered_json;

struct LineColumn {
  std::size_t line = 1;    // 1-based
  std::size_t column = 1;  // 1-based, in bytes
};

// The line and column of the byte at 0-based offset `offset` (offsets past the end map to the end).
LineColumn line_column(std::string_view text, std::size_t offset);

// Parses `text` into `out`. Every problem becomes an error in `errors`; problems with the document as a whole
// are named `source_name`. Returns false when no usable document came out (empty, not JSON, not an object);
// duplicate keys leave a usable document (the last value wins) but still count as errors.
bool read_json_document(std::string_view text, const std::string& source_name, Json& out,
                        std::vector<Diagnostic>& errors);

// Appends `key` to a dotted path; keys that would read ambiguously (empty, containing '.', '[' or spaces)
// are quoted: a.b["x.y"].
std::string join_path(std::string_view parent, std::string_view key);
std::string index_path(std::string_view parent, std::size_t index);

}  // namespace zero3::config::detail
