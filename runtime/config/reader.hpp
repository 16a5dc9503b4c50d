// The typed view of one JSON object used by every block parser: getters that check type, the range of the
// key's schema row and "auto", and report problems by JSON path, plus the end-of-block check that reports every key the
// schema does not know, with a did-you-mean, as DeepSpeed's validation of that block would treat it. One Sink collects
// all diagnostics of a parse. Internal.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "json_reader.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/config/schema.hpp"

namespace zero3::config::detail {

class Sink {
 public:
  explicit Sink(ParseResult& result) : result_(result) {}
  void error(std::string path, std::string message) { result_.errors.push_back({std::move(path), std::move(message)}); }
  void warning(std::string path, std::string message) {
    result_.warnings.push_back({std::move(path), std::move(message)});
  }
  // Something DeepSpeed silently ignores or relaxes (an unknown key of a plain-dict block, hjson syntax, a
  // value its pydantic model converts): a warning, turned into an error by make_lint_errors.
  void lint(std::string path, std::string message) {
    lint_.push_back(result_.warnings.size());
    warning(std::move(path), std::move(message));
  }
  // Strict mode: moves every lint warning into the errors, naming `why` (the switch that asked for it).
  void make_lint_errors(std::string_view why);
  void not_implemented(std::string path, std::string message) {
    result_.not_implemented.push_back({std::move(path), std::move(message)});
  }
  void resolved(std::string path, std::string value, std::string reason) {
    result_.resolved.push_back({std::move(path), std::move(value), std::move(reason)});
  }
  std::size_t error_count() const { return result_.errors.size(); }

 private:
  ParseResult& result_;
  std::vector<std::size_t> lint_;  // indices into result_.warnings
};

// How a getter found its key.
enum class Got : std::uint8_t {
  absent,     // not in the object (or null where null means "not set"); the output holds the row's default
  value,      // a valid value was stored
  automatic,  // the string "auto"; for AutoRule::ds_default the row's default is the output, recorded
  invalid,    // wrong type or out of range; an error was reported and the output holds the row's default
};

// "5.5", "true", "null", "the string \"abc\"", "an object", "an array".
std::string describe(const Json& j);
// A value as JSON text, for resolutions: 8, 0.0001, true, "cpu".
std::string json_text(std::int64_t v);
std::string json_text(double v);
std::string json_text(bool v);
std::string json_text(std::string_view v);
// Display name of a schema block: "(top level)" for "".
std::string block_label(std::string_view block);
// Edit distance between two keys (ASCII case-insensitive).
std::size_t edit_distance(std::string_view a, std::string_view b);
// The name in `names` closest to `s` when close enough to be a plausible typo, else empty.
std::string_view closest_name(std::string_view s, std::span<const std::string_view> names);
// An empty JSON object, for blocks that are absent.
const Json& empty_object();

class ObjectReader {
 public:
  // `object` must be a JSON object; `block` names its schema block (see schema.hpp).
  ObjectReader(const Json& object, std::string path, std::string_view block, Sink& sink);
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;

  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const { return join_path(path_, key); }
  Sink& sink() { return sink_; }
  bool has(std::string_view key) const;
  bool is_auto(std::string_view key) const;

  // Of a key and its alias, returns the one present (the primary when neither is); both present is an error.
  std::string_view pick(std::string_view primary, std::string_view alias);

  // The raw value, marked as read; nullptr when absent.
  const Json* raw(std::string_view key);
  // Marks a key as read without looking at it (contents deliberately unchecked).
  void skip(std::string_view key) { consumed_.insert(std::string(key)); }
  // Marks every present key the schema knows for this block as read: keys checked, values not.
  void skip_known();

  Got get_bool(std::string_view key, bool& out);
  // Integers and numbers must lie in the range of the key's schema row (ValueType).
  Got get_int(std::string_view key, std::int64_t& out);
  Got get_number(std::string_view key, double& out);
  // A number whose range depends on another key's value (the row states it in words): `range` replaces the
  // row's, which must have none.
  Got get_number_in(std::string_view key, double& out, const ValueType& range);
  Got get_string(std::string_view key, std::string& out);
  // null counts as absent and resets the output to nullopt.
  Got get_optional_int(std::string_view key, std::optional<std::int64_t>& out);
  Got get_optional_string(std::string_view key, std::optional<std::string>& out);
  // One of `choices`; ignore_case compares ASCII case-insensitively and stores the canonical spelling.
  Got get_choice(std::string_view key, std::string& out, std::span<const std::string_view> choices,
                 bool ignore_case = false);
  Got get_choice(std::string_view key, std::string& out, std::initializer_list<std::string_view> choices,
                 bool ignore_case = false) {
    return get_choice(key, out, std::span<const std::string_view>(choices.begin(), choices.size()), ignore_case);
  }
  // A sub-object: nullptr when absent, null (if null_ok) or not an object (an error is reported).
  const Json* get_object(std::string_view key, bool null_ok = false);

  // Reads a bool (default false) and reports `what` as not implemented when it is true.
  bool not_implemented_if_true(std::string_view key, std::string_view what);
  void not_implemented(std::string_view key, std::string message) {
    sink_.not_implemented(path_of(key), std::move(message));
  }
  void error(std::string_view key, std::string message) { sink_.error(path_of(key), std::move(message)); }
  void warning(std::string_view key, std::string message) { sink_.warning(path_of(key), std::move(message)); }

  // Reports every key the schema does not know for this block, with a did-you-mean: an error where DeepSpeed
  // rejects unknown keys (strict models, keyword arguments, the zero3 block), a lint warning where it ignores
  // them (plain dicts, the top level). Every known key must have been read (else an internal error).
  void finish();

 private:
  const KeySpec& spec(std::string_view key) const;
  // Every getter starts from the key's schema row: its default (where the row writes it as a JSON value of the
  // getter's type) is the output for an absent key, "auto" under ds_default and an invalid value. A default
  // stated in words ("inferred", "heads") leaves the output as the parser set it.
  void take_default(std::string_view key, bool& out) const;
  void take_default(std::string_view key, std::int64_t& out) const;
  void take_default(std::string_view key, double& out) const;
  void take_default(std::string_view key, std::string& out) const;
  void take_default(std::string_view key, std::optional<std::int64_t>& out) const;
  void take_default(std::string_view key, std::optional<std::string>& out) const;
  // "unknown key (did you mean 'x'?)", "unknown key here (it is a key of 'b')" or "unknown key (not a key of b)".
  std::string unknown_key_message(const std::string& key) const;
  // Common prologue of the getters: marks the key read; nullptr with `got` = absent when missing (or null and
  // null_is_absent), nullptr with `got` = automatic for the string "auto" unless auto_is_value.
  const Json* lookup(std::string_view key, Got& got, bool null_is_absent = false, bool auto_is_value = false);
  // Applies the key's AutoRule to an "auto" value; `default_text` is the value kept for ds_default.
  Got on_auto(std::string_view key, const std::string& default_text);
  Got type_error(std::string_view key, std::string_view expected, const Json& j);
  Got read_number(std::string_view key, double& out, const ValueType& range);
  // A value of another JSON type that DeepSpeed's pydantic model converts (lax mode): a lint warning.
  void converted(std::string_view key, const Json& j, const std::string& value);

  const Json& object_;
  std::string path_;
  std::string block_;
  Sink& sink_;
  std::set<std::string, std::less<>> consumed_;
  bool finished_ = false;
  bool lax_ = false;  // the block is a pydantic model in DeepSpeed: its lax conversions ("500" -> 500) apply
};

}  // namespace zero3::config::detail
