#include "zero3/core/json_text.hpp"

#include <fmt/format.h>

#include <cstddef>

namespace zero3 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool continuation(unsigned char c) {
  return (c & 0xC0U) == 0x80U;
}

// The length of the well-formed sequence starting at text[at] (1-4), or 0 when it is ill-formed; then
// `bad` is the length of its maximal subpart (at least 1): the bytes one U+FFFD replaces.
std::size_t sequence_length(std::string_view text, std::size_t at, std::size_t& bad) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[at + i]); };
  const unsigned char lead = byte(0);
  bad = 1;
  if (lead < 0x80U) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80U;  // the second byte's range, narrower after E0, ED, F0 and F4
  unsigned char high = 0xBFU;
  if (lead >= 0xC2U && lead <= 0xDFU) {
    length = 2;
  } else if (lead >= 0xE0U && lead <= 0xEFU) {
    length = 3;
    if (lead == 0xE0U) low = 0xA0U;
    if (lead == 0xEDU) high = 0x9FU;
  } else if (lead >= 0xF0U && lead <= 0xF4U) {
    length = 4;
    if (lead == 0xF0U) low = 0x90U;
    if (lead == 0xF4U) high = 0x8FU;
  } else {
    return 0;
  }
  for (std::size_t i = 1; i < length; ++i) {
    if (at + i >= text.size()) return 0;
    const unsigned char c = byte(i);
    const bool ok = i == 1 ? (c >= low && c <= high) : continuation(c);
    if (!ok) return 0;
    bad = i + 1;
  }
  return length;
}

}  // namespace

bool valid_utf8(std::string_view text) {
  std::size_t bad = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = sequence_length(text, at, bad);
    if (n == 0) return false;
    at += n;
  }
  return true;
}

std::string utf8_or_replacement(std::string_view text) {
  if (valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  std::size_t bad = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = sequence_length(text, at, bad);
    if (n == 0) {
      out += kReplacement;
      at += bad;
    } else {
      out.append(text.substr(at, n));
      at += n;
    }
  }
  return out;
}

std::string json_quoted(std::string_view text) {
  const std::string valid = utf8_or_replacement(text);
  std::string out;
  out.reserve(valid.size() + 2);
  out += '"';
  for (const char c : valid) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20U || c == 0x7F) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace zero3
