#include "reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/json_integer.hpp"

namespace zero3::config::detail {

namespace {

char lower(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

bool in_range(double v, const ValueType& r) {
  if (r.has_min && (r.min_open ? !(v > r.min) : !(v >= r.min))) return false;
  if (r.has_max && (r.max_open ? !(v < r.max) : !(v <= r.max))) return false;
  return true;
}

std::string trimmed(std::string_view v) {
  const auto b = v.find_first_not_of(" \t\n\r");
  if (b == std::string_view::npos) return {};
  const auto e = v.find_last_not_of(" \t\n\r");
  return std::string(v.substr(b, e - b + 1));
}

// The integer pydantic's lax mode reads from a string: optional sign, digits with single underscores between
// them, optionally ".0...". nullopt for anything else.
std::optional<std::int64_t> lax_int(std::string_view text) {
  std::string t = trimmed(text);
  if (const auto dot = t.find('.'); dot != std::string::npos) {
    if (t.find_first_not_of('0', dot + 1) != std::string::npos) return std::nullopt;
    t.resize(dot);
  }
  std::string digits;
  std::size_t i = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  if (i == t.size()) return std::nullopt;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_' && !digits.empty() && i + 1 < t.size() && t[i + 1] != '_') continue;
    if (c < '0' || c > '9') return std::nullopt;
    digits += c;
  }
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  const std::int64_t v = std::stoll(digits);
  return t[0] == '-' ? -v : v;
}

// The boolean pydantic's lax mode reads from a string or a number.
std::optional<bool> lax_bool(const Json& j) {
  if (j.is_number()) {
    const double d = j.get<double>();
    if (d == 0.0) return false;
    if (d == 1.0) return true;
    return std::nullopt;
  }
  if (!j.is_string()) return std::nullopt;
  std::string t = trimmed(j.get_ref<const std::string&>());
  std::transform(t.begin(), t.end(), t.begin(), [](char c) { return lower(c); });
  for (std::string_view yes : {"1", "true", "t", "yes", "y", "on"}) {
    if (t == yes) return true;
  }
  for (std::string_view no : {"0", "false", "f", "no", "n", "off"}) {
    if (t == no) return false;
  }
  return std::nullopt;
}

// The number pydantic's lax mode reads from a string ("1e-3", " 0.5 "); nullopt unless the whole text is one.
std::optional<double> lax_number(std::string_view text) {
  const std::string t = trimmed(text);
  if (t.empty()) return std::nullopt;
  const Json parsed = Json::parse(t, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_number()) return std::nullopt;
  return parsed.get<double>();
}

}  // namespace

std::string describe(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return j.get<bool>() ? "true" : "false";
    case Json::value_t::string:
      return fmt::format("the string {}", j.dump());
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    default:
      return j.dump();
  }
}

std::string json_text(std::int64_t v) {
  return std::to_string(v);
}
std::string json_text(double v) {
  return Json(v).dump();
}
std::string json_text(bool v) {
  return v ? "true" : "false";
}
std::string json_text(std::string_view v) {
  return Json(std::string(v)).dump();
}

