// libFuzzer target over the DeepSpeed config reader (zero3::config::parse_config_text, parse.hpp). Any
// input must give a result, never a crash, hang or exception; a config that parses must round-trip:
// to_json(config) parses again (same options) to a config whose to_json text is the same.
// A broken round trip traps, so the fuzzer reports it with the input that caused it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zero3/config/parse.hpp"

namespace {

namespace config = zero3::config;

void check_round_trip(const config::Config& parsed, const config::ParseOptions& options) {
  const std::string text = config::to_json(parsed);
  const config::ParseResult again = config::parse_config_text(text, options);
  if (!again.ok() || config::to_json(*again.config) != text) __builtin_trap();
}

void parse_with(std::string_view input, const config::ParseOptions& options) {
  const config::ParseResult r = config::parse_config_text(input, options);
  // The messages are what users see: format them too, so their code runs on every input.
  for (const auto* list : {&r.errors, &r.warnings, &r.not_implemented}) {
    for (const config::Diagnostic& d : *list) (void)config::format_diagnostic("error", d);
  }
  for (const config::Resolution& res : r.resolved) (void)config::format_resolution(res);
  if (r.ok()) check_round_trip(*r.config, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  config::ParseOptions single;
  single.world_size = 1;
  parse_with(input, single);
  config::ParseOptions eight;
  eight.world_size = 8;
  eight.world_size_source = "--world-size";
  eight.source_name = "fuzz.json";
  parse_with(input, eight);
  return 0;
}
