// Text that goes into JSON. JSON text is UTF-8, but what zero3 quotes in its messages is not always: a file
// name, the bytes of a corrupt header, an errno text in another locale. A record written with such bytes is
// not JSON (readers of events.jsonl, the failure notice and the flight records would reject the line, or
// the JSON library would throw while the original error is being reported). So every string written into
// JSON passes through here: each byte sequence that is not valid UTF-8 becomes U+FFFD, one per maximal
// invalid subpart (as Unicode's "substitution of maximal subparts" recommends, and as nlohmann::json's
// error_handler_t::replace does), control characters are escaped, and the rest is kept byte for byte.
//
//   out += zero3::json_quoted(file.string());   // "\"/data/tokens\xef\xbf\xbd.bin\""
#pragma once

#include <string>
#include <string_view>

namespace zero3 {

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool valid_utf8(std::string_view text);

// `text` with every ill-formed sequence replaced by U+FFFD; valid text is returned unchanged.
std::string utf8_or_replacement(std::string_view text);

// `text` as a JSON string literal, quotes included: utf8_or_replacement, with '"', '\\' and the control
// characters escaped.
std::string json_quoted(std::string_view text);

}  // namespace zero3
