#include "json_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace zero3::config::detail {

namespace {

bool plain_key(std::string_view key) {
  if (key.empty()) return false;
  return std::none_of(key.begin(), key.end(), [](char c) {
    return c == '.' || c == '[' || c == ']' || c == '"' || c == ' ' || c == '\t' || c == '\n';
  });
}

// Builds the DOM through nlohmann's SAX interface so that duplicate keys are seen (the DOM parser silently
// keeps one of them) and every container knows its own JSON path.
class DomBuilder final : public nlohmann::json_sax<Json> {
 public:
  DomBuilder(Json& root, std::vector<Diagnostic>& duplicates) : root_(root), duplicates_(duplicates) {}

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(Json(v)); }
  bool string(string_t& v) override { return put(Json(std::move(v))); }
  bool binary(binary_t& v) override { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    Frame& top = stack_.back();
    if (top.node->contains(k)) {
      duplicates_.push_back({join_path(top.path, k),
                             "duplicate key (DeepSpeed rejects repeated keys; the last "
                             "value would win)"});
      top.node->erase(k);  // the last value wins, as in a Python dict
    }
    key_ = k;
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    error_position_ = position;
    error_message_ = ex.what();
    return false;
  }

  std::size_t error_position() const { return error_position_; }
  const std::string& error_message() const { return error_message_; }

 private:
  struct Frame {
    Json* node;
    std::string path;
  };

  // Places a value in the current container; returns where it went.
  Json* place(Json&& v, std::string* child_path) {
    if (stack_.empty()) {
      root_ = std::move(v);
      if (child_path) child_path->clear();
      return &root_;
    }
    Frame& top = stack_.back();
    if (top.node->is_array()) {
      if (child_path) *child_path = index_path(top.path, top.node->size());
      top.node->push_back(std::move(v));
      return &top.node->back();
    }
    if (child_path) *child_path = join_path(top.path, key_);
    Json& slot = (*top.node)[key_];
    slot = std::move(v);
    return &slot;
  }
  bool put(Json&& v) {
    place(std::move(v), nullptr);
    return true;
  }
  bool open(Json&& container) {
    std::string path;
    Json* node = place(std::move(container), &path);
    stack_.push_back({node, std::move(path)});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  Json& root_;
  std::vector<Diagnostic>& duplicates_;
  std::vector<Frame> stack_;
  std::string key_;
  std::size_t error_position_ = 0;
  std::string error_message_;
};

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error
// while parsing value - invalid literal; last read: 'x'"; keep the part after the position.
std::string parse_error_detail(const std::string& what) {
  const std::string_view marker = "syntax error";
  auto at = what.find(marker);
  if (at != std::string::npos) return what.substr(at);
  auto colon = what.find(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
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
                        std::vector<Diagnostic>& errors) {
  const bool blank =
      std::all_of(text.begin(), text.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
  if (blank) {
    errors.push_back({source_name, "empty file: a DeepSpeed config is a JSON object, e.g. {\"train_batch_size\": 8}"});
    return false;
  }
  std::vector<Diagnostic> duplicates;
  DomBuilder builder(out, duplicates);
  const bool parsed = Json::sax_parse(text, &builder, nlohmann::detail::input_format_t::json, /*strict=*/true,
                                      /*ignore_comments=*/true);
  if (!parsed) {
    // nlohmann reports the 1-based count of bytes read, so the offending byte sits at offset position - 1.
    const std::size_t pos = builder.error_position();
    LineColumn lc = line_column(text, pos > 0 ? pos - 1 : 0);
    errors.push_back({source_name, fmt::format("not valid JSON: line {}, column {}: {}", lc.line, lc.column,
                                               parse_error_detail(builder.error_message()))});
    return false;
  }
  errors.insert(errors.end(), duplicates.begin(), duplicates.end());
  if (!out.is_object()) {
    errors.push_back({source_name, fmt::format("the top level is {}; a DeepSpeed config must be a JSON object "
                                               "({{...}})",
                                               kind_of(out))});
    return false;
  }
  return true;
}

}  // namespace zero3::config::detail
