// The table of every config key zero3 knows: DeepSpeed's keys (by block) and zero3's own "zero3" block,
// each with its type, default, what zero3 does with it and how "auto" is treated. The parser rejects keys
// missing from this table; `zero3 config keys` and configs/README.md present it. Immutable static data.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
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

// A key's value type. Integers and numbers carry the range the parser enforces, and their type text ("int > 0",
// "number in [0, 1)") is rendered from it, so a range is written once; any other type is its text ("bool",
// "\"auto\" or int").
struct ValueType {
  enum class Kind : std::uint8_t { text, integer, number };
  Kind kind = Kind::text;
  std::string_view text;  // Kind::text: the whole type; else the word before the range ("int", "even int")
  bool has_min = false, has_max = false;
  bool min_open = false, max_open = false;  // the bound itself is excluded
  double min = 0, max = 0;
  bool nullable = false;  // null is accepted (and means "not set")
  // Integers: the range of the C++ type the value lands in, where that is narrower than the config struct's
  // int64 (a model's int sizes, a micro-batch); the parser refuses a value outside it, whatever the row's
  // range, instead of letting a later cast wrap it (2^32 + 1 layers would build 1).
  std::int64_t held_min = std::numeric_limits<std::int64_t>::min();
  std::int64_t held_max = std::numeric_limits<std::int64_t>::max();
  int held_bits = 64;  // of the signed type held_min .. held_max is the range of

  // Implicit, so that a row writes a plain type as its text: "bool".
  constexpr ValueType(const char* type_text) : text(type_text) {}  // NOLINT(google-explicit-constructor)
  constexpr ValueType(Kind k, std::string_view word) : kind(k), text(word) {}

  constexpr ValueType or_null() const {
    ValueType t = *this;
    t.nullable = true;
    return t;
  }
  constexpr ValueType named(std::string_view word) const {
    ValueType t = *this;
    t.text = word;
    return t;
  }
  // The value lands in a T (a signed integer narrower than int64).
  template <std::signed_integral T>
  constexpr ValueType held_in() const {
    ValueType t = *this;
    t.held_min = std::numeric_limits<T>::min();
    t.held_max = std::numeric_limits<T>::max();
    t.held_bits = std::numeric_limits<T>::digits + 1;
    return t;
  }
  bool has_range() const { return has_min || has_max; }
  bool narrowed() const { return held_bits < 64; }
};

constexpr ValueType int_min(std::int64_t lo) {
  ValueType t(ValueType::Kind::integer, "int");
  t.has_min = true;
  t.min = static_cast<double>(lo);
  return t;
}
constexpr ValueType int_in(std::int64_t lo, std::int64_t hi) {
  ValueType t = int_min(lo);
  t.has_max = true;
  t.max = static_cast<double>(hi);
  return t;
}
constexpr ValueType num_min(double lo) {
  ValueType t(ValueType::Kind::number, "number");
  t.has_min = true;
  t.min = lo;
  return t;
}
constexpr ValueType num_above(double lo) {
  ValueType t = num_min(lo);
  t.min_open = true;
  return t;
}
constexpr ValueType num_in(double lo, double hi) {
  ValueType t = num_min(lo);
  t.has_max = true;
  t.max = hi;
  return t;
}
constexpr ValueType num_half_open(double lo, double hi) {  // [lo, hi)
  ValueType t = num_in(lo, hi);
  t.max_open = true;
  return t;
}
constexpr ValueType num_open(double lo, double hi) {  // (lo, hi)
  ValueType t = num_half_open(lo, hi);
  t.min_open = true;
  return t;
}

// "> 0", ">= -1", "in [0, 126]", "in [0, 1)"; empty without a range. The parser's messages use the same words.
std::string range_text(const ValueType& t);
// The lowest and highest integer a key accepts: its row's range within the type the value lands in.
std::int64_t int_lowest(const ValueType& t);
std::int64_t int_highest(const ValueType& t);
// The type column: "int > 0 or null", "int > 0, at most 2147483647", "number in (0, 1)", "bool".
std::string type_text(const ValueType& t);

struct KeySpec {
  std::string_view block;  // "" for top level, "zero_optimization.offload_param", "optimizer.params (Lion)"
  std::string_view key;
  ValueType type;
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

// The blocks whose rows give the config structs (config.hpp) their defaults.
namespace blocks {
inline constexpr std::string_view top = "";
inline constexpr std::string_view adam = "optimizer.params (Adam/AdamW)";
inline constexpr std::string_view optimizer = "optimizer";
inline constexpr std::string_view warmup_lr = "scheduler.params (WarmupLR)";
inline constexpr std::string_view warmup_decay_lr = "scheduler.params (WarmupDecayLR)";
inline constexpr std::string_view warmup_cosine_lr = "scheduler.params (WarmupCosineLR)";
inline constexpr std::string_view one_cycle = "scheduler.params (OneCycle)";
inline constexpr std::string_view lr_range_test = "scheduler.params (LRRangeTest)";
inline constexpr std::string_view zero = "zero_optimization";
inline constexpr std::string_view offload_param = "zero_optimization.offload_param";
inline constexpr std::string_view offload_optimizer = "zero_optimization.offload_optimizer";
inline constexpr std::string_view fp16 = "fp16";
inline constexpr std::string_view bf16 = "bf16";
inline constexpr std::string_view aio = "aio";
inline constexpr std::string_view checkpoint = "checkpoint";
inline constexpr std::string_view csv_monitor = "csv_monitor";  // tensorboard's rows are the same
inline constexpr std::string_view wandb = "wandb";
inline constexpr std::string_view activation_checkpointing = "activation_checkpointing";
inline constexpr std::string_view flops_profiler = "flops_profiler";
inline constexpr std::string_view zero3 = "zero3";
inline constexpr std::string_view zero3_model = "zero3.model";
inline constexpr std::string_view zero3_data = "zero3.data";
inline constexpr std::string_view zero3_run = "zero3.run";
inline constexpr std::string_view zero3_comm = "zero3.comm";
inline constexpr std::string_view zero3_nonfinite = "zero3.nonfinite";
inline constexpr std::string_view zero3_spike = "zero3.spike";
inline constexpr std::string_view zero3_accumulation = "zero3.accumulation";
}  // namespace blocks

// A row's default as a value of the field it initializes: the default is written once, in its row, and both the
// config structs' member initializers and the parser's getters take it from there. Throws std::logic_error when
// the row is missing or its default is not a JSON value of that type (a schema defect, met by every test).
bool row_bool(std::string_view block, std::string_view key);
std::int64_t row_int(std::string_view block, std::string_view key);
double row_number(std::string_view block, std::string_view key);
std::string row_string(std::string_view block, std::string_view key);
// A default written as a list of two numbers ("[0.9, 0.999]").
std::array<double, 2> row_number_pair(std::string_view block, std::string_view key);
// Throws std::logic_error naming the row and what is wrong with its default.
[[noreturn]] void throw_row_defect(std::string_view block, std::string_view key, std::string_view what);
// An enum field's default: the value whose to_string spelling the row's default string is; `Last` is the
// enum's last value.
template <class Enum, Enum Last>
Enum row_enum(std::string_view block, std::string_view key) {
  const std::string text = row_string(block, key);
  for (int v = 0; v <= static_cast<int>(Last); ++v) {
    if (to_string(static_cast<Enum>(v)) == text) return static_cast<Enum>(v);
  }
  throw_row_defect(block, key, "names no value of the field's enum");
}
std::string_view to_string(Support s);
std::string_view to_string(AutoRule r);

}  // namespace zero3::config
