#include "hjson_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>
#include <unordered_map>
#include <utility>

namespace zero3::config::detail {

namespace {
constexpr std::size_t kNone = std::string_view::npos;
}  // namespace

// DeepSpeed opens the file in Python's text mode, where "\r\n" and a lone "\r" both end a line.
std::string normalize_line_ends(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out += text[i];
    } else if (i + 1 >= text.size() || text[i + 1] != '\n') {
      out += '\n';
    }
  }
  return out;
}

// Offset of the first byte that does not belong to a well-formed UTF-8 sequence (no overlongs, no
// surrogates, nothing past U+10FFFF), or kNone. Python's UTF-8 decoder accepts exactly these.
std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (std::size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += len;
  }
  return kNone;
}

namespace {

constexpr std::size_t kMaxDepth = 512;    // hjson itself fails near Python's recursion limit (1000)
constexpr std::size_t kMaxReported = 20;  // per list (relaxations, duplicate keys); then one "and N more"
constexpr std::size_t kDetailBytes = 60;  // quoted text in a message is cut here

std::size_t count_code_points(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// Python's str.strip() removes every character for which str.isspace() holds; hjson strips quoteless
// values and keys with it. These are those characters, as UTF-8.
bool is_python_space(std::string_view seq) {
  if (seq.size() == 1) return std::string_view(" \t\n\v\f\r\x1c\x1d\x1e\x1f").find(seq[0]) != kNone;
  static constexpr std::array<std::string_view, 19> kWide = {
      "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83",
      "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A",
      "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  return std::find(kWide.begin(), kWide.end(), seq) != kWide.end();
}

// Length of the Python whitespace character at the front (back) of `s`, 0 if there is none.
std::size_t python_space_front(std::string_view s) {
  for (std::size_t len = 1; len <= 3 && len <= s.size(); ++len) {
    if (is_python_space(s.substr(0, len))) return len;
  }
  return 0;
}
std::size_t python_space_back(std::string_view s) {
  for (std::size_t len = 1; len <= 3 && len <= s.size(); ++len) {
    if (is_python_space(s.substr(s.size() - len))) return len;
  }
  return 0;
}

std::string_view python_rstrip(std::string_view s) {
  while (std::size_t len = python_space_back(s)) s.remove_suffix(len);
  return s;
}
std::string_view python_strip(std::string_view s) {
  while (std::size_t len = python_space_front(s)) s.remove_prefix(len);
  return python_rstrip(s);
}

// `text` as a JSON string literal, cut to kDetailBytes (at a character boundary).
std::string json_quoted(std::string_view text) {
  std::string cut(text.substr(0, kDetailBytes));
  if (cut.size() < text.size()) {
    while (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0xC0) == 0x80) cut.pop_back();
    if (!cut.empty() && static_cast<unsigned char>(cut.back()) >= 0xC0) cut.pop_back();
    return Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace) + "...";
  }
  return Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string describe_char(char c) {
  const auto b = static_cast<unsigned char>(c);
  if (b >= 0x20 && b < 0x7F) return fmt::format("'{}'", c);
  if (b >= 0x80) return "a non-ASCII character";
  return fmt::format("control character U+{:04X}", b);
}

// ---- the parser

// What hjson accepts beyond RFC 8259, one kind per message.
enum class Relaxation : std::uint8_t {
  hash_comment,
  line_comment,
  block_comment,
  trailing_comma,
  missing_comma,
  unquoted_key,
  quoteless_string,
  single_quoted_string,
  multiline_string,
  apostrophe_escape,
  root_without_braces,
};
constexpr std::size_t kRelaxationKinds = 11;

std::string describe(Relaxation kind, std::string_view detail) {
  switch (kind) {
    case Relaxation::hash_comment:
      return "a # comment";
    case Relaxation::line_comment:
      return "a // comment";
    case Relaxation::block_comment:
      return "a /* */ comment";
    case Relaxation::trailing_comma:
      return fmt::format("a trailing comma before {}", detail);
    case Relaxation::missing_comma:
      return fmt::format("no comma between two {}", detail);
    case Relaxation::unquoted_key:
      return fmt::format("the unquoted key {}", json_quoted(detail));
    case Relaxation::quoteless_string: {
      std::string note = detail.empty() || detail.back() != ',' ? "" : "; the ',' is part of the string";
      return fmt::format(
          "the quoteless string {} (an unquoted value that is not a JSON number, true, false or null is text "
          "to the end of its line{})",
          json_quoted(detail), note);
    }
    case Relaxation::single_quoted_string:
      return "a single-quoted string";
    case Relaxation::multiline_string:
      return "a '''multi-line''' string";
    case Relaxation::apostrophe_escape:
      return "the escape \\' in a string";
    case Relaxation::root_without_braces:
      return "a top-level object without its { } braces";
  }
  return "an hjson relaxation";
}

// Reads hjson as hjson 3.1.0's decoder does (decoder.py: getNext, scanKeyName, scantfnns, mlscanstring,
// JSONObject, JSONArray), except that valid JSON keeps its JSON meaning (hjson turns 1.0 into 1). Throws
// SyntaxFailure at the first error. Each relaxation is noted once per kind and line; duplicate keys are
// collected with their JSON path. Linear in the text: keys are indexed, findings past the cap only counted.
class HjsonParser {
 public:
  HjsonParser(std::string_view text, std::size_t start) : s_(text), pos_(start) {}

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  std::size_t pos() const { return pos_; }

  // Whitespace and comments (hjson's getNext).
  void skip_space() {
    for (;;) {
      while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
      if (at_end()) return;
      const char next = pos_ + 1 < s_.size() ? s_[pos_ + 1] : '\0';
      if (s_[pos_] == '#' || (s_[pos_] == '/' && next == '/')) {
        note(s_[pos_] == '#' ? Relaxation::hash_comment : Relaxation::line_comment, pos_);
        pos_ = std::min(s_.find('\n', pos_), s_.size());
      } else if (s_[pos_] == '/' && next == '*') {
        note(Relaxation::block_comment, pos_);
        const std::size_t close = s_.find("*/", pos_ + 2);
        if (close == kNone) fail(pos_, "the /* comment that starts here is never closed with */");
        pos_ = close + 2;
      } else {
        return;
      }
    }
  }

  Json parse_value() {
    if (at_end()) fail(pos_, "expected a value, found the end of the file");
    switch (s_[pos_]) {
      case '{':
        return parse_members(pos_);
      case '[':
        return parse_array();
      case '"':
        return Json(parse_quoted());
      case '\'':
        return Json(s_.compare(pos_, 3, "'''") == 0 ? parse_multiline() : parse_quoted());
      case '}':
      case ']':
      case ',':
      case ':':
        fail(pos_, fmt::format("expected a value, found '{}'", s_[pos_]));
      default:
        return parse_quoteless();
    }
  }

  // An object's members; `open` is the offset of its '{', or kNone for a top level without braces, which
  // ends at the end of the file.
  Json parse_members(std::size_t open) {
    const bool braced = open != kNone;
    const DepthGuard guard(*this, open);
    Json obj = Json::object();
    auto& members = static_cast<Json::object_t::Container&>(obj.get_ref<Json::object_t&>());
    std::unordered_map<std::string, std::size_t> index;  // key -> member, so repeats are found in O(1)
    if (braced) {
      ++pos_;
      skip_space();
      if (peek() == '}') {
        ++pos_;
        return obj;
      }
    }
    for (;;) {
      if (at_end()) fail_unclosed(open, '}');
      std::string key = parse_key();
      skip_space();
      if (peek() != ':') {
        fail(pos_, at_end() ? "expected ':' after the key, found the end of the file"
                            : fmt::format("expected ':' after the key {}, found {}", json_quoted(key),
                                          describe_char(peek())));
      }
      ++pos_;
      skip_space();
      path_.push_back({&key, 0});
      Json value = parse_value();
      path_.pop_back();
      auto [it, fresh] = index.try_emplace(key, members.size());
      if (fresh) {
        members.emplace_back(std::move(key), std::move(value));
      } else {
        note_duplicate(key);
        members[it->second].second = std::move(value);
      }
      if (end_of_container(braced ? '}' : '\0', "members")) return obj;
    }
  }

  // Shapes of the top level other than a braced object or an array.
  void note_root_without_braces() { note(Relaxation::root_without_braces, pos_); }

  std::vector<Finding>& findings() { return findings_; }
  std::size_t findings_left_out() const { return findings_left_out_; }
  std::size_t first_left_out() const { return first_left_out_; }
  std::vector<Diagnostic>& duplicates() { return duplicates_; }
  std::size_t duplicates_left_out() const { return duplicates_left_out_; }

  [[noreturn]] static void fail(std::size_t offset, std::string message) {
    throw SyntaxFailure{offset, std::move(message)};
  }

 private:
  struct PathStep {
    const std::string* key;  // null for an array element
    std::size_t index;
  };

  class DepthGuard {
   public:
    DepthGuard(HjsonParser& p, std::size_t at) : p_(p) {
      if (++p_.depth_ > kMaxDepth) fail(at, fmt::format("nesting deeper than {} levels", kMaxDepth));
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    HjsonParser& p_;
  };

  [[noreturn]] void fail_unclosed(std::size_t open, char closer) const {
    const LineColumn lc = line_column(s_, open);
    fail(pos_, fmt::format("the end of the file inside the {} that opens at line {}, column {} (missing '{}'?)",
                           closer == '}' ? "object" : "array", lc.line, lc.column, closer));
  }

  // After a member or element: an optional comma, then the closer (`closer` '\0': the end of the file).
  // Returns true when the container ended; notes a trailing or a missing comma.
  bool end_of_container(char closer, std::string_view items) {
    skip_space();
    std::size_t comma = kNone;
    if (peek() == ',') {
      comma = pos_++;
      skip_space();
    }
    const bool closed = closer == '\0' ? at_end() : (!at_end() && s_[pos_] == closer);
    if (closed) {
      if (comma != kNone)
        note(Relaxation::trailing_comma, comma, closer == '}' ? "'}'" : closer == ']' ? "']'" : "the end of the file");
      if (closer != '\0') ++pos_;
      return true;
    }
    if (comma == kNone && !at_end()) note(Relaxation::missing_comma, pos_, items);
    return false;
  }

  Json parse_array() {
    const std::size_t open = pos_;
    const DepthGuard guard(*this, open);
    Json arr = Json::array();
    ++pos_;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      if (at_end()) fail_unclosed(open, ']');
      path_.push_back({nullptr, arr.size()});
      arr.push_back(parse_value());
      path_.pop_back();
      if (end_of_container(']', "elements")) return arr;
    }
  }

  // A key: quoted, or everything up to ':' (hjson's scanKeyName: no {}[], and no inner whitespace).
  std::string parse_key() {
    if (s_[pos_] == '"' || s_[pos_] == '\'') return parse_quoted();
    const std::size_t begin = pos_;
    std::size_t space = kNone;  // the last whitespace of the first whitespace run
    for (;; ++pos_) {
      if (at_end()) fail(begin, "the end of the file inside the key name that starts here");
      const char c = s_[pos_];
      if (c == ':') {
        if (pos_ == begin) fail(pos_, "':' without a key name before it (an empty key needs quotes: \"\")");
        std::string_view name = s_.substr(begin, pos_ - begin);
        if (space != kNone) {
          if (space != pos_ - 1) fail(space, "whitespace inside an unquoted key name (quote the key)");
          name = python_rstrip(name);
        }
        note(Relaxation::unquoted_key, begin, name);
        return std::string(name);
      }
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if (space == kNone || space == pos_ - 1) space = pos_;
      } else if (c == '{' || c == '}' || c == '[' || c == ']' || c == ',') {
        fail(pos_, fmt::format("found '{}' where a key name was expected (quote a key that holds {{}}[],: or "
                               "whitespace)",
                               c));
      }
    }
  }

  // A "..." or '...' string (hjson's scanstring): JSON escapes plus \', no raw control characters.
  std::string parse_quoted() {
    const std::size_t open = pos_;
    const char quote = s_[pos_++];
    if (quote == '\'') note(Relaxation::single_quoted_string, open);
    std::string out;
    for (;;) {
      if (at_end()) fail(open, "the string that starts here has no closing quote");
      const char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail(pos_, c == '\n' ? std::string("a line break inside a string (is the closing quote missing? write a "
                                           "line break as \\n)")
                             : fmt::format("{} inside a string (write it as an escape)", describe_char(c)));
      }
      if (c == '\\') {
        parse_escape(quote, out);
      } else {
        out += c;
        ++pos_;
      }
    }
  }

