// hjson as DeepSpeed's loader reads a config file (hjson 3.1.0's decoder), to an nlohmann document: the
// parser behind read_json_document (json_reader.hpp), which turns its findings into diagnostics. Each
// relaxation of RFC 8259 it accepts is noted as a Finding; valid JSON keeps its JSON meaning. Internal.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json_reader.hpp"

namespace zero3::config::detail {

struct SyntaxFailure {
  std::size_t offset;
  std::string message;
};

struct Finding {
  std::size_t offset;
  std::string what;  // describe(kind, detail)
};

// One reading of the text: the value, or the failure, and what the parser noted on the way.
struct Reading {
  Json value;
  std::optional<SyntaxFailure> failure;
  std::vector<Finding> findings;
  std::size_t findings_left_out = 0;
  std::size_t first_left_out = 0;
  std::vector<Diagnostic> duplicates;
  std::size_t duplicates_left_out = 0;
};

// The text with CRLF and lone CR turned into LF, as Python's text mode reads a file.
std::string normalize_line_ends(std::string_view text);
// The offset of the first byte that is not valid UTF-8, or std::string_view::npos.
std::size_t invalid_utf8_at(std::string_view s);

// Where the first value starts after whitespace and comments from `start`; nullopt when there is none (an
// empty or comment-only text). `only_comments` says whether comments were seen.
std::optional<std::size_t> first_content(std::string_view s, std::size_t start, bool& only_comments);

// The whole text as hjson's decode reads it, from `start` (past a byte order mark); `first` is first_content's.
Reading read_text(std::string_view s, std::size_t start, std::size_t first);

}  // namespace zero3::config::detail
