#include "zero3/config/key_table.hpp"

#include <fmt/format.h>

#include "zero3/config/schema.hpp"

namespace zero3::config {

namespace {

// A markdown table cell: '|' would end the cell.
std::string cell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string block_rule_line(std::string_view block) {
  const BlockRule* rule = find_block_rule(block);
  if (rule == nullptr) return {};
  if (rule->validation == Validation::zero3_own) return std::string(to_string(rule->validation));
  return fmt::format("DeepSpeed: {}, {} ({})", rule->reader, to_string(rule->validation),
                     rule->since == "always" ? std::string("in every release") : fmt::format("since {}", rule->since));
}

std::string key_table_markdown(std::string_view block) {
  std::string out;
  std::string_view last_block = "\x01";
  for (const KeySpec& k : known_keys()) {
    if (!block.empty() && k.block != block) continue;
    if (k.block != last_block) {
      out += fmt::format(
          "{}### {}\n\n{}\n\n| key | type | default | zero3 | \"auto\" | notes |\n|---|---|---|---|---|---|\n",
          out.empty() ? "" : "\n", k.block.empty() ? "top level" : k.block, block_rule_line(k.block));
      last_block = k.block;
    }
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", k.key, cell(type_text(k.type)), cell(k.default_value),
                       to_string(k.support), to_string(k.auto_rule), cell(k.note));
  }
  return out;
}

MarkedSection marked_key_table(std::string_view readme) {
  const auto begin = readme.find(kKeyTableBegin);
  if (begin == std::string_view::npos) return {};
  const auto start = readme.find('\n', begin);
  const auto end = readme.find(kKeyTableEnd, begin);
  if (start == std::string_view::npos || end == std::string_view::npos || end < start) return {};
  return {true, std::string(readme.substr(start + 1, end - start - 1))};
}

}  // namespace zero3::config
