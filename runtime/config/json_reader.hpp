// Turning config text into a JSON document the way zero3 wants it read: key order kept (so diagnostics come
// in file order), the hjson syntax DeepSpeed accepts when it reads a config file (comments, trailing and
// missing commas, unquoted keys, quoteless and ''' strings, no root braces) read as hjson 3.1.0 reads it and
// reported as warnings (errors under strict_json), duplicate keys reported with their path (DeepSpeed rejects
// them), syntax errors reported as line and column. Internal to zero3_config.
#pragma once

#include <cstddef>
#include <cstdint>
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

// deepspeed: what DeepSpeed's hjson reader accepts, each relaxation a warning; strict_json: RFC 8259 only.
enum class SyntaxMode : std::uint8_t { deepspeed, strict_json };

// Parses `text` into `out`. Problems with the document as a whole are named `source_name`. errors: syntax
// errors (with line and column), duplicate keys (with their JSON path), an empty document or one that is not
// an object. warnings: one per relaxation of JSON used (per kind and line, at most 20 and then a count), each
// "line L, column C: " and what was accepted; under strict_json these are errors instead. Returns false when
// no usable document came out; duplicate keys leave a usable document (the last value wins, at the first
// key's place, as in a Python dict) but still count as errors.
bool read_json_document(std::string_view text, const std::string& source_name, Json& out,
                        std::vector<Diagnostic>& errors, std::vector<Diagnostic>& warnings, SyntaxMode mode);

// Appends `key` to a dotted path; keys that would read ambiguously (empty, containing '.', '[' or spaces)
// are quoted: a.b["x.y"].
std::string join_path(std::string_view parent, std::string_view key);
std::string index_path(std::string_view parent, std::size_t index);

}  // namespace zero3::config::detail