  void parse_escape(char quote, std::string& out) {
    const std::size_t at = pos_++;
    if (at_end()) fail(at, "the string ends inside an escape");
    const char e = s_[pos_++];
    switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        return;
      case '\'':
        out += e;
        if (quote == '"') note(Relaxation::apostrophe_escape, at);
        return;
      case 'b':
        out += '\b';
        return;
      case 'f':
        out += '\f';
        return;
      case 'n':
        out += '\n';
        return;
      case 'r':
        out += '\r';
        return;
      case 't':
        out += '\t';
        return;
      case 'u':
        append_utf8(out, parse_unicode_escape(at));
        return;
      default:
        fail(at, fmt::format("invalid escape: a backslash followed by {}", describe_char(e)));
    }
  }

  // 4 hex digits at pos_ (hjson also takes what Python's int(x, 16) takes, " 1f" or "1_2f": too exotic).
  std::uint32_t read_hex4(std::size_t at) {
    if (pos_ + 4 > s_.size()) fail(at, "invalid \\u escape: 4 hex digits expected");
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char h = s_[pos_ + k];
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) fail(at, "invalid \\u escape: 4 hex digits expected");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    pos_ += 4;
    return v;
  }

  std::uint32_t parse_unicode_escape(std::size_t at) {
    const std::uint32_t u = read_hex4(at);
    if (u >= 0xDC00 && u <= 0xDFFF) fail(at, unpaired_surrogate(u));
    if (u < 0xD800 || u > 0xDBFF) return u;
    if (s_.compare(pos_, 2, "\\u") != 0) fail(at, unpaired_surrogate(u));
    pos_ += 2;
    const std::uint32_t low = read_hex4(pos_ - 2);
    if (low < 0xDC00 || low > 0xDFFF) fail(at, unpaired_surrogate(u));
    return 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
  }

  static std::string unpaired_surrogate(std::uint32_t u) {
    return fmt::format(
        "\\u{:04X} is half of a UTF-16 surrogate pair without its other half (hjson accepts "
        "this; zero3 does not: it is no character)",
        u);
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // hjson's mlscanstring: the indent is the column of the opening ''' in characters; each content line
  // loses up to that many leading spaces/tabs; one final line break is dropped.
  std::string parse_multiline() {
    const std::size_t open = pos_;
    note(Relaxation::multiline_string, open);
    const std::size_t indent = multiline_indent(open);
    pos_ += 3;
    skip_indent(kNone);
    if (at_end()) fail(open, "the ''' string that starts here is never closed with '''");
    if (s_[pos_] == '\n') {
      ++pos_;
      skip_indent(indent);
    }
    std::string out;
    std::size_t quotes = 0;
    for (;;) {
      if (at_end()) fail(open, "the ''' string that starts here is never closed with '''");
      const char c = s_[pos_++];
      if (c == '\'') {
        if (++quotes < 3) continue;
        if (!out.empty() && out.back() == '\n') out.pop_back();
        return out;
      }
      out.append(quotes, '\'');
      quotes = 0;
      if (c == '\n') {
        out += c;
        skip_indent(indent);
      } else if (c != '\r') {
        out += c;
      }
    }
  }

  // hjson counts back from ''' to the previous line break; on the first line Python's negative indexes wrap
  // around to the last line of the file, so that line's length counts too (none: hjson fails).
  std::size_t multiline_indent(std::size_t open) const {
    const std::size_t nl = open == 0 ? kNone : s_.rfind('\n', open - 1);
    if (nl != kNone) return count_code_points(s_.substr(nl + 1, open - nl - 1));
    const std::size_t last = s_.rfind('\n');
    if (last == kNone) fail(open, "a ''' string in a file of one line (hjson fails on it too)");
    return count_code_points(s_.substr(0, open)) + count_code_points(s_.substr(last + 1));
  }

  void skip_indent(std::size_t n) {
    while (n > 0 && !at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
      if (n != kNone) --n;
    }
  }

  bool ends_quoteless_token(std::size_t p) const {
    const char c = s_[p];
    if (c == ',' || c == '}' || c == ']' || c == '#') return true;
    return c == '/' && p + 1 < s_.size() && (s_[p + 1] == '/' || s_[p + 1] == '*');
  }

  // hjson's NUMBER_RE at `begin` ([\t ]*-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?[\t ]*), greedy. `token_end`
  // excludes the trailing blanks, `end` includes them. `unicode_digit_risk`: a digit run is followed by a
  // non-ASCII character, which Python's \d might take as a digit.
  struct NumberShape {
    std::size_t token_end = kNone;
    std::size_t end = kNone;
    bool unicode_digit_risk = false;
  };
  NumberShape number_shape(std::size_t begin) const {
    NumberShape shape;
    auto digit = [&](std::size_t p) { return p < s_.size() && s_[p] >= '0' && s_[p] <= '9'; };
    auto non_ascii = [&](std::size_t p) { return p < s_.size() && static_cast<unsigned char>(s_[p]) >= 0x80; };
    auto digits = [&](std::size_t p) {
      while (digit(p)) ++p;
      shape.unicode_digit_risk = shape.unicode_digit_risk || non_ascii(p);
      return p;
    };
    std::size_t p = begin;
    if (p < s_.size() && s_[p] == '-') ++p;
    if (!digit(p)) return shape;
    p = s_[p] == '0' ? p + 1 : digits(p);
    if (p < s_.size() && s_[p] == '.') {
      if (digit(p + 1)) p = digits(p + 1);
      shape.unicode_digit_risk = shape.unicode_digit_risk || non_ascii(p + 1);
    }
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      std::size_t q = p + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (digit(q)) p = digits(q);
      shape.unicode_digit_risk = shape.unicode_digit_risk || non_ascii(q);
    }
    shape.token_end = p;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    shape.end = p;
    return shape;
  }

  // hjson's scantfnns: a value without quotes. At each point where a token may end (',', '}', ']', a
  // comment, the line end) it is true/false/null or a number if the text so far is exactly one; otherwise
  // it goes on, and at the line end it is the (stripped) text.
  Json parse_quoteless() {
    const std::size_t begin = pos_;
    const NumberShape number = number_shape(begin);
    std::size_t word_end = kNone, word_space_end = kNone;
    Json word;
    for (auto [text, value] :
         {std::pair<std::string_view, Json>{"true", Json(true)}, {"false", Json(false)}, {"null", Json(nullptr)}}) {
      if (s_.compare(begin, text.size(), text) != 0) continue;
      word_end = word_space_end = begin + text.size();
      while (word_space_end < s_.size() && s_[word_space_end] != '\n') {
        const std::size_t len = python_space_front(s_.substr(word_space_end, 3));
        if (len == 0) break;
        word_space_end += len;
      }
      word = value;
    }
    for (std::size_t p = begin;; ++p) {
      const bool eol = p >= s_.size() || s_[p] == '\n' || s_[p] == '\r';
      if (!eol && !ends_quoteless_token(p)) continue;
      if (word_end != kNone && word_end <= p && p <= word_space_end) {
        pos_ = p;
        return word;
      }
      if (number.end == p) {
        pos_ = p;
        return parse_number(begin, number.token_end);
      }
      if (!eol) continue;
      if (number.unicode_digit_risk) {
        fail(begin,
             "a number directly followed by a non-ASCII character: hjson may read it as a digit "
             "(Python's \\d); zero3 does not guess (quote the value, or put a space after the number)");
      }
      const std::string_view text = python_strip(s_.substr(begin, p - begin));
      note(Relaxation::quoteless_string, begin, text);
      pos_ = p;
      return Json(std::string(text));
    }
  }

  // The JSON number s_[begin, end): nlohmann's conversion, as for a strict JSON file (integers to int64 or
  // uint64, anything larger to double).
  Json parse_number(std::size_t begin, std::size_t end) const {
    const std::string_view token = s_.substr(begin, end - begin);
    try {
      return Json::parse(token);
    } catch (const Json::exception&) {
      fail(begin, fmt::format("the number {} is out of range", token.substr(0, kDetailBytes)));
    }
  }

  // ---- findings

  // The line of `offset`; offsets come almost in order, so a cursor moves over the text (backwards only over
  // the blanks and comments between a trailing comma and its closer, which no two commas share).
  std::size_t line_of(std::size_t offset) {
    if (offset >= cursor_) {
      line_at_cursor_ += static_cast<std::size_t>(std::count(s_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                                                             s_.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
      cursor_ = offset;
      return line_at_cursor_;
    }
    return line_at_cursor_ -
           static_cast<std::size_t>(std::count(s_.begin() + static_cast<std::ptrdiff_t>(offset),
                                               s_.begin() + static_cast<std::ptrdiff_t>(cursor_), '\n'));
  }

  void note(Relaxation kind, std::size_t offset, std::string_view detail = {}) {
    const std::size_t line = line_of(offset);
    std::size_t& last = last_line_[static_cast<std::size_t>(kind)];
    if (last == line) return;  // one per kind and line
    last = line;
    if (findings_.size() < kMaxReported) {
      findings_.push_back({offset, describe(kind, detail)});
    } else {
      if (findings_left_out_++ == 0) first_left_out_ = offset;
    }
  }

  void note_duplicate(const std::string& key) {
    if (duplicates_.size() >= kMaxReported) {
      ++duplicates_left_out_;
      return;
    }
    std::string path;
    for (const PathStep& step : path_) path = step.key ? join_path(path, *step.key) : index_path(path, step.index);
    duplicates_.push_back({join_path(path, key),
                           "duplicate key (DeepSpeed rejects repeated keys; the last "
                           "value would win)"});
  }

  std::string_view s_;
  std::size_t pos_;
  std::size_t depth_ = 0;
  std::vector<PathStep> path_;  // where the value being read sits, for duplicate-key paths
  std::vector<Finding> findings_;
  std::size_t findings_left_out_ = 0;
  std::size_t first_left_out_ = 0;
  std::array<std::size_t, kRelaxationKinds> last_line_{};  // lines are 1-based, so 0 = none yet
  std::size_t cursor_ = 0;
  std::size_t line_at_cursor_ = 1;
  std::vector<Diagnostic> duplicates_;
  std::size_t duplicates_left_out_ = 0;
};

enum class TopLevel : std::uint8_t { value, object_without_braces };

Reading read_top_level(std::string_view s, std::size_t start, TopLevel shape) {
  Reading r;
  HjsonParser p(s, start);
  try {
    p.skip_space();
    if (shape == TopLevel::object_without_braces) {
      p.note_root_without_braces();
      r.value = p.parse_members(kNone);
    } else {
      r.value = p.parse_value();
      p.skip_space();
      if (!p.at_end()) HjsonParser::fail(p.pos(), "more text after the end of the top-level value");
    }
  } catch (SyntaxFailure& f) {
    r.failure = std::move(f);
  }
  r.findings = std::move(p.findings());
  r.findings_left_out = p.findings_left_out();
  r.first_left_out = p.first_left_out();
  r.duplicates = std::move(p.duplicates());
  r.duplicates_left_out = p.duplicates_left_out();
  return r;
}

}  // namespace

std::optional<std::size_t> first_content(std::string_view s, std::size_t start, bool& only_comments) {
  HjsonParser probe(s, start);
  try {
    probe.skip_space();
  } catch (const SyntaxFailure&) {
    only_comments = false;
    return probe.pos();  // an unclosed comment: the real reading reports it
  }
  only_comments = !probe.findings().empty();
  if (probe.at_end()) return std::nullopt;
  return probe.pos();
}

// The whole text as hjson's decode reads it: '{' or '[' first is one value; anything else is an object
// without braces or, failing that, a single value (and failing both, the object's error counts).
Reading read_text(std::string_view s, std::size_t start, std::size_t first) {
  if (s[first] == '{' || s[first] == '[') return read_top_level(s, start, TopLevel::value);
  Reading object = read_top_level(s, start, TopLevel::object_without_braces);
  if (!object.failure) return object;
  Reading single = read_top_level(s, start, TopLevel::value);
  if (!single.failure) return single;
  object.failure->message += " (the file does not start with '{', so it was read as an object without braces)";
  return object;
}

}  // namespace zero3::config::detail
