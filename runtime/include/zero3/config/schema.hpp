// The table of every config key zero3 knows: DeepSpeed's keys (by block) and zero3's own "zero3" block,
// each with its type, default, what zero3 does with it and how "auto" is treated. The parser rejects keys
// missing from this table; `zero3 config keys` and configs/README.md present it. Immutable static data.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace zero3::config {

// What zero3 does with a key DeepSpeed knows.
enum class Support : std::uint8_t {
  implemented,      // honoured by zero3
  not_implemented,  // accepted; a value that turns the feature on is reported "not implemented"
  no_effect,        // accepted and type-checked; changes nothing in zero3 (stage 1/2-only or PyTorch-only knobs)
  deprecated,       // accepted with a warning and mapped to its replacement
  unchecked,        // a DeepSpeed block zero3 does not look inside; reported when it turns its feature on
  rejected,         // known, but always an error (DeepSpeed rejects it too)
};

// How the string "auto" is treated for a key.
enum class AutoRule : std::uint8_t {
  rejected,    // "auto" is an error (DeepSpeed would pass the string on and fail later)
  ds_default,  // the DeepSpeed default is used, as DeepSpeed's pydantic blocks do; recorded as a resolution
  resolved,    // zero3 computes a value (batch rule, optimizer defaults, zero3.model.hidden_size, ...)
};

struct KeySpec {
  std::string_view block;  // "" for top level, "zero_optimization.offload_param", "optimizer.params (Lion)"
  std::string_view key;
  std::string_view type;
  std::string_view default_value;
  Support support;
  AutoRule auto_rule;
  std::string_view note;  // what zero3 does with it; aliases and replacements are named here
};

// How DeepSpeed's loader validates a block: what an unknown key and a wrong-typed value give there. zero3
// follows it: an unknown key is an error where DeepSpeed rejects it, and a warning (an error in strict mode)
// where DeepSpeed ignores it.
enum class Validation : std::uint8_t {
  strict_model,  // a pydantic model with extra="forbid": unknown keys rejected, values converted or rejected
  plain_dict,    // read key by key from a dict: unknown keys ignored, values handed on unchecked
  keyword_args,  // handed to a constructor as keyword arguments: an unknown key is a TypeError
  zero3_own,     // zero3's "zero3" block: strict, DeepSpeed never reads it
};

struct BlockRule {
  std::string_view block;  // as in KeySpec::block
  Validation validation;
  std::string_view reader;  // DeepSpeed's class or function that reads it, and its file
  std::string_view since;   // the DeepSpeed release since which this rule holds
};

std::span<const BlockRule> block_rules();
// The rule of a schema block (a nested zero3 block is zero3_own); nullptr for a block the table lacks.
const BlockRule* find_block_rule(std::string_view block);
std::string_view to_string(Validation v);

std::span<const KeySpec> known_keys();
const KeySpec* find_key(std::string_view block, std::string_view key);
std::string_view to_string(Support s);
std::string_view to_string(AutoRule r);

}  // namespace zero3::config