std::string block_label(std::string_view block) {
  return block.empty() ? std::string("(top level)") : std::string(block);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t subst = prev[j - 1] + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string_view closest_name(std::string_view s, std::span<const std::string_view> names) {
  std::string_view best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (auto n : names) {
    const std::size_t d = edit_distance(s, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best_d <= std::max<std::size_t>(2, s.size() / 3) ? best : std::string_view{};
}

const Json& empty_object() {
  static const Json kEmpty = Json::object();
  return kEmpty;
}

void Sink::make_lint_errors(std::string_view why) {
  if (lint_.empty()) return;
  std::vector<Diagnostic> kept;
  std::size_t next = 0;
  for (std::size_t i = 0; i < result_.warnings.size(); ++i) {
    Diagnostic& w = result_.warnings[i];
    if (next < lint_.size() && lint_[next] == i) {
      ++next;
      result_.errors.push_back({std::move(w.path), fmt::format("{} [an error under {}]", w.message, why)});
    } else {
      kept.push_back(std::move(w));
    }
  }
  result_.warnings = std::move(kept);
  lint_.clear();
  result_.config.reset();
}

ObjectReader::ObjectReader(const Json& object, std::string path, std::string_view block, Sink& sink)
    : object_(object), path_(std::move(path)), block_(block), sink_(sink) {
  ZERO3_CHECK(object_.is_object(), "ObjectReader needs a JSON object");
  const BlockRule* rule = find_block_rule(block_);
  lax_ = rule != nullptr && rule->validation == Validation::strict_model;
}

void ObjectReader::converted(std::string_view key, const Json& j, const std::string& value) {
  sink_.lint(path_of(key), fmt::format("{} is read as {}, as DeepSpeed's pydantic model converts it; write {}",
                                       describe(j), value, value));
}

const KeySpec& ObjectReader::spec(std::string_view key) const {
  const KeySpec* s = find_key(block_, key);
  if (s == nullptr) {
    throw UsageError(fmt::format("config parser reads '{}' in block '{}', which the schema does not list", key,
                                 block_label(block_)));
  }
  return *s;
}

namespace {

// A row's default as JSON; discarded where the row states it in words ("inferred", "heads", "-").
Json row_default(const KeySpec& k) {
  return Json::parse(k.default_value, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

void ObjectReader::take_default(std::string_view key, bool& out) const {
  const Json d = row_default(spec(key));
  if (d.is_boolean()) out = d.get<bool>();
}
void ObjectReader::take_default(std::string_view key, std::int64_t& out) const {
  if (const auto v = json_integer_or_integral_float(row_default(spec(key)))) out = *v;
}
void ObjectReader::take_default(std::string_view key, double& out) const {
  const Json d = row_default(spec(key));
  if (d.is_number()) out = d.get<double>();
}
void ObjectReader::take_default(std::string_view key, std::string& out) const {
  const Json d = row_default(spec(key));
  if (d.is_string()) out = d.get<std::string>();
}
void ObjectReader::take_default(std::string_view key, std::optional<std::int64_t>& out) const {
  const Json d = row_default(spec(key));
  if (d.is_null()) out.reset();
  if (const auto v = json_integer_or_integral_float(d)) out = *v;
}
void ObjectReader::take_default(std::string_view key, std::optional<std::string>& out) const {
  const Json d = row_default(spec(key));
  if (d.is_null()) out.reset();
  if (d.is_string()) out = d.get<std::string>();
}

bool ObjectReader::has(std::string_view key) const {
  return object_.find(key) != object_.end();
}

bool ObjectReader::is_auto(std::string_view key) const {
  auto it = object_.find(key);
  return it != object_.end() && it->is_string() && it->get_ref<const std::string&>() == "auto";
}

std::string_view ObjectReader::pick(std::string_view primary, std::string_view alias) {
  const bool p = has(primary), a = has(alias);
  if (p && a) {
    error(alias, fmt::format("both '{}' and its alias '{}' are given; keep one", primary, alias));
    skip(alias);
  }
  return (a && !p) ? alias : primary;
}

const Json* ObjectReader::raw(std::string_view key) {
  spec(key);
  consumed_.insert(std::string(key));
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

const Json* ObjectReader::lookup(std::string_view key, Got& got, bool null_is_absent, bool auto_is_value) {
  const Json* j = raw(key);
  if (j == nullptr || (null_is_absent && j->is_null())) {
    got = Got::absent;
    return nullptr;
  }
  if (!auto_is_value && j->is_string() && j->get_ref<const std::string&>() == "auto") {
    got = Got::automatic;
    return nullptr;
  }
  got = Got::value;
  return j;
}

Got ObjectReader::on_auto(std::string_view key, const std::string& default_text) {
  switch (spec(key).auto_rule) {
    case AutoRule::rejected:
      error(key, "\"auto\" is not accepted here (DeepSpeed would pass the string on unchanged); give a value");
      return Got::invalid;
    case AutoRule::ds_default:
      sink_.resolved(path_of(key), default_text, "\"auto\": the DeepSpeed default");
      return Got::automatic;
    case AutoRule::resolved:
      return Got::automatic;
  }
  return Got::invalid;
}

Got ObjectReader::type_error(std::string_view key, std::string_view expected, const Json& j) {
  error(key, fmt::format("expected {}, got {}", expected, describe(j)));
  return Got::invalid;
}

Got ObjectReader::get_bool(std::string_view key, bool& out) {
  take_default(key, out);
  Got got;
  const Json* j = lookup(key, got);
  if (got == Got::automatic) return on_auto(key, json_text(out));
  if (j == nullptr) return got;
  if (!j->is_boolean()) {
    const std::optional<bool> v = lax_ ? lax_bool(*j) : std::nullopt;
    if (!v) return type_error(key, "true or false", *j);
    converted(key, *j, json_text(*v));
    out = *v;
    return Got::value;
  }
  out = j->get<bool>();
  return Got::value;
}

Got ObjectReader::get_int(std::string_view key, std::int64_t& out) {
  take_default(key, out);
  const ValueType& range = spec(key).type;
  Got got;
  const Json* j = lookup(key, got);
  if (got == Got::automatic) return on_auto(key, json_text(out));
  if (j == nullptr) return got;
  const std::string expected = range.has_range() ? "an integer " + range_text(range) : "an integer";
  std::optional<std::int64_t> v;
  if (!j->is_number()) {
    if (lax_ && j->is_string()) v = lax_int(j->get_ref<const std::string&>());
    if (!v) return type_error(key, expected, *j);
    converted(key, *j, json_text(*v));
  } else {
    v = json_integer_or_integral_float(*j);
  }
  if (json_fractional(*j)) {
    error(key, fmt::format("expected {}, got {} (a fractional number)", expected, j->dump()));
    return Got::invalid;
  }
  // The row's own range first, in its words; then the range of the type the value lands in, which a value
  // past int64 (1e30) is out of too.
  if (v && !in_range(static_cast<double>(*v), range)) {
    error(key, fmt::format("must be {}, got {}", range_text(range), j->dump()));
    return Got::invalid;
  }
  if (!v || *v < range.held_min || *v > range.held_max) {
    error(key, fmt::format("{} is out of range ({} .. {}, a {}-bit integer)", j->dump(), int_lowest(range),
                           int_highest(range), range.held_bits));
    return Got::invalid;
  }
  out = *v;
  return Got::value;
}

Got ObjectReader::get_optional_int(std::string_view key, std::optional<std::int64_t>& out) {
  take_default(key, out);
  if (has(key) && object_.find(key)->is_null()) {
    consumed_.insert(std::string(key));
    spec(key);
    out.reset();
    return Got::absent;
  }
  std::int64_t v = out.value_or(0);
  Got got = get_int(key, v);
  if (got == Got::value) out = v;
  return got;
}

Got ObjectReader::get_number(std::string_view key, double& out) {
  return read_number(key, out, spec(key).type);
}

Got ObjectReader::get_number_in(std::string_view key, double& out, const ValueType& range) {
  if (spec(key).type.has_range()) {
    throw UsageError(fmt::format("config parser gives '{}' a range its schema row already states", path_of(key)));
  }
  return read_number(key, out, range);
}

Got ObjectReader::read_number(std::string_view key, double& out, const ValueType& range) {
  take_default(key, out);
  Got got;
  const Json* j = lookup(key, got);
  if (got == Got::automatic) return on_auto(key, json_text(out));
  if (j == nullptr) return got;
  const std::string expected = range.has_range() ? "a number " + range_text(range) : "a number";
  double v = 0.0;
  if (j->is_number()) {
    v = j->get<double>();
  } else {
    std::optional<double> lax;
    if (lax_ && j->is_string()) lax = lax_number(j->get_ref<const std::string&>());
    if (!lax) return type_error(key, expected, *j);
    v = *lax;
    if (std::isfinite(v)) converted(key, *j, json_text(v));
  }
  if (!std::isfinite(v)) return type_error(key, "a finite number", *j);
  if (!in_range(v, range)) {
    error(key, fmt::format("must be {}, got {}", range_text(range), j->dump()));
    return Got::invalid;
  }
  out = v;
  return Got::value;
}

Got ObjectReader::get_string(std::string_view key, std::string& out) {
  take_default(key, out);
  Got got;
  const Json* j = lookup(key, got);
  if (got == Got::automatic) return on_auto(key, json_text(out));
  if (j == nullptr) return got;
  if (!j->is_string()) return type_error(key, "a string", *j);
  out = j->get<std::string>();
  return Got::value;
}

Got ObjectReader::get_optional_string(std::string_view key, std::optional<std::string>& out) {
  take_default(key, out);
  Got got;
  const Json* j = lookup(key, got, /*null_is_absent=*/true);
  if (got == Got::automatic) return on_auto(key, out ? json_text(*out) : std::string("null"));
  if (j == nullptr) {
    if (has(key)) out.reset();  // explicit null
    return got;
  }
  if (!j->is_string()) return type_error(key, "a string or null", *j);
  out = j->get<std::string>();
  return Got::value;
}

Got ObjectReader::get_choice(std::string_view key, std::string& out, std::span<const std::string_view> choices,
                             bool ignore_case) {
  take_default(key, out);
  const bool auto_is_choice = std::find(choices.begin(), choices.end(), "auto") != choices.end();
  Got got;
  const Json* j = lookup(key, got, false, auto_is_choice);
  if (got == Got::automatic) return on_auto(key, json_text(out));
  if (j == nullptr) return got;
  std::string list;
  for (auto c : choices) list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", c);
  if (!j->is_string()) return type_error(key, "one of " + list, *j);
  const auto& s = j->get_ref<const std::string&>();
  for (auto c : choices) {
    if (ignore_case ? iequal(s, c) : s == c) {
      out = std::string(c);
      return Got::value;
    }
  }
  error(key, fmt::format("expected one of {}{}, got {}", list, ignore_case ? " (any case)" : "", describe(*j)));
  return Got::invalid;
}

const Json* ObjectReader::get_object(std::string_view key, bool null_ok) {
  const Json* j = raw(key);
  if (j == nullptr) return nullptr;
  if (j->is_null() && null_ok) return nullptr;
  if (!j->is_object()) {
    type_error(key, null_ok ? "an object or null" : "an object", *j);
    return nullptr;
  }
  return j;
}

bool ObjectReader::not_implemented_if_true(std::string_view key, std::string_view what) {
  bool v = false;
  if (get_bool(key, v) == Got::value && v) not_implemented(key, std::string(what));
  return v;
}

void ObjectReader::skip_known() {
  for (const auto& item : object_.items()) {
    if (find_key(block_, item.key()) != nullptr) consumed_.insert(item.key());
  }
}

std::string ObjectReader::unknown_key_message(const std::string& key) const {
  const auto keys = known_keys();
  // Did you mean: the closest key of this block, if close enough to be a plausible typo.
  std::string_view best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& k : keys) {
    if (k.block != block_) continue;
    const std::size_t d = edit_distance(key, k.key);
    if (d < best_d) {
      best_d = d;
      best = k.key;
    }
  }
  if (!best.empty() && best_d <= std::max<std::size_t>(2, key.size() / 3)) {
    return fmt::format("unknown key (did you mean '{}'?)", best);
  }
  // Maybe a real key written in the wrong block.
  std::string where;
  for (const auto& k : keys) {
    if (k.block != block_ && k.key == key)
      where += fmt::format("{}'{}'", where.empty() ? "" : ", ", block_label(k.block));
  }
  if (!where.empty()) return fmt::format("unknown key here (it is a key of {})", where);
  return fmt::format("unknown key (not a key of {})", block_label(block_));
}

void ObjectReader::finish() {
  if (finished_) return;
  finished_ = true;
  const BlockRule* rule = find_block_rule(block_);
  for (const auto& item : object_.items()) {
    const std::string& key = item.key();
    if (consumed_.count(key) != 0) continue;
    if (find_key(block_, key) != nullptr) {
      sink_.error(path_of(key), "internal error: zero3's parser does not read this known key (please report)");
      continue;
    }
    const std::string message = unknown_key_message(key);
    const Validation v = rule != nullptr ? rule->validation : Validation::zero3_own;
    // The class or function name alone ("DeepSpeedZeroConfig"), without the file it lives in.
    const std::string_view reader = rule != nullptr ? rule->reader.substr(0, rule->reader.find(" (")) : "";
    switch (v) {
      case Validation::plain_dict:
        sink_.lint(path_of(key), fmt::format("{}; ignored, as DeepSpeed ignores unknown keys {}", message,
                                             block_.empty() ? std::string("at the top level")
                                                            : fmt::format("in '{}'", block_label(block_))));
        break;
      case Validation::strict_model:
        sink_.error(path_of(key),
                    fmt::format("{}; DeepSpeed rejects it too ({}: extra inputs are not permitted)", message, reader));
        break;
      case Validation::keyword_args:
        sink_.error(path_of(key), fmt::format("{}; DeepSpeed rejects it too (an unexpected keyword argument of {})",
                                              message, reader));
        break;
      case Validation::zero3_own:
        sink_.error(path_of(key), message);
        break;
    }
  }
}

}  // namespace zero3::config::detail
